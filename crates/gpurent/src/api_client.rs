//! The CLI's client of the HTTP API: bearer token, JSON, the API's error shape, and retries of
//! what is safe to send twice (GETs, writes with an `Idempotency-Key`) through a failover.

use gpurent_agent::tls::ClientTls;
use gpurent_types::api::ErrorBody;
use reqwest::{Method, StatusCode};
use serde::de::DeserializeOwned;
use serde::Serialize;

/// A failed command: the API's error code and message (or a local one).
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct CliError {
    pub code: String,
    pub message: String,
}

impl CliError {
    pub fn new(code: &str, message: impl Into<String>) -> Self {
        CliError {
            code: code.to_owned(),
            message: message.into(),
        }
    }
}

/// How often and how far apart a safe request is sent again: `GPURENT_RETRIES` (default 3
/// retries after the first try) and `GPURENT_RETRY_DELAY` (seconds, default 5), the seed's
/// "3 tries, 5 s apart" that ride through a replica's loss or a database failover; and how
/// long one try waits for an answer (`GPURENT_TRY_TIMEOUT`, seconds, default 30) before it
/// counts as lost (a frozen replica behind the load balancer).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Retry {
    pub retries: u32,
    pub delay: std::time::Duration,
    /// The longest a try waits for the answer's head (the body of a large log may take longer).
    pub try_timeout: std::time::Duration,
}

impl Retry {
    pub const DEFAULT: Retry = Retry {
        retries: 3,
        delay: std::time::Duration::from_secs(5),
        try_timeout: std::time::Duration::from_secs(30),
    };

    /// The defaults, overridden by `GPURENT_RETRIES`, `GPURENT_RETRY_DELAY` and
    /// `GPURENT_TRY_TIMEOUT`.
    pub fn from_env() -> Result<Retry, CliError> {
        let mut retry = Retry::DEFAULT;
        if let Ok(v) = std::env::var("GPURENT_TRY_TIMEOUT") {
            retry.try_timeout = v
                .trim()
                .parse::<f64>()
                .ok()
                .filter(|s| *s > 0.0)
                .and_then(|s| std::time::Duration::try_from_secs_f64(s).ok())
                .ok_or_else(|| {
                    CliError::new(
                        "invalid_value",
                        format!(
                            "GPURENT_TRY_TIMEOUT={v:?}: seconds one try waits for an answer, \
                             more than 0, like 30"
                        ),
                    )
                })?;
        }
        if let Ok(v) = std::env::var("GPURENT_RETRIES") {
            retry.retries = v.trim().parse().map_err(|_| {
                CliError::new(
                    "invalid_value",
                    format!("GPURENT_RETRIES={v:?}: a whole number of retries (0 for none)"),
                )
            })?;
        }
        if let Ok(v) = std::env::var("GPURENT_RETRY_DELAY") {
            retry.delay = v
                .trim()
                .parse::<f64>()
                .ok()
                .and_then(|s| std::time::Duration::try_from_secs_f64(s).ok())
                .ok_or_else(|| {
                    CliError::new(
                        "invalid_value",
                        format!(
                            "GPURENT_RETRY_DELAY={v:?}: seconds between retries, like 5 or 0.5"
                        ),
                    )
                })?;
        }
        Ok(retry)
    }
}

/// The statuses a load balancer or a replica gives while it fails over.
fn is_failover_status(status: StatusCode) -> bool {
    matches!(
        status,
        StatusCode::BAD_GATEWAY | StatusCode::SERVICE_UNAVAILABLE | StatusCode::GATEWAY_TIMEOUT
    )
}

/// Told of every try's outcome instead of the retry lines on stderr: `None` when the try
/// was answered, the reason when it failed over (`gpurent bench chaos` counts them).
#[derive(Clone)]
pub struct TryObserver(pub std::sync::Arc<TryFn>);

/// See [`TryObserver`].
pub type TryFn = dyn Fn(Option<&str>) + Send + Sync;

impl std::fmt::Debug for TryObserver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TryObserver(..)")
    }
}

#[derive(Debug)]
pub struct ApiClient {
    http: reqwest::Client,
    base: String,
    token: Option<String>,
    /// Why no token was sent, said when the server asks for one (401).
    unauthorized_hint: Option<String>,
    retry: Retry,
    observer: Option<TryObserver>,
}

