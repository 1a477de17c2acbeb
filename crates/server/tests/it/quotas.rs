//! GPU quotas through the API, on both stores, with a real agent: a team without a quota
//! borrows idle GPUs (marked borrowed), a team within its quota takes one back (the borrower
//! preempted with the spot notice), past its quota and borrow limit work is refused (or waits),
//! a quota lowered under running work stops nothing, and only admins set quotas; queued work
//! that comes within its quota takes borrowed GPUs back in the scheduling pass, one GPU for
//! one GPU of quota.

use gpurent_store::Backend;
use reqwest::StatusCode;
use serde_json::json;

use crate::app::TestApp;
use crate::both_stores;

async fn a_quota_is_guaranteed_and_borrowed_gpus_are_taken_back(backend: Backend) {
    let app = TestApp::with(backend)
        .with_sim_gpus("2xRTX4090")
        .start()
        .await;
    let olga = app.tenant("olga", "100").await;
    let arty = app.tenant("arty", "100").await;
    app.team(&olga.client, "lab", &[], "50").await;

    // Only admins set quotas; bad amounts say why.
    let quota = json!({"team": "lab", "gpu_type": "rtx4090", "gpus": "1", "borrow_limit": "0"});
    let (status, _, _) = olga
        .client
        .send("PUT", "/api/v1/quotas", Some(&quota))
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let bad = json!({"team": "lab", "gpu_type": "rtx4090", "gpus": "1.2345"});
    let (status, _, body) = app.admin().send("PUT", "/api/v1/quotas", Some(&bad)).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    let (status, _, set) = app
        .admin()
        .send("PUT", "/api/v1/quotas", Some(&quota))
        .await;
    assert_eq!(status, StatusCode::OK, "{set}");
    assert_eq!(
        (set["gpus"].as_str(), set["used"].as_str()),
        (Some("1"), Some("0"))
    );

    // arty has no quota of a type with quotas: what he takes is borrowed.
    let mut borrowed = Vec::new();
    for _ in 0..2 {
        let (status, r) = arty
            .client
            .reserve(json!({"gpu_type": "rtx4090", "hours": 1}))
            .await;
        assert_eq!(status, StatusCode::CREATED, "{r}");
        assert_eq!(r["borrowed"], true, "{r}");
        let id = r["id"].as_str().unwrap().to_owned();
        app.wait_status(&arty.client, &id, "running").await;
        borrowed.push(id);
    }

    // The lab, within its quota, takes one back: the borrower is preempted.
    let (status, mine) = olga
        .client
        .reserve(json!({"gpu_type": "rtx4090", "hours": 1, "team": "lab"}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{mine}");
    assert!(mine.get("borrowed").is_none(), "guaranteed: {mine}");
    let mine = mine["id"].as_str().unwrap().to_owned();
    app.wait_status(&olga.client, &mine, "running").await;
    let mut preempted = 0;
    for id in &borrowed {
        let (_, r) = arty.client.get(&format!("/api/v1/reservations/{id}")).await;
        if r["end_reason"] == "preempted" {
            preempted += 1;
        }
    }
    assert_eq!(preempted, 1, "one borrower taken back");
    let (_, listed) = olga.client.get("/api/v1/quotas").await;
    assert_eq!(listed[0]["used"], "1", "{listed}");
    let (_, others) = arty.client.get("/api/v1/quotas").await;
    assert_eq!(
        others,
        json!([]),
        "another team's quota is not arty's to see"
    );

    // Past its quota with no borrowing: refused, saying why; asked to wait, it queues.
    let (status, over) = olga
        .client
        .reserve(json!({"gpu_type": "rtx4090", "vram_gb": 4, "hours": 1, "team": "lab"}))
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{over}");
    assert!(over.to_string().contains("over quota"), "{over}");
    let (status, queued) = olga
        .client
        .reserve(
            json!({"gpu_type": "rtx4090", "vram_gb": 4, "hours": 1, "team": "lab",
                        "queue": true}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{queued}");
    assert_eq!(queued["status"], "pending");

    // Lowered under what runs: nothing stops.
    let zero = json!({"team": "lab", "gpu_type": "rtx4090", "gpus": "0", "borrow_limit": "0"});
    let (status, _, _) = app.admin().send("PUT", "/api/v1/quotas", Some(&zero)).await;
    assert_eq!(status, StatusCode::OK);
    app.maintenance_tick().await;
    let (_, still) = olga
        .client
        .get(&format!("/api/v1/reservations/{mine}"))
        .await;
    assert_eq!(still["status"], "running", "{still}");

    let path = "/api/v1/quotas?team=lab&gpu_type=rtx4090";
    let (status, _, _) = app.admin().send("DELETE", path, None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, _, _) = app.admin().send("DELETE", path, None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    app.assert_consistent().await;
    app.shutdown().await;
}
both_stores!(
    quotas,
    a_quota_is_guaranteed_and_borrowed_gpus_are_taken_back
);

async fn queued_work_within_its_quota_takes_borrowed_gpus_back(backend: Backend) {
    let app = TestApp::with(backend)
        .with_sim_gpus("2xRTX4090")
        .start()
        .await;
    let olga = app.tenant("olga", "100").await;
    let arty = app.tenant("arty", "100").await;
    app.team(&olga.client, "lab", &[], "50").await;
    // A quota of none: the type has quotas, and the lab may only borrow.
    let quota = |gpus: &str| json!({"team": "lab", "gpu_type": "rtx4090", "gpus": gpus});
    let (status, _, _) = app
        .admin()
        .send("PUT", "/api/v1/quotas", Some(&quota("0")))
        .await;
    assert_eq!(status, StatusCode::OK);

    // arty borrows both GPUs; the lab's two reservations queue behind him.
    let mut lent = Vec::new();
    for _ in 0..2 {
        let (status, r) = arty
            .client
            .reserve(json!({"gpu_type": "rtx4090", "hours": 1}))
            .await;
        assert_eq!(status, StatusCode::CREATED, "{r}");
        let id = r["id"].as_str().unwrap().to_owned();
        app.wait_status(&arty.client, &id, "running").await;
        lent.push(id);
    }
    let mut queued = Vec::new();
    for _ in 0..2 {
        let (status, r) = olga
            .client
            .reserve(json!({"gpu_type": "rtx4090", "hours": 1, "team": "lab", "queue": true}))
            .await;
        assert_eq!(status, StatusCode::CREATED, "{r}");
        assert_eq!(r["status"], "pending", "{r}");
        queued.push(r["id"].as_str().unwrap().to_owned());
    }
    app.maintenance_tick().await;
    for id in &lent {
        let (_, r) = arty.client.get(&format!("/api/v1/reservations/{id}")).await;
        assert_eq!(
            r["status"], "running",
            "beyond its quota, nothing is taken: {r}"
        );
    }

    // The lab is given one GPU: the pass takes one back for its first, with the spot notice,
    // and its second, beyond the quota, waits.
    let (status, _, _) = app
        .admin()
        .send("PUT", "/api/v1/quotas", Some(&quota("1")))
        .await;
    assert_eq!(status, StatusCode::OK);
    app.maintenance_tick().await;
    let placed = app.wait_status(&olga.client, &queued[0], "running").await;
    assert!(placed.get("borrowed").is_none(), "guaranteed: {placed}");
    let mut preempted = Vec::new();
    for id in &lent {
        let (_, r) = arty.client.get(&format!("/api/v1/reservations/{id}")).await;
        if r["end_reason"] == "preempted" {
            preempted.push(id.clone());
        }
    }
    assert_eq!(preempted.len(), 1, "one GPU for one GPU of quota");
    app.wait_status(&arty.client, &preempted[0], "preempted")
        .await;
    app.maintenance_tick().await;
    let (_, second) = olga
        .client
        .get(&format!("/api/v1/reservations/{}", queued[1]))
        .await;
    assert_eq!(second["status"], "pending", "{second}");
    let still: Vec<&String> = lent.iter().filter(|id| !preempted.contains(id)).collect();
    let (_, other) = arty
        .client
        .get(&format!("/api/v1/reservations/{}", still[0]))
        .await;
    assert_eq!(other["status"], "running", "{other}");
    app.assert_consistent().await;
    app.shutdown().await;
}
both_stores!(
    quota_reclaim_from_the_queue,
    queued_work_within_its_quota_takes_borrowed_gpus_back
);

/// Many at once (placed together by the batched path): the quota and the borrow limit hold
/// exactly, and only what is past the quota is marked borrowed.
async fn many_at_once_keep_to_the_quota_and_the_borrow_limit(backend: Backend) {
    let app = TestApp::with(backend)
        .with_sim_gpus("8xRTX4090")
        .start()
        .await;
    let olga = app.tenant("olga", "1000").await;
    // A user's own quota: her reservations go through the batched path (a team's are placed
    // one by one, under the team's lock and the member's).
    let quota = json!({"team": "olga", "gpu_type": "rtx4090", "gpus": "2", "borrow_limit": "1"});
    let (status, _, body) = app
        .admin()
        .send("PUT", "/api/v1/quotas", Some(&quota))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let ci = olga.client.clone();
    let tries = (0..6).map(|_| {
        let ci = ci.clone();
        tokio::spawn(async move { ci.reserve(json!({"gpu_type": "rtx4090", "hours": 1})).await })
    });
    let (mut guaranteed, mut borrowed, mut refused) = (0, 0, 0);
    for t in tries {
        let (status, r) = t.await.unwrap();
        match status {
            StatusCode::CREATED if r["borrowed"] == true => borrowed += 1,
            StatusCode::CREATED => guaranteed += 1,
            StatusCode::CONFLICT => {
                assert!(r.to_string().contains("over quota"), "{r}");
                refused += 1;
            }
            other => panic!("{other}: {r}"),
        }
    }
    assert_eq!((guaranteed, borrowed, refused), (2, 1, 3));
    let (_, listed) = olga.client.get("/api/v1/quotas").await;
    assert_eq!(listed[0]["used"], "3", "{listed}");
    app.assert_consistent().await;
    app.shutdown().await;
}
both_stores!(
    quota_batched,
    many_at_once_keep_to_the_quota_and_the_borrow_limit
);
