//! Templates: the routes of `gpurent templates` (make, list, get, remove), who may publish
//! one, and what `reserve --template NAME` takes from it (docs/templates.md).

use axum::extract::State;
use axum::http::StatusCode;
use axum::Json;
use gpurent_store::{NewTemplate, StoreError};
use gpurent_types::api::{CreateReservation, CreateTemplate, ErrorBody, Template, TEMPLATES_MAX};

use crate::auth::Caller;
use crate::error::ApiError;
use crate::extract::{ApiJson, ApiPath};
use crate::state::AppState;

/// The longest description.
const DESCRIPTION_MAX: usize = 500;

/// Checks a new template's fields as a reservation's are checked (the same rules for the
/// image, command, environment and ports), and its volume mount as a mount path.
fn check(body: &CreateTemplate) -> Result<(), ApiError> {
    crate::validate::resource_name(&body.name)?;
    let as_reservation = CreateReservation {
        gpu_type: "template".into(),
        gpu_count: None,
        vram_gb: None,
        vram_fraction: None,
        hours: 1.0,
        tier: None,
        bid: None,
        image: body.image.clone(),
        command: body.command.clone(),
        env: body.env.clone(),
        ports: Vec::new(),
        http_ports: body.http_ports.clone(),
        queue: false,
        on_node_loss: None,
        idle_reclaim: None,
        checkpoint: false,
        secrets: Default::default(),
        volumes: Vec::new(),
        template: None,
        team: None,
        restart: None,
        max_restarts: None,
        checkpoint_volume: None,
        array: None,
    };
    crate::validate::reservation("template", &as_reservation, None, None)?;
    if let Some(path) = &body.volume_mount {
        crate::volumes::paths::check(path)
            .map_err(|e| ApiError::Invalid(format!("volume_mount: {e}")))?;
    }
    if let Some(text) = &body.description {
        if text.len() > DESCRIPTION_MAX {
            return Err(ApiError::Invalid(format!(
                "description: at most {DESCRIPTION_MAX} bytes"
            )));
        }
        crate::validate::printable("description", text)?;
    }
    Ok(())
}

/// Make a template: yours, or (an admin's, `public`) everyone's.
#[utoipa::path(post, path = "/api/v1/templates", tag = "templates", security(("bearer" = [])),
    request_body = CreateTemplate,
    responses((status = 201, body = Template), (status = 403, body = ErrorBody),
        (status = 422, body = ErrorBody)))]
pub(crate) async fn create(
    State(state): State<AppState>,
    caller: Caller,
    ApiJson(body): ApiJson<CreateTemplate>,
) -> Result<(StatusCode, Json<Template>), ApiError> {
    if body.public && !caller.is_admin() {
        return Err(ApiError::Forbidden(
            "only an admin publishes a template for everyone; leave out public to keep it yours"
                .into(),
        ));
    }
    check(&body)?;
    let own = state
        .store
        .list_templates(&caller.0.id)
        .await?
        .into_iter()
        .filter(|t| !t.public)
        .count();
    if !body.public && own >= TEMPLATES_MAX {
        return Err(StoreError::LimitExceeded(format!(
            "you have {own} templates, the most one user keeps; remove one first"
        ))
        .into());
    }
    let template = state
        .store
        .create_template(
            NewTemplate {
                owner_id: caller.0.id.clone(),
                name: body.name,
                image: body.image,
                command: body.command,
                env: body.env,
                http_ports: body.http_ports,
                volume_mount: body.volume_mount,
                description: body.description,
                public: body.public,
            },
            state.now(),
        )
        .await?;
    Ok((StatusCode::CREATED, Json(template)))
}

/// The templates you may use: yours and the public ones, by name.
#[utoipa::path(get, path = "/api/v1/templates", tag = "templates", security(("bearer" = [])),
    responses((status = 200, body = [Template])))]
pub(crate) async fn list(
    State(state): State<AppState>,
    caller: Caller,
) -> Result<Json<Vec<Template>>, ApiError> {
    Ok(Json(state.store.list_templates(&caller.0.id).await?))
}

/// One template, by name or id: yours, else the public one of that name.
#[utoipa::path(get, path = "/api/v1/templates/{name}", tag = "templates", security(("bearer" = [])),
    params(("name" = String, Path, description = "The template's name or id")),
    responses((status = 200, body = Template), (status = 404, body = ErrorBody)))]
