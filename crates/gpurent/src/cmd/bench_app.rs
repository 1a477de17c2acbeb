//! `gpurent bench app --port P` (hidden): the small HTTP app `bench endpoint` runs in its
//! replicas and, for comparison, directly on the host: `/health` and any path answer `ok`,
//! after `?ms=N` milliseconds when asked; HTTP/1.1 with keep-alive, one task per connection.

use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::rt::TokioIo;

/// Serves on 127.0.0.1:`port` until killed.
pub async fn run(port: u16) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    loop {
        let (stream, _) = listener.accept().await?;
        let _ = stream.set_nodelay(true);
        tokio::spawn(async move {
            let service = hyper::service::service_fn(
                |request: hyper::Request<hyper::body::Incoming>| async move {
                    let ms: u64 = request
                        .uri()
                        .query()
                        .and_then(|q| q.split('&').find_map(|p| p.strip_prefix("ms=")))
                        .and_then(|v| v.parse().ok())
                        .unwrap_or(0);
                    if ms > 0 {
                        tokio::time::sleep(Duration::from_millis(ms)).await;
                    }
                    Ok::<_, Infallible>(hyper::Response::new(Full::new(Bytes::from_static(b"ok"))))
                },
            );
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}
