//! The HTTP clients of a `TestApp`'s users: requests with their bearer token, answers decoded.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::Value;

#[derive(Debug, Clone)]
pub struct Tenant {
    pub id: String,
    pub client: Client,
}

#[derive(Debug, Clone)]
pub struct Client {
    pub(super) http: reqwest::Client,
    pub(super) base: String,
    pub(super) token: Option<String>,
}

impl Client {
    /// The same user at another replica (`base`: its `http://host:port`).
    pub fn at(&self, base: &str) -> Client {
        Client {
            base: base.to_owned(),
            ..self.clone()
        }
    }

    fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let r = self.http.request(method, format!("{}{path}", self.base));
        match &self.token {
            Some(t) => r.bearer_auth(t),
            None => r,
        }
    }

    async fn decode(response: reqwest::Response) -> (StatusCode, Value) {
        let status = response.status();
        let text = response.text().await.expect("body");
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    /// The whole response of a GET, headers included.
    pub async fn get_response(&self, path: &str) -> reqwest::Response {
        self.request(reqwest::Method::GET, path)
            .send()
            .await
            .expect("send")
    }

    pub async fn get(&self, path: &str) -> (StatusCode, Value) {
        Self::decode(
            self.request(reqwest::Method::GET, path)
                .send()
                .await
                .expect("send"),
        )
        .await
    }

    pub async fn post(&self, path: &str, body: &Value) -> (StatusCode, Value) {
        Self::decode(
            self.request(reqwest::Method::POST, path)
                .json(body)
                .send()
                .await
                .expect("send"),
        )
        .await
    }

    pub async fn patch(&self, path: &str, body: &Value) -> (StatusCode, Value) {
        Self::decode(
            self.request(reqwest::Method::PATCH, path)
                .json(body)
                .send()
                .await
                .expect("send"),
        )
        .await
    }

    pub async fn post_with_key(&self, path: &str, body: &Value, key: &str) -> (StatusCode, Value) {
        let r = self
            .request(reqwest::Method::POST, path)
            .header("Idempotency-Key", key)
            .json(body);
        Self::decode(r.send().await.expect("send")).await
    }

    /// A POST without a body, with an `Idempotency-Key`.
    pub async fn post_empty_with_key(&self, path: &str, key: &str) -> (StatusCode, Value) {
        let r = self
            .request(reqwest::Method::POST, path)
            .header("Idempotency-Key", key);
        Self::decode(r.send().await.expect("send")).await
    }

    /// A POST with more headers (an agent's protocol, say).
    pub async fn post_with_headers(
        &self,
        path: &str,
        body: &Value,
        headers: &[(&str, &str)],
    ) -> (StatusCode, Value) {
        let mut r = self.request(reqwest::Method::POST, path).json(body);
        for (name, value) in headers {
            r = r.header(*name, *value);
        }
        Self::decode(r.send().await.expect("send")).await
    }

    /// A raw body with a content type, for malformed requests.
    pub async fn post_raw(
        &self,
        path: &str,
        content_type: &str,
        body: Vec<u8>,
    ) -> (StatusCode, Value) {
        let r = self
            .request(reqwest::Method::POST, path)
            .header("content-type", content_type)
            .body(body);
        Self::decode(r.send().await.expect("send")).await
    }

    /// A text answer and one of its headers.
    pub async fn get_text(&self, path: &str, header: &str) -> (StatusCode, String, Option<String>) {
        let (status, bytes, value) = self.get_bytes(path, header).await;
        let text = String::from_utf8(bytes).expect("a UTF-8 body");
        (status, text, value)
    }

    /// A GET whose body is kept as its bytes (an instance's output need not be UTF-8), with
    /// the status and one header.
    pub async fn get_bytes(
        &self,
        path: &str,
        header: &str,
    ) -> (StatusCode, Vec<u8>, Option<String>) {
        let response = self
            .request(reqwest::Method::GET, path)
            .send()
            .await
            .expect("send");
        let status = response.status();
        let value = response
            .headers()
            .get(header)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        (
            status,
            response.bytes().await.expect("body").to_vec(),
            value,
        )
    }

    /// Any request: its status, headers and JSON (or text) body.
    pub async fn send(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
    ) -> (StatusCode, reqwest::header::HeaderMap, Value) {
        let method = reqwest::Method::from_bytes(method.as_bytes()).expect("method");
        let mut r = self.request(method, path);
        if let Some(body) = body {
            r = r.json(body);
        }
        let response = r.send().await.expect("send");
        let headers = response.headers().clone();
        let (status, body) = Self::decode(response).await;
        (status, headers, body)
    }

    /// The reservation once it has this status, polled for at most `within`.
    pub async fn wait_status(&self, id: &str, status: &str, within: Duration) -> Value {
        let path = format!("/api/v1/reservations/{id}");
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let (_, r) = self.get(&path).await;
            if r["status"] == status {
                return r;
            }
            if tokio::time::Instant::now() >= deadline {
                panic!("reservation {id} never became {status}; last seen {r}");
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// A reservation's whole log as the API serves it, page after page, each page's
    /// `X-Log-Next-Offset` checked.
    pub async fn whole_log(&self, id: &str) -> Vec<u8> {
        let mut all = Vec::new();
        loop {
            let path = format!("/api/v1/reservations/{id}/logs?offset={}", all.len());
            let (status, page, next) = self.get_bytes(&path, "x-log-next-offset").await;
            assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&page));
            if page.is_empty() {
                return all;
            }
            all.extend_from_slice(&page);
            assert_eq!(next, Some(all.len().to_string()), "the next offset");
        }
    }

    pub async fn reserve(&self, body: Value) -> (StatusCode, Value) {
        self.post("/api/v1/reservations", &body).await
    }
}
