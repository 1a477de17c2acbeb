//! The OpenAPI document: generated from the route annotations, served at
//! `/api/v1/openapi.json` and snapshot-tested.

use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

#[derive(OpenApi)]
#[openapi(
    info(
        title = "gpurent",
        description = "Rent GPUs by the second: the control plane's API. Money is a decimal string, times are RFC 3339 UTC.",
    ),
    modifiers(&BearerAuth),
    tags(
        (name = "users", description = "Accounts, tokens and prepaid credit"),
        (name = "reservations", description = "Offers and reservations of GPUs"),
        (name = "volumes", description = "Storage that outlives instances"),
        (name = "endpoints", description = "Apps behind one URL, with replicas that scale with traffic and to zero"),
        (name = "templates", description = "Named instance setups that reservations start from"),
        (name = "registries", description = "Your credentials for private image registries"),
        (name = "teams", description = "Teams: a shared balance, members with roles, and the reservations made for it"),
        (name = "nodes", description = "GPU hosts (admin)"),
        (name = "agent", description = "The node agent protocol"),
        (name = "reports", description = "Usage reports (admin)"),
        (name = "audit", description = "The audit trail of every API request (admin)"),
        (name = "health", description = "Liveness, readiness and metrics"),
    )
)]
pub(crate) struct ApiDoc;

struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        if let Some(components) = openapi.components.as_mut() {
            components.add_security_scheme(
                "bearer",
                SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
            );
        }
    }
}

/// The OpenAPI 3 document of the API.
pub fn openapi_document() -> utoipa::openapi::OpenApi {
    let mut doc = crate::routes::api().split_for_parts().1;
    common_responses(&mut doc);
    doc
}

/// The answers any operation may give before its handler runs, added to every operation
/// that lacks them: 400 (a query string or body that does not parse), 415 (a body that is
/// not `application/json`), 401 (no, a bad, an expired or a revoked token, where the
/// operation needs one) and 429 (rate limits). All with the usual error body.
pub(crate) fn common_responses(doc: &mut utoipa::openapi::OpenApi) {
    use utoipa::openapi::path::ParameterIn;
    use utoipa::openapi::{ContentBuilder, Ref, RefOr, ResponseBuilder};

    let error = |description: &str| {
        RefOr::T(
            ResponseBuilder::new()
                .description(description)
                .content(
                    "application/json",
                    ContentBuilder::new()
                        .schema(Some(Ref::from_schema_name("ErrorBody")))
                        .build(),
                )
                .build(),
        )
    };
    for (path, item) in doc.paths.paths.iter_mut() {
        let api = path.starts_with("/api/v1/");
        for op in [
            item.get.as_mut(),
            item.put.as_mut(),
            item.post.as_mut(),
            item.delete.as_mut(),
            item.patch.as_mut(),
        ]
        .into_iter()
        .flatten()
        {
            let has_query = op.parameters.as_ref().is_some_and(|ps| {
                ps.iter()
                    .any(|p| matches!(p.parameter_in, ParameterIn::Query))
            });
            let has_body = op.request_body.is_some();
            let secured = op.security.as_ref().is_some_and(|s| !s.is_empty());
            let mut add = |status: &str, description: &str| {
                op.responses
                    .responses
                    .entry(status.to_owned())
                    .or_insert_with(|| error(description));
            };
            if has_query || has_body {
                add(
                    "400",
                    "Malformed request: a query string or body that does not parse",
                );
            }
            if has_body {
                add("415", "The body is not `application/json`");
                add("422", "A well-formed body with a wrong or unknown field");
            }
            if secured {
                add("401", "No token, or a bad, expired or revoked one");
            }
            if api {
                add("429", "Too many requests (see `Retry-After`)");
            }
        }
    }
}
