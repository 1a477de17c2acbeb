//! A JSON body extractor whose rejections use the API's error shape: 400 for malformed JSON,
//! 422 for a well-formed body with a wrong or unknown field, 413 and 415 as HTTP says.

use axum::extract::rejection::JsonRejection;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::HeaderMap;
use serde::de::DeserializeOwned;

use crate::error::ApiError;
use crate::state::AppState;

#[derive(Debug, Clone, Copy, Default)]
pub struct ApiJson<T>(pub T);

impl<T: DeserializeOwned> FromRequest<AppState> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, ApiError> {
        let bytes = body_bytes(req, state).await?;
        // A NUL in any string of a request is refused before anything reads it: C code
        // below (the executors, a shell, SQLite's text functions) would cut the string short.
        if let Some(field) = nul_field(&bytes) {
            return Err(ApiError::Invalid(format!("{field}: contains a NUL byte")));
        }
        parse(&bytes).map(ApiJson)
    }
}

/// The agent protocol's bodies: as `ApiJson`, but NUL is allowed, since an agent ships
/// what tenants' programs printed, and that may be any byte.
#[derive(Debug, Clone, Copy, Default)]
pub struct AgentJson<T>(pub T);

impl<T: DeserializeOwned> FromRequest<AppState> for AgentJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, ApiError> {
        let bytes = body_bytes(req, state).await?;
        parse(&bytes).map(AgentJson)
    }
}

async fn body_bytes(req: Request, state: &AppState) -> Result<axum::body::Bytes, ApiError> {
    if !is_json(req.headers()) {
        return Err(ApiError::UnsupportedMediaType(
            "send the body as JSON with Content-Type: application/json".into(),
        ));
    }
    axum::body::Bytes::from_request(req, state)
        .await
        .map_err(|_| ApiError::TooLarge {
            limit: state.config.max_body_bytes,
        })
}

/// `application/json`, or `application/SOMETHING+json`, as axum's own `Json` accepts.
fn is_json(headers: &HeaderMap) -> bool {
    let Some(value) = headers
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
    else {
        return false;
    };
    let essence = value
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    essence == "application/json"
        || essence
            .strip_prefix("application/")
            .is_some_and(|sub| sub.ends_with("+json"))
}

fn parse<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    // Every body is an object: serde would also take a struct from an array of its fields
    // (`[null, null]`), which the schema does not allow.
    match axum::Json::<ObjectOnly<T>>::from_bytes(bytes) {
        Ok(axum::Json(ObjectOnly(v))) => Ok(v),
        Err(JsonRejection::JsonDataError(e)) => Err(ApiError::Invalid(e.body_text())),
        Err(JsonRejection::JsonSyntaxError(e)) => Err(ApiError::Malformed(e.body_text())),
        Err(e) => Err(ApiError::Malformed(e.body_text())),
    }
}

/// Where a JSON text holds a NUL character (`\u0000`, the only way JSON can), as a path
/// (`env.A`, `command[2]`, `a key of env`); None when it holds none. The scan of the raw
/// text is cheap; only a body that has one is parsed a second time, to name the field.
pub(crate) fn nul_field(json: &[u8]) -> Option<String> {
    const ESCAPE: &[u8] = b"\\u0000";
    let maybe = json.windows(ESCAPE.len()).enumerate().any(|(i, w)| {
        // Escaped only where an odd number of backslashes leads up to the `u`.
        w == ESCAPE && json[..i].iter().rev().take_while(|&&b| b == b'\\').count() % 2 == 0
    });
    if !maybe {
        return None;
    }
    let value: serde_json::Value = serde_json::from_slice(json).ok()?;
    let mut path = String::new();
    find_nul(&value, &mut path).then_some(if path.is_empty() {
        "the body".to_owned()
    } else {
        path
    })
}

