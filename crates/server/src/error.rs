//! The one place where errors become HTTP responses: status, `{"error": {"code", "message"}}`
//! and a log line. Codes are stable snake_case words.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use gpurent_store::StoreError;
use gpurent_types::api::{ErrorBody, ErrorDetail};

use crate::idempotency::IdempotencyError;

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{0}")]
    Unauthorized(String),
    #[error("{0}")]
    Forbidden(String),
    #[error("{0}")]
    Malformed(String),
    #[error("{0}")]
    Invalid(String),
    #[error("request body is larger than {limit} bytes")]
    TooLarge { limit: usize },
    #[error("{0}")]
    UnsupportedMediaType(String),
    #[error("the request body did not arrive in time ({} s after the header, plus a second per KiB received)", .0.as_secs())]
    RequestTimeout(std::time::Duration),
    #[error("no route for {0}")]
    NoRoute(String),
    #[error("{0} is not allowed on this route")]
    MethodNotAllowed(String),
    #[error("too many requests; retry in {} s", retry_after_secs(*.retry_after))]
    RateLimited { retry_after: std::time::Duration },
    /// Too many failed logins of one account, whatever the address: nothing is checked
    /// before `until`.
    #[error("too many failed logins for this account: try again at {} (in {} s)",
        .until.to_rfc3339_opts(chrono::SecondsFormat::Secs, true), retry_after_secs(*.retry_after))]
    LoginThrottled {
        until: chrono::DateTime<chrono::Utc>,
        retry_after: std::time::Duration,
    },
    /// A sensitive account change without the password it needs.
    #[error("{0}")]
    PasswordRequired(String),
    #[error("the password given is not your current password")]
    WrongPassword,
    #[error("{0}")]
    Internal(String),
    /// An agent whose protocol this control plane does not serve (too old or too new).
    #[error("{0}")]
    AgentProtocol(String),
    /// What the proxy answers when the app behind a published port cannot be reached (the
    /// message is for the client: nothing listens, the agent is not connected).
    #[error("{0}")]
    BadGateway(String),
    #[error("this control plane has no SSH endpoint (start it with --ssh-listen HOST:PORT)")]
    NoSshEndpoint,
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Idempotency(#[from] IdempotencyError),
    #[error(transparent)]
    Secrets(#[from] crate::secrets::SecretsError),
    /// An endpoint has no replica to answer within its queue's timeout, or cannot start one.
    #[error("{message}")]
    EndpointUnavailable {
        message: String,
        retry_after: std::time::Duration,
    },
    /// An endpoint holds as many waiting requests as it may.
    #[error("the endpoint's queue is full ({max} requests wait): try again shortly")]
    QueueFull {
        max: u32,
        retry_after: std::time::Duration,
    },
    /// An endpoint's owner is out of credit: it runs no replica.
    #[error("{0}")]
    EndpointUnpaid(String),
}

impl ApiError {
    fn status_and_code(&self) -> (StatusCode, &'static str) {
        match self {
            ApiError::Unauthorized(_) => (StatusCode::UNAUTHORIZED, "unauthorized"),
            ApiError::Forbidden(_) => (StatusCode::FORBIDDEN, "forbidden"),
            ApiError::Malformed(_) => (StatusCode::BAD_REQUEST, "malformed_request"),
            ApiError::Invalid(_) => (StatusCode::UNPROCESSABLE_ENTITY, "invalid_value"),
            ApiError::AgentProtocol(_) => (StatusCode::CONFLICT, "agent_protocol"),
            ApiError::TooLarge { .. } => (StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large"),
            ApiError::UnsupportedMediaType(_) => {
                (StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported_media_type")
            }
            ApiError::RequestTimeout(_) => (StatusCode::REQUEST_TIMEOUT, "request_timeout"),
            ApiError::NoRoute(_) => (StatusCode::NOT_FOUND, "not_found"),
            ApiError::MethodNotAllowed(_) => (StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed"),
            ApiError::RateLimited { .. } => (StatusCode::TOO_MANY_REQUESTS, "rate_limited"),
            ApiError::LoginThrottled { .. } => (StatusCode::TOO_MANY_REQUESTS, "login_throttled"),
            ApiError::PasswordRequired(_) => (StatusCode::FORBIDDEN, "password_required"),
            ApiError::WrongPassword => (StatusCode::FORBIDDEN, "wrong_password"),
            ApiError::BadGateway(_) => (StatusCode::BAD_GATEWAY, "bad_gateway"),
            ApiError::EndpointUnavailable { .. } => {
                (StatusCode::SERVICE_UNAVAILABLE, "endpoint_unavailable")
            }
            ApiError::QueueFull { .. } => (StatusCode::TOO_MANY_REQUESTS, "queue_full"),
            ApiError::EndpointUnpaid(_) => (StatusCode::PAYMENT_REQUIRED, "insufficient_credit"),
            ApiError::NoSshEndpoint => (StatusCode::NOT_FOUND, "no_ssh_endpoint"),
            ApiError::Idempotency(_) | ApiError::Internal(_) | ApiError::Secrets(_) => {
                (StatusCode::INTERNAL_SERVER_ERROR, "internal")
            }
            ApiError::Store(e) => match e {
                StoreError::NotFound { .. } => (StatusCode::NOT_FOUND, "not_found"),
                StoreError::Conflict(_) => (StatusCode::CONFLICT, "conflict"),
                StoreError::Duplicate(_) => (StatusCode::UNPROCESSABLE_ENTITY, "duplicate"),
                StoreError::NoCapacity(_) => (StatusCode::CONFLICT, "no_capacity"),
                StoreError::LimitExceeded(_) => (StatusCode::CONFLICT, "limit_exceeded"),
                StoreError::UnknownGpuType { .. } => {
                    (StatusCode::UNPROCESSABLE_ENTITY, "unknown_gpu_type")
                }
                StoreError::InsufficientCredit { .. } => {
                    (StatusCode::PAYMENT_REQUIRED, "insufficient_credit")
                }
                StoreError::BudgetExceeded(_) => (StatusCode::PAYMENT_REQUIRED, "budget_exceeded"),
                StoreError::Price(_) => (StatusCode::UNPROCESSABLE_ENTITY, "invalid_price"),
                StoreError::IdempotencyMismatch => {
                    (StatusCode::UNPROCESSABLE_ENTITY, "idempotency_key_reused")
                }
                StoreError::OwnerUntouched => (StatusCode::FORBIDDEN, "forbidden"),
                StoreError::InvalidJoinToken => (StatusCode::UNAUTHORIZED, "invalid_join_token"),
                // Every store connection stayed busy for the whole acquire timeout: overload.
                e if e.is_overloaded() => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
                // The database is lost or read-only (a failover): clients retry.
                e if e.is_unavailable() => (StatusCode::SERVICE_UNAVAILABLE, "unavailable"),
                StoreError::Unavailable(_)
                | StoreError::UnsupportedUrl(_)
                | StoreError::Migration { .. }
                | StoreError::Corrupt(_)
                | StoreError::Database(_) => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
            },
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, code) = self.status_and_code();
        let said = matches!(
            self,
            ApiError::BadGateway(_) | ApiError::EndpointUnavailable { .. }
        );
        let message = if status.is_server_error() && !said {
            // The cause goes to the log, not to the client.
            tracing::error!(error = ?self, "request failed");
            "internal error; see the server log".to_owned()
        } else {
            tracing::debug!(code, message = %self, "request refused");
            self.to_string()
        };
        let body = ErrorBody {
            error: ErrorDetail {
                code: code.to_owned(),
                message,
            },
        };
        let mut response = (status, Json(body)).into_response();
        if let ApiError::RateLimited { retry_after }
        | ApiError::LoginThrottled { retry_after, .. }
        | ApiError::EndpointUnavailable { retry_after, .. }
        | ApiError::QueueFull { retry_after, .. } = self
        {
            response.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from(retry_after_secs(retry_after)),
            );
        }
        response
    }
}

/// Whole seconds to wait, at least 1 (`Retry-After` has no fractions).
fn retry_after_secs(wait: std::time::Duration) -> u64 {
    wait.as_secs()
        .saturating_add(u64::from(wait.subsec_nanos() > 0))
        .max(1)
}
