//! The OpenAPI document is generated from the code; any API change shows up in this snapshot.

use gpurent_store::Backend;

use crate::app::TestApp;

#[test]
fn openapi_document_snapshot() {
    insta::assert_json_snapshot!(gpurent_server::openapi_document());
}

#[tokio::test]
async fn served_document_is_the_generated_one() {
    let app = TestApp::with(Backend::Sqlite).start().await;
    let (status, served) = app.anonymous().get("/api/v1/openapi.json").await;
    assert_eq!(status, reqwest::StatusCode::OK);
    let generated = serde_json::to_value(gpurent_server::openapi_document()).unwrap_or_default();
    assert_eq!(served, generated);
    assert!(served["paths"]["/api/v1/reservations"]["post"].is_object());
    app.shutdown().await;
}
