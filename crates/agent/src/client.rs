//! The agent's HTTP client for the control plane: keep-alive connections, and retries with a
//! fixed delay on network errors and 5xx (the seeds: 3 tries, 5 s apart), each on the next of
//! the control plane's URLs when it has several (`--server URL1,URL2`: replicas without a
//! load balancer in front).

use std::time::Duration;

use gpurent_types::agent::{NodeRegistered, RegisterNode, SyncRequest, SyncResponse};
use gpurent_types::api::ErrorBody;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::tls::ClientTls;
use crate::AgentError;

#[derive(Debug, Clone, Copy)]
pub struct RetryPolicy {
    pub tries: u32,
    pub delay: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            tries: 3,
            delay: Duration::from_secs(5),
        }
    }
}

#[derive(Debug, Clone)]
pub struct ControlPlane {
    http: reqwest::Client,
    /// The control plane's URLs, in the order given; `current` indexes the one in use, shared
    /// by clones (the tunnel follows the heartbeats).
    bases: std::sync::Arc<[String]>,
    current: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    retry: RetryPolicy,
}

/// The agent protocol and release, on every call: the control plane serves this agent or
/// says why not.
fn protocol_headers() -> reqwest::header::HeaderMap {
    use gpurent_types::agent::{AGENT_PROTOCOL, AGENT_PROTOCOL_HEADER, AGENT_VERSION_HEADER};
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert(AGENT_PROTOCOL_HEADER, AGENT_PROTOCOL.into());
    headers.insert(
        AGENT_VERSION_HEADER,
        reqwest::header::HeaderValue::from_static(env!("CARGO_PKG_VERSION")),
    );
    headers
}

/// `URL1,URL2,...` as a list, each without its trailing `/`.
fn bases(base: &str) -> std::sync::Arc<[String]> {
    base.split(',')
        .map(|b| b.trim().trim_end_matches('/').to_owned())
        .filter(|b| !b.is_empty())
        .collect()
}

impl ControlPlane {
    pub fn new(base: &str, retry: RetryPolicy) -> Self {
        let http = reqwest::Client::builder()
            .default_headers(protocol_headers())
            .connect_timeout(Duration::from_secs(5))
            .pool_idle_timeout(Duration::from_secs(90))
            .build()
            .unwrap_or_default();
        ControlPlane {
            http,
            bases: bases(base),
            current: Default::default(),
            retry,
        }
    }

    /// A client of an `https://` control plane: trusting it as `tls` says, and presenting the
    /// node's client certificate when `tls` has one. A plain `http://` URL needs none of it.
    pub fn with_tls(base: &str, retry: RetryPolicy, tls: &ClientTls) -> Result<Self, AgentError> {
        if !base.starts_with("https://") {
            return Ok(Self::new(base, retry));
        }
        let http = tls
            .reqwest_builder()?
            .default_headers(protocol_headers())
            .connect_timeout(Duration::from_secs(5))
            .pool_idle_timeout(Duration::from_secs(90))
            .build()
            .map_err(|e| AgentError::Tls(crate::tls::TlsError::Client(e.to_string())))?;
        Ok(ControlPlane {
            http,
            bases: bases(base),
            current: Default::default(),
            retry,
        })
    }

    /// The control plane's URL in use now.
    pub fn base(&self) -> String {
        let i = self.current.load(std::sync::atomic::Ordering::Relaxed);
        self.bases
            .get(i % self.bases.len().max(1))
            .cloned()
            .unwrap_or_default()
    }

    /// After a failed call: the next URL, if there are several.
    fn next_base(&self) {
        if self.bases.len() > 1 {
            self.current
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }

    pub async fn register(&self, body: &RegisterNode) -> Result<NodeRegistered, AgentError> {
        self.post(
            "registration",
            "/api/v1/agent/register",
            None,
            body,
            Duration::from_secs(30),
        )
        .await
    }

    pub async fn sync(&self, token: &str, body: &SyncRequest) -> Result<SyncResponse, AgentError> {
        let timeout = Duration::from_millis(body.wait_ms.unwrap_or(0)) + Duration::from_secs(30);
        self.post("sync", "/api/v1/agent/sync", Some(token), body, timeout)
            .await
    }

    /// Opens the tunnel (`GET /api/v1/agent/tunnel`, upgraded): the connection the control
    /// plane relays tenants' SSH channels through.
    pub async fn open_tunnel(&self, token: &str) -> Result<reqwest::Upgraded, AgentError> {
        let url = format!("{}{}", self.base(), gpurent_tunnel::PATH);
        let failed = |detail: String| AgentError::Tunnel(detail);
        let response = self
            .http
            .get(&url)
            .bearer_auth(token)
            .header(reqwest::header::CONNECTION, "upgrade")
            .header(reqwest::header::UPGRADE, gpurent_tunnel::UPGRADE)
            .timeout(Duration::from_secs(30))
            .send()
            .await
            .map_err(|e| {
                // The next try opens it on the next URL.
                self.next_base();
                failed(e.to_string())
            })?;
        if response.status() != reqwest::StatusCode::SWITCHING_PROTOCOLS {
            let status = response.status();
            let body = response.text().await.unwrap_or_default();
            return Err(failed(format!(
                "the control plane answered {status}: {body}"
            )));
        }
        response.upgrade().await.map_err(|e| failed(e.to_string()))
    }

    async fn post<B: Serialize, T: DeserializeOwned>(
        &self,
        what: &'static str,
        path: &str,
        token: Option<&str>,
        body: &B,
        timeout: Duration,
    ) -> Result<T, AgentError> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            let url = format!("{}{path}", self.base());
            let mut request = self.http.post(&url).json(body).timeout(timeout);
            if let Some(token) = token {
                request = request.bearer_auth(token);
            }
            let retryable = match request.send().await {
                Ok(response) if response.status().is_success() => {
                    return response
                        .json::<T>()
                        .await
                        .map_err(|source| AgentError::Unreachable {
                            url: url.clone(),
                            tries: attempt,
                            source,
                        });
                }
                Ok(response) if response.status().is_client_error() => {
                    let status = response.status().as_u16();
                    let message = response
                        .json::<ErrorBody>()
                        .await
                        .map(|b| format!("{} ({})", b.error.message, b.error.code))
                        .unwrap_or_else(|_| "no error body".to_owned());
                    return Err(AgentError::Refused {
                        what,
                        status,
                        message,
                    });
                }
                Ok(response) => {
                    let status = response.status();
                    match response.error_for_status() {
                        Err(e) => e,
                        Ok(_) => {
                            return Err(AgentError::Refused {
                                what,
                                status: status.as_u16(),
                                message: "unexpected status".to_owned(),
                            })
                        }
                    }
                }
                Err(e) => e,
            };
            if attempt >= self.retry.tries {
                return Err(AgentError::Unreachable {
                    url,
                    tries: attempt,
                    source: retryable,
                });
            }
            tracing::warn!(%url, attempt, error = %retryable, "control plane call failed; retrying");
            self.next_base();
            tokio::time::sleep(self.retry.delay).await;
        }
    }
}
