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
    crate::routes::api().split_for_parts().1
}