pub(crate) async fn get(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(name): ApiPath<String>,
) -> Result<Json<Template>, ApiError> {
    Ok(Json(state.store.template(&caller.0.id, &name).await?))
}

/// Remove a template of yours; an admin removes public ones too. Reservations made from it
/// keep what they took.
#[utoipa::path(delete, path = "/api/v1/templates/{name}", tag = "templates", security(("bearer" = [])),
    params(("name" = String, Path, description = "The template's name or id")),
    responses((status = 200, body = Template), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody)))]
pub(crate) async fn remove(
    State(state): State<AppState>,
    caller: Caller,
    ApiPath(name): ApiPath<String>,
) -> Result<Json<Template>, ApiError> {
    let template = state.store.template(&caller.0.id, &name).await?;
    if template.public && !caller.is_admin() {
        return Err(ApiError::Forbidden(format!(
            "template {} is public: only an admin removes it",
            template.name
        )));
    }
    state.store.remove_template(&template.id).await?;
    Ok(Json(template))
}

/// A reservation's body with its template applied: the template's image, command and HTTP
/// ports where the body gives none, its environment under the body's, and its volume mount for
/// each volume given without a path. A body without a template is returned as it is.
pub(crate) async fn apply(
    state: &AppState,
    owner: &str,
    body: CreateReservation,
) -> Result<CreateReservation, ApiError> {
    let Some(name) = body.template.as_deref() else {
        return Ok(body);
    };
    let template = state
        .store
        .template(owner, name)
        .await
        .map_err(|e| match e {
            StoreError::NotFound { .. } => ApiError::Invalid(format!(
                "template: you have no template {name:?} and no public one has that name (gpurent templates ls)"
            )),
            other => other.into(),
        })?;
    Ok(merge(body, &template))
}

/// The merge itself.
fn merge(mut body: CreateReservation, t: &Template) -> CreateReservation {
    if body.image.is_none() {
        body.image = t.image.clone();
    }
    if body.command.is_empty() {
        body.command = t.command.clone();
    }
    let mut env = t.env.clone();
    env.append(&mut body.env);
    body.env = env;
    if body.http_ports.is_empty() {
        body.http_ports = t.http_ports.clone();
    }
    if let Some(mount) = &t.volume_mount {
        for m in body.volumes.iter_mut().filter(|m| m.path.is_empty()) {
            m.path = mount.clone();
        }
    }
    body
}

#[cfg(test)]
mod tests {
    use super::*;

    fn template() -> Template {
        serde_json::from_value(serde_json::json!({
            "id": "t1", "name": "jupyter", "image": "jupyter/base-notebook",
            "command": ["jupyter", "lab"], "env": {"A": "t", "B": "t"},
            "http_ports": [8888], "volume_mount": "/home/jovyan/work", "public": true,
            "created_at": "2026-12-06T00:00:00Z"
        }))
        .unwrap()
    }

    fn body(json: serde_json::Value) -> CreateReservation {
        let mut base =
            serde_json::json!({"gpu_type": "rtx4090", "hours": 1, "template": "jupyter"});
        base.as_object_mut()
            .unwrap()
            .extend(json.as_object().unwrap().clone());
        serde_json::from_value(base).unwrap()
    }

    #[test]
    fn the_template_fills_what_the_body_leaves_out() {
        let b = merge(
            body(serde_json::json!({"volumes": [{"volume": "data", "path": ""}]})),
            &template(),
        );
        assert_eq!(b.image.as_deref(), Some("jupyter/base-notebook"));
        assert_eq!(b.command, ["jupyter", "lab"]);
        assert_eq!(b.http_ports, [8888]);
        assert_eq!(b.env.len(), 2);
        assert_eq!(b.volumes[0].path, "/home/jovyan/work");
    }

    #[test]
    fn what_the_body_gives_wins() {
        let b = merge(
            body(serde_json::json!({
                "image": "mine", "command": ["python", "x.py"], "env": {"B": "mine", "C": "c"},
                "http_ports": [9000], "volumes": [{"volume": "data", "path": "/data"}]
            })),
            &template(),
        );
        assert_eq!(b.image.as_deref(), Some("mine"));
        assert_eq!(b.command, ["python", "x.py"]);
        assert_eq!(b.http_ports, [9000]);
        assert_eq!(
            b.env
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>(),
            ["A=t", "B=mine", "C=c"]
        );
        assert_eq!(b.volumes[0].path, "/data");
    }
}