impl ApiClient {
    pub fn new(base: &str, token: Option<String>) -> Self {
        ApiClient {
            http: reqwest::Client::builder()
                .connect_timeout(CONNECT_TIMEOUT)
                .build()
                .unwrap_or_default(),
            base: base.trim_end_matches('/').to_owned(),
            token,
            unauthorized_hint: None,
            retry: Retry::DEFAULT,
            observer: None,
        }
    }

    /// A client of an `https://` control plane, trusting it as `tls` says (`--ca-cert`,
    /// `--tls-fingerprint`, else the system's CAs).
    pub fn with_tls(base: &str, token: Option<String>, tls: &ClientTls) -> Result<Self, CliError> {
        if !base.starts_with("https://") {
            return Ok(Self::new(base, token));
        }
        let bad = |e: &dyn std::error::Error| CliError::new("tls_config", chain(e));
        let http = tls
            .reqwest_builder()
            .map_err(|e| bad(&e))?
            .connect_timeout(CONNECT_TIMEOUT)
            .build()
            .map_err(|e| bad(&e))?;
        Ok(ApiClient {
            http,
            base: base.trim_end_matches('/').to_owned(),
            token,
            unauthorized_hint: None,
            retry: Retry::DEFAULT,
            observer: None,
        })
    }

    /// Retries safe requests as `retry` says (`Retry::from_env` for the CLI).
    pub fn retry(mut self, retry: Retry) -> Self {
        self.retry = retry;
        self
    }

    /// Tells `observer` of every try instead of printing the retry lines.
    pub fn observe(mut self, observer: TryObserver) -> Self {
        self.observer = Some(observer);
        self
    }

    /// What a 401 answer says instead of the server's message: why no token was sent.
    pub fn unauthorized_hint(mut self, hint: Option<String>) -> Self {
        self.unauthorized_hint = hint;
        self
    }

