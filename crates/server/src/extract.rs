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
        // Every body is an object: serde would also take a struct from an array of its fields
        // (`[null, null]`), which the schema does not allow.
        match axum::Json::<ObjectOnly<T>>::from_request(req, state).await {
            Ok(axum::Json(ObjectOnly(v))) => Ok(ApiJson(v)),
            Err(JsonRejection::JsonDataError(e)) => Err(ApiError::Invalid(e.body_text())),
            Err(JsonRejection::JsonSyntaxError(e)) => Err(ApiError::Malformed(e.body_text())),
            Err(JsonRejection::MissingJsonContentType(_)) => Err(ApiError::UnsupportedMediaType(
                "send the body as JSON with Content-Type: application/json".into(),
            )),
            Err(JsonRejection::BytesRejection(_)) => Err(ApiError::TooLarge {
                limit: state.config.max_body_bytes,
            }),
            Err(e) => Err(ApiError::Malformed(e.body_text())),
        }
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