fn find_nul(value: &serde_json::Value, path: &mut String) -> bool {
    match value {
        serde_json::Value::String(s) => s.contains('\0'),
        serde_json::Value::Array(items) => items.iter().enumerate().any(|(i, v)| {
            let len = path.len();
            path.push_str(&format!("[{i}]"));
            let found = find_nul(v, path);
            if !found {
                path.truncate(len);
            }
            found
        }),
        serde_json::Value::Object(map) => map.iter().any(|(k, v)| {
            if k.contains('\0') {
                *path = if path.is_empty() {
                    "a field name".to_owned()
                } else {
                    format!("a key of {path}")
                };
                return true;
            }
            let len = path.len();
            if !path.is_empty() {
                path.push('.');
            }
            path.push_str(k);
            let found = find_nul(v, path);
            if !found {
                path.truncate(len);
            }
            found
        }),
        _ => false,
    }
}

/// `T` from a JSON object only.
struct ObjectOnly<T>(T);

impl<'de, T: serde::Deserialize<'de>> serde::Deserialize<'de> for ObjectOnly<T> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Object<T>(std::marker::PhantomData<T>);
        impl<'de, T: serde::Deserialize<'de>> serde::de::Visitor<'de> for Object<T> {
            type Value = T;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
                T::deserialize(serde::de::value::MapAccessDeserializer::new(map))
            }
        }
        d.deserialize_map(Object(std::marker::PhantomData))
            .map(ObjectOnly)
    }
}

/// A path parameter whose rejection (say, an id that is not valid UTF-8) is a 400 in the API's
/// error shape.
#[derive(Debug, Clone)]
pub struct ApiPath<T>(pub T);

impl<T> FromRequestParts<AppState> for ApiPath<T>
where
    T: DeserializeOwned + Send,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        axum::extract::Path::<T>::from_request_parts(parts, state)
            .await
            .map(|axum::extract::Path(v)| ApiPath(v))
            .map_err(|e| ApiError::Malformed(e.body_text()))
    }
}

/// Query parameters whose rejection is a 400 in the API's error shape.
#[derive(Debug, Clone)]
pub struct ApiQuery<T>(pub T);

impl<T> FromRequestParts<AppState> for ApiQuery<T>
where
    T: DeserializeOwned + Send,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        axum::extract::Query::<T>::from_request_parts(parts, state)
            .await
            .map(|axum::extract::Query(v)| ApiQuery(v))
            .map_err(|e| ApiError::Malformed(e.body_text()))
    }
}

/// The `Idempotency-Key` header, when given: printable ASCII, at most 255 characters.
pub fn idempotency_key(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let Some(value) = headers.get("idempotency-key") else {
        return Ok(None);
    };
    let key = value
        .to_str()
        .ok()
        .filter(|k| !k.is_empty() && k.len() <= 255 && k.bytes().all(|b| b.is_ascii_graphic()))
        .ok_or_else(|| {
            ApiError::Invalid("Idempotency-Key must be 1-255 printable ASCII characters".into())
        })?;
    Ok(Some(key.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::nul_field;

    #[test]
    fn names_where_a_nul_is() {
        let at = |json: &str| nul_field(json.as_bytes());
        assert_eq!(at(r#"{"a": "x"}"#), None);
        assert_eq!(
            at(r#"{"a": "x\\u0000"}"#),
            None,
            "an escaped backslash, then text"
        );
        assert_eq!(at(r#"{"a": "x\u0000"}"#).as_deref(), Some("a"));
        assert_eq!(at(r#"{"a": "\\\u0000"}"#).as_deref(), Some("a"));
        assert_eq!(
            at(r#"{"command": ["sh", "a\u0000"]}"#).as_deref(),
            Some("command[1]")
        );
        assert_eq!(
            at(r#"{"env": {"K": "v", "L": "\u0000"}}"#).as_deref(),
            Some("env.L")
        );
        assert_eq!(
            at(r#"{"env": {"K\u0000": "v"}}"#).as_deref(),
            Some("a key of env")
        );
    }
}