    /// Sends a request; a GET, a write with an `Idempotency-Key`, or one that is `Resend::Safe`
    /// by its nature, is sent again (with the same key) after a connection error or a
    /// 502/503/504, `retry.retries` times at most, saying so on stderr. Other writes are sent
    /// once: a lost answer may hide a done write.
    async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<&serde_json::Value>,
        idempotency_key: Option<&str>,
        resend: Resend,
    ) -> Result<reqwest::Response, CliError> {
        let safe = method == Method::GET || idempotency_key.is_some() || resend == Resend::Safe;
        let mut retried = 0;
        loop {
            let sent = self
                .send_once(method.clone(), path, body, idempotency_key)
                .await;
            if let Some(observer) = &self.observer {
                match &sent {
                    Err(Failure::Transient { why, .. }) => (observer.0)(Some(why)),
                    Err(Failure::InProgress(e)) => (observer.0)(Some(&e.message)),
                    Ok(_) | Err(Failure::Answered(_)) => (observer.0)(None),
                }
            }
            let why = match sent {
                Ok(response) => return Ok(response),
                Err(Failure::Answered(e)) => return Err(e),
                Err(Failure::Transient { error, .. }) if !safe || retried >= self.retry.retries => {
                    return Err(error)
                }
                // Our own earlier try, its answer lost, still runs: ask again.
                Err(Failure::InProgress(e)) if retried == 0 || retried >= self.retry.retries => {
                    return Err(e)
                }
                Err(Failure::Transient { why, .. }) => why,
                Err(Failure::InProgress(e)) => e.message,
            };
            retried += 1;
            if self.observer.is_none() {
                eprintln!(
                    "gpurent: {why}; retrying in {}s ({retried} of {})",
                    self.retry.delay.as_secs_f64(),
                    self.retry.retries
                );
            }
            tokio::time::sleep(self.retry.delay).await;
        }
    }

    async fn send_once(
        &self,
        method: Method,
        path: &str,
        body: Option<&serde_json::Value>,
        idempotency_key: Option<&str>,
    ) -> Result<reqwest::Response, Failure> {
        let url = format!("{}{path}", self.base);
        let mut request = self.http.request(method, &url);
        if let Some(body) = body {
            request = request.json(body);
        }
        if let Some(key) = idempotency_key {
            request = request.header("Idempotency-Key", key);
        }
        let response = self
            .sent(request)
            .await
            .map_err(|error| Failure::Transient {
                why: error.message.clone(),
                error,
            })?;
        if response.status().is_success() {
            return Ok(response);
        }
        let status = response.status();
        let error = self.error_of(response).await;
        Err(if is_failover_status(status) {
            Failure::Transient {
                why: format!("the control plane answered {status} ({})", error.message),
                error,
            }
        } else if status == StatusCode::CONFLICT && error.message.contains("still in progress") {
            Failure::InProgress(error)
        } else {
            Failure::Answered(error)
        })
    }

    /// What an answer that is not a success says: the API's error, or the hint for a 401.
    async fn error_of(&self, response: reqwest::Response) -> CliError {
        let status = response.status();
        if let (StatusCode::UNAUTHORIZED, Some(hint)) = (status, &self.unauthorized_hint) {
            return CliError::new("unauthorized", hint.clone());
        }
        match response.json::<ErrorBody>().await {
            Ok(body) => CliError {
                code: body.error.code,
                message: body.error.message,
            },
            Err(_) if status == StatusCode::UNAUTHORIZED => CliError::new(
                "unauthorized",
                "no or bad token: pass --token or set GPURENT_TOKEN",
            ),
            Err(_) => CliError::new("http_error", format!("the control plane answered {status}")),
        }
    }

    /// Sends `request` once, with the token: the answer, whatever its status, or why there
    /// was none (unreachable, or no answer within the try's timeout).
    async fn sent(
        &self,
        mut request: reqwest::RequestBuilder,
    ) -> Result<reqwest::Response, CliError> {
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        tokio::time::timeout(self.retry.try_timeout, request.send())
            .await
            .map_err(|_| {
                self.unreachable(format!(
                    "no answer within {}s (GPURENT_TRY_TIMEOUT)",
                    self.retry.try_timeout.as_secs_f64()
                ))
            })?
            .map_err(|e| self.unreachable(chain(&e)))
    }

    fn unreachable(&self, why: String) -> CliError {
        CliError::new(
            "unreachable",
            format!("cannot reach the control plane at {}: {why}", self.base),
        )
    }

    /// A GET upgraded to `protocol` (`Upgrade: PROTOCOL`): the connection that follows, once
    /// the control plane answers 101. Sent once (what follows is not safe to repeat).
    pub async fn upgrade(&self, path: &str, protocol: &str) -> Result<reqwest::Upgraded, CliError> {
        let request = self
            .http
            .get(format!("{}{path}", self.base))
            .header(reqwest::header::CONNECTION, "upgrade")
            .header(reqwest::header::UPGRADE, protocol);
        let response = self.sent(request).await?;
        if response.status() != StatusCode::SWITCHING_PROTOCOLS {
            return Err(self.error_of(response).await);
        }
        response
            .upgrade()
            .await
            .map_err(|e| self.unreachable(format!("the upgrade failed: {}", chain(&e))))
    }

    pub async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, CliError> {
        decode(
            self.send(Method::GET, path, None, None, Resend::Unsafe)
                .await?,
        )
        .await
    }

    /// A text answer and the value of one of its headers.
    pub async fn get_text(
        &self,
        path: &str,
        header: &str,
    ) -> Result<(String, Option<String>), CliError> {
        let (bytes, value) = self.get_bytes(path, header).await?;
        let text = String::from_utf8(bytes)
            .map_err(|e| CliError::new("bad_response", format!("the answer is not UTF-8: {e}")))?;
        Ok((text, value))
    }

    /// An answer's bytes as they are (an instance's output need not be UTF-8) and the value
    /// of one of its headers.
    pub async fn get_bytes(
        &self,
        path: &str,
        header: &str,
    ) -> Result<(Vec<u8>, Option<String>), CliError> {
        let response = self
            .send(Method::GET, path, None, None, Resend::Unsafe)
            .await?;
        let value = response
            .headers()
            .get(header)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let bytes = response
            .bytes()
            .await
            .map_err(|e| CliError::new("bad_response", e.to_string()))?;
        Ok((bytes.to_vec(), value))
    }

    pub async fn post<B: Serialize, T: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
        idempotency_key: Option<&str>,
    ) -> Result<T, CliError> {
        self.send_json(Method::POST, path, body, idempotency_key, Resend::Unsafe)
            .await
    }

    /// Sends `body` as JSON and decodes the JSON answer.
    async fn send_json<B: Serialize, T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: &B,
        idempotency_key: Option<&str>,
        resend: Resend,
    ) -> Result<T, CliError> {
        let body =
            serde_json::to_value(body).map_err(|e| CliError::new("bad_request", e.to_string()))?;
        decode(
            self.send(method, path, Some(&body), idempotency_key, resend)
                .await?,
        )
        .await
    }
}

