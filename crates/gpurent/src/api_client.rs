//! The CLI's client of the HTTP API: bearer token, JSON, and the API's error shape.

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

#[derive(Debug)]
pub struct ApiClient {
    http: reqwest::Client,
    base: String,
    token: Option<String>,
    /// Why no token was sent, said when the server asks for one (401).
    unauthorized_hint: Option<String>,
}

impl ApiClient {
    pub fn new(base: &str, token: Option<String>) -> Self {
        ApiClient {
            http: reqwest::Client::new(),
            base: base.trim_end_matches('/').to_owned(),
            token,
            unauthorized_hint: None,
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
            .build()
            .map_err(|e| bad(&e))?;
        Ok(ApiClient {
            http,
            base: base.trim_end_matches('/').to_owned(),
            token,
            unauthorized_hint: None,
        })
    }

    /// What a 401 answer says instead of the server's message: why no token was sent.
    pub fn unauthorized_hint(mut self, hint: Option<String>) -> Self {
        self.unauthorized_hint = hint;
        self
    }

    async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<&serde_json::Value>,
        idempotency_key: Option<&str>,
    ) -> Result<reqwest::Response, CliError> {
        let url = format!("{}{path}", self.base);
        let mut request = self.http.request(method, &url);
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        if let Some(body) = body {
            request = request.json(body);
        }
        if let Some(key) = idempotency_key {
            request = request.header("Idempotency-Key", key);
        }
        let response = request.send().await.map_err(|e| {
            CliError::new(
                "unreachable",
                format!(
                    "cannot reach the control plane at {}: {}",
                    self.base,
                    chain(&e)
                ),
            )
        })?;
        if response.status().is_success() {
            return Ok(response);
        }
        let status = response.status();
        if let (StatusCode::UNAUTHORIZED, Some(hint)) = (status, &self.unauthorized_hint) {
            return Err(CliError::new("unauthorized", hint.clone()));
        }
        Err(match response.json::<ErrorBody>().await {
            Ok(body) => CliError {
                code: body.error.code,
                message: body.error.message,
            },
            Err(_) if status == StatusCode::UNAUTHORIZED => CliError::new(
                "unauthorized",
                "no or bad token: pass --token or set GPURENT_TOKEN",
            ),
            Err(_) => CliError::new("http_error", format!("the control plane answered {status}")),
        })
    }

    pub async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, CliError> {
        decode(self.send(Method::GET, path, None, None).await?).await
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
        let response = self.send(Method::GET, path, None, None).await?;
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
        let body =
            serde_json::to_value(body).map_err(|e| CliError::new("bad_request", e.to_string()))?;
        decode(
            self.send(Method::POST, path, Some(&body), idempotency_key)
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
            let response = self.send(Method::GET, &url, None, None).await?;
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
        decode(self.send(Method::DELETE, path, None, None).await?).await
    }

    pub async fn patch<B: Serialize, T: DeserializeOwned>(
        &self,
        path: &str,
        body: &B,
    ) -> Result<T, CliError> {
        let body =
            serde_json::to_value(body).map_err(|e| CliError::new("bad_request", e.to_string()))?;
        decode(self.send(Method::PATCH, path, Some(&body), None).await?).await
    }

    /// A POST whose success has no body (204).
    pub async fn post_no_content<B: Serialize>(
        &self,
        path: &str,
        body: &B,
    ) -> Result<(), CliError> {
        let body =
            serde_json::to_value(body).map_err(|e| CliError::new("bad_request", e.to_string()))?;
        self.send(Method::POST, path, Some(&body), None).await?;
        Ok(())
    }
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