impl ApiClient {
    /// Every page of a list endpoint, following its `X-Next-After` cursor.
    pub async fn get_all<T: DeserializeOwned>(&self, path: &str) -> Result<Vec<T>, CliError> {
        let sep = if path.contains('?') { '&' } else { '?' };
        let mut all = Vec::new();
        let mut after: Option<String> = None;
        loop {
            let url = match &after {
                Some(a) => format!("{path}{sep}limit=1000&after={a}"),
                None => format!("{path}{sep}limit=1000"),
            };
            let response = self
                .send(Method::GET, &url, None, None, Resend::Unsafe)
                .await?;
            let next = response
                .headers()
                .get("x-next-after")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            let page: Vec<T> = decode(response).await?;
            let empty = page.is_empty();
            all.extend(page);
            match next {
                Some(n) if !empty && after.as_deref() != Some(n.as_str()) => after = Some(n),
                _ => return Ok(all),
            }
        }
    }

    pub async fn delete<T: DeserializeOwned>(&self, path: &str) -> Result<T, CliError> {
        decode(
            self.send(Method::DELETE, path, None, None, Resend::Unsafe)
                .await?,
        )
        .await
    }

    /// A DELETE whose success has no body (204).
    pub async fn delete_no_content(&self, path: &str) -> Result<(), CliError> {
        self.send(Method::DELETE, path, None, None, Resend::Unsafe)
            .await?;
        Ok(())
    }

    pub async fn patch<B: Serialize, T: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
    ) -> Result<T, CliError> {
        self.send_json(Method::PATCH, path, body, None, Resend::Unsafe)
            .await
    }

    /// A PUT: sending it twice does what sending it once does.
    pub async fn put<B: Serialize, T: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
    ) -> Result<T, CliError> {
        self.send_json(Method::PUT, path, body, None, Resend::Safe)
            .await
    }

    /// A POST whose success has no body (204).
    pub async fn post_no_content<B: Serialize>(
        &self,
        path: &str,
        body: &B,
    ) -> Result<(), CliError> {
        let body =
            serde_json::to_value(body).map_err(|e| CliError::new("bad_request", e.to_string()))?;
        self.send(Method::POST, path, Some(&body), None, Resend::Unsafe)
            .await?;
        Ok(())
    }

    /// A POST that changes nothing when sent twice (a stop: stopping an ended reservation
    /// changes nothing), retried through a failover like a GET.
    pub async fn post_idempotent<B: Serialize, T: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
    ) -> Result<T, CliError> {
        self.send_json(Method::POST, path, body, None, Resend::Safe)
            .await
    }
}

/// Whether a write without an `Idempotency-Key` may be sent again after a failover's symptom.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Resend {
    /// Sending it twice does what sending it once does.
    Safe,
    /// A lost answer may hide a done write: sent once (GETs and keyed writes are retried
    /// anyway).
    Unsafe,
}

/// No answer within this: the replica is gone (a blackholed address), try again.
const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// How one try failed: an answer to give the user, or a failover's symptom worth a retry.
enum Failure {
    Answered(CliError),
    /// `why` is the retry line's reason; `error` what the user sees when no retry is left.
    Transient {
        error: CliError,
        why: String,
    },
    /// 409: a request with this `Idempotency-Key` still runs (a retry's earlier try).
    InProgress(CliError),
}

async fn decode<T: DeserializeOwned>(response: reqwest::Response) -> Result<T, CliError> {
    response.json::<T>().await.map_err(|e| {
        CliError::new(
            "bad_response",
            format!("unexpected answer from the control plane: {e}"),
        )
    })
}

/// An error and its causes on one line: a TLS failure is only named in the causes.
fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out
}
