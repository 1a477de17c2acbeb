//! Job arrays (`array: "0-199%10"`) through a real server and sim agent: never more tasks
//! queued or running than the limit, every index run exactly once, the array as one id with
//! its tasks counted, `ID[INDEX]` for a task, a stop that stops all, a 100,000-task array
//! accepted, and the bad inputs refused.

use std::time::Duration;

use gpurent_store::Backend;
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::app::{Client, TestApp};
use crate::both_stores;
use crate::console_support::login;

fn id(r: &Value) -> String {
    r["id"].as_str().expect("id").to_owned()
}

fn micros(t: &Value) -> i64 {
    chrono::DateTime::parse_from_rfc3339(t.as_str().expect("a time"))
        .expect("rfc3339")
        .timestamp_micros()
}

/// Every task the array started, by index.
async fn tasks(client: &Client, array: &str) -> Vec<Value> {
    let mut all = Vec::new();
    loop {
        let from = all
            .last()
            .map_or(0, |t: &Value| t["array_index"].as_u64().expect("index") + 1);
        let (status, page) = client
            .get(&format!(
                "/api/v1/reservations/{array}/tasks?from={from}&limit=1000"
            ))
            .await;
        assert_eq!(status, StatusCode::OK, "{page}");
        let page = page.as_array().expect("a list").clone();
        if page.is_empty() {
            return all;
        }
        all.extend(page);
    }
}

/// The array once it has ended, polled for at most a minute.
async fn ended(client: &Client, array: &str) -> Value {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    loop {
        let (_, r) = client.get(&format!("/api/v1/reservations/{array}")).await;
        if r["ended_at"].is_string() {
            return r;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the array never ended: {r}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The most tasks live (from their creation to their end) at any one moment.
fn most_at_once(tasks: &[Value]) -> usize {
    let mut events: Vec<(i64, i32)> = Vec::new();
    for t in tasks {
        events.push((micros(&t["created_at"]), 1));
        events.push((micros(&t["ended_at"]), -1));
    }
    // An end and a start at the same instant: the end first (the pass counted after it).
    events.sort_unstable();
    let (mut now, mut most) = (0i32, 0i32);
    for (_, d) in events {
        now += d;
        most = most.max(now);
    }
    usize::try_from(most).unwrap_or(0)
}

async fn an_array_runs_each_index_once_within_its_limit(backend: Backend) {
    let app = TestApp::with(backend)
        .with_sim_gpus("16xRTX4090")
        .start()
        .await;
    let carol = app.tenant("carol", "100").await;
    let (status, r) = carol
        .client
        .reserve(
            json!({"gpu_type": "rtx4090", "hours": 1, "command": ["exit", "0"],
            "array": "0-199%10"}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{r}");
    assert_eq!(r["array"]["spec"], "0-199%10", "{r}");
    assert_eq!(r["array"]["tasks"], 200, "{r}");
    let array = id(&r);

    let done = ended(&carol.client, &array).await;
    assert_eq!(
        (done["status"].as_str(), done["end_reason"].as_str()),
        (Some("stopped"), Some("exited")),
        "{done}"
    );
    assert_eq!(
        done["array"],
        json!({"spec": "0-199%10", "tasks": 200, "done": 200, "running": 0, "failed": 0,
            "stopped": 0, "queued": 0}),
        "{done}"
    );
    let all = tasks(&carol.client, &array).await;
    let indexes: Vec<u64> = all
        .iter()
        .map(|t| t["array_index"].as_u64().expect("index"))
        .collect();
    assert_eq!(indexes, (0..200).collect::<Vec<_>>(), "every index once");
    assert!(all.iter().all(|t| t["array_id"] == array.as_str()));
    assert!(all.iter().all(|t| t["end_reason"] == "exited"));
    let most = most_at_once(&all);
    assert!(most <= 10, "{most} tasks were live at once");
    assert!(most >= 2, "the limit let only {most} run at once");

    // A task by its index, in every reservation route.
    let (status, seven) = carol
        .client
        .get(&format!("/api/v1/reservations/{array}[7]"))
        .await;
    assert_eq!(status, StatusCode::OK, "{seven}");
    assert_eq!(seven["array_index"], 7, "{seven}");
    let (status, _, _) = carol
        .client
        .get_text(
            &format!("/api/v1/reservations/{array}[7]/logs"),
            "x-log-next-offset",
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let (status, missing) = carol
        .client
        .get(&format!("/api/v1/reservations/{array}[200]"))
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{missing}");

    // The list has the array once, not its tasks.
    let (_, list) = carol.client.get("/api/v1/reservations").await;
    assert!(list.as_array().expect("list").is_empty(), "{list}");
    let (_, arrays) = carol.client.get("/api/v1/arrays").await;
    assert_eq!(arrays.as_array().map(Vec::len), Some(1), "{arrays}");
    assert_eq!(arrays[0]["id"], array.as_str());

    // The console lists it as one row and shows its tasks counted.
    let console = login(&app, &carol, "carol").await;
    let page = console.get("/instances").await;
    assert!(
        page.html.contains(&format!("data-array-id=\"{array}\"")),
        "{}",
        page.html
    );
    let one = console.get(&format!("/instances/{array}")).await;
    assert!(one.html.contains("data-field=\"array\""), "{}", one.html);
    assert!(one.html.contains("200 done"), "{}", one.html);

    // Nobody else sees it.
    let dave = app.tenant("dave", "10").await;
    let (status, _) = dave
        .client
        .get(&format!("/api/v1/reservations/{array}"))
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = dave
        .client
        .get(&format!("/api/v1/reservations/{array}[7]"))
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (_, theirs) = dave.client.get("/api/v1/arrays").await;
    assert_eq!(theirs, json!([]));

    // Failing tasks fail the array, with how many.
    let (_, r) = carol
        .client
        .reserve(
            json!({"gpu_type": "rtx4090", "hours": 1, "command": ["exit", "3"],
            "array": "5-9"}),
        )
        .await;
    let failed = ended(&carol.client, &id(&r)).await;
    assert_eq!(failed["status"], "failed", "{failed}");
    assert_eq!(failed["array"]["failed"], 5, "{failed}");
    assert_eq!(failed["end_message"], "5 of its 5 tasks failed", "{failed}");
}
both_stores!(
    an_array_runs_each_index_once_within_its_limit,
    an_array_runs_each_index_once_within_its_limit
);

async fn a_stop_ends_the_whole_array(backend: Backend) {
    let app = TestApp::with(backend)
        .with_sim_gpus("4xRTX4090")
        .start()
        .await;
    let carol = app.tenant("carol", "1000").await;
    // 100,000 tasks are accepted: five run, the rest wait in the array, not in the queue.
    let (status, r) = carol
        .client
        .reserve(json!({"gpu_type": "rtx4090", "hours": 1, "array": "0-99999%5"}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{r}");
    let array = id(&r);
    app.eventually("four tasks running, the fifth queued", || async {
        let (_, r) = carol
            .client
            .get(&format!("/api/v1/reservations/{array}"))
            .await;
        let (_, live) = carol
            .client
            .get(&format!("/api/v1/reservations/{array}/tasks?live=true"))
            .await;
        r["array"]["running"] == 4
            && r["array"]["queued"] == 99_996
            && r["status"] == "running"
            && live.as_array().map(Vec::len) == Some(5)
    })
    .await;

    // A task's app links are asked for by its name too: its port is not published (422), where
    // an index never started is not found.
    let (status, e) = carol
        .client
        .post(
            &format!("/api/v1/reservations/{array}[1]/proxy-links"),
            &json!({"port": 8080}),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{e}");
    let (status, e) = carol
        .client
        .post(
            &format!("/api/v1/reservations/{array}[999]/proxy-links"),
            &json!({"port": 8080}),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{e}");

    // One task stopped by its name: the array starts the next in its place.
    let (status, s) = carol
        .client
        .post(&format!("/api/v1/reservations/{array}[0]/stop"), &json!({}))
        .await;
    assert_eq!(status, StatusCode::OK, "{s}");
    app.eventually("task 5 started", || async {
        let (status, _) = carol
            .client
            .get(&format!("/api/v1/reservations/{array}[5]"))
            .await;
        status == StatusCode::OK
    })
    .await;

    let (status, s) = carol
        .client
        .post(&format!("/api/v1/reservations/{array}/stop"), &json!({}))
        .await;
    assert_eq!(status, StatusCode::OK, "{s}");
    assert_eq!(s["id"], array.as_str());
    let done = ended(&carol.client, &array).await;
    assert_eq!(
        (done["status"].as_str(), done["end_reason"].as_str()),
        (Some("stopped"), Some("stopped_by_user")),
        "{done}"
    );
    assert_eq!(done["array"]["running"], 0, "{done}");
    assert_eq!(done["array"]["queued"], 0, "{done}");
    assert_eq!(done["array"]["stopped"], 100_000, "{done}");
    let all = tasks(&carol.client, &array).await;
    assert_eq!(all.len(), 6, "no task starts after the stop");
    assert!(all.iter().all(|t| t["status"] == "stopped"), "{all:?}");
}
both_stores!(a_stop_ends_the_whole_array, a_stop_ends_the_whole_array);

async fn bad_arrays_say_why(backend: Backend) {
    let app = TestApp::with(backend)
        .with_sim_gpus("1xRTX4090")
        .start()
        .await;
    let carol = app.tenant("carol", "100").await;
    for (spec, says) in [
        ("9-3", "array: the first index 9 is after the last 3"),
        ("0-9%0", "array: \"0\" is not a limit"),
        ("zero", "array: \"zero\" is not an index"),
        ("0-10000000", "is not an index"),
        ("", "array: give the indexes as FIRST-LAST"),
    ] {
        let (status, e) = carol
            .client
            .reserve(json!({"gpu_type": "rtx4090", "hours": 1, "array": spec}))
            .await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{spec}: {e}");
        let message = e["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(says), "{spec}: {e}");
    }
    // A first task the credit cannot hold is refused as a reservation is; nothing is left.
    let poor = app.tenant("poor", "0.01").await;
    let (status, e) = poor
        .client
        .reserve(json!({"gpu_type": "rtx4090", "hours": 1, "array": "0-9"}))
        .await;
    assert_eq!(status, StatusCode::PAYMENT_REQUIRED, "{e}");
    let (_, arrays) = poor.client.get("/api/v1/arrays").await;
    assert_eq!(arrays, json!([]));
    // Its retry with the same key, once the credit is there, makes the array.
    let body = json!({"gpu_type": "rtx4090", "hours": 1, "array": "0-9"});
    let (status, _) = poor
        .client
        .post_with_key("/api/v1/reservations", &body, "array-once")
        .await;
    assert_eq!(status, StatusCode::PAYMENT_REQUIRED);
    let (status, _) = app
        .admin()
        .post(
            &format!("/api/v1/users/{}/credit", poor.id),
            &json!({"amount": "100"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let (status, made) = poor
        .client
        .post_with_key("/api/v1/reservations", &body, "array-once")
        .await;
    assert_eq!(status, StatusCode::CREATED, "{made}");
    let (status, again) = poor
        .client
        .post_with_key("/api/v1/reservations", &body, "array-once")
        .await;
    assert_eq!(status, StatusCode::CREATED, "{again}");
    assert_eq!(again["id"], made["id"], "the same array");
    let other = json!({"gpu_type": "rtx4090", "hours": 1, "array": "0-11"});
    let (status, e) = poor
        .client
        .post_with_key("/api/v1/reservations", &other, "array-once")
        .await;
    assert_eq!(
        status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "another request: {e}"
    );

    // A later task its credit cannot hold waits, the array saying why, until the credit comes.
    let tight = app.tenant("tight", "3").await;
    let (status, r) = tight
        .client
        .reserve(json!({"gpu_type": "rtx4090", "hours": 1, "array": "0-2"}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{r}");
    let array = id(&r);
    app.eventually("the second task refused", || async {
        let (_, r) = tight
            .client
            .get(&format!("/api/v1/reservations/{array}"))
            .await;
        r["array"]["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("task 1 cannot start: ") && m.contains("credit"))
    })
    .await;
    let (status, _) = app
        .admin()
        .post(
            &format!("/api/v1/users/{}/credit", tight.id),
            &json!({"amount": "100"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    // Tried again 5 s after the refusal: waited for longer than `eventually` does.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let (_, r) = tight
            .client
            .get(&format!("/api/v1/reservations/{array}"))
            .await;
        let (_, live) = tight
            .client
            .get(&format!("/api/v1/reservations/{array}/tasks?live=true"))
            .await;
        if live.as_array().map(Vec::len) == Some(3) && r["array"].get("message").is_none() {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never all three: {r}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (status, e) = carol.client.get("/api/v1/reservations/nothing[3]").await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{e}");
}
both_stores!(bad_arrays_say_why, bad_arrays_say_why);

async fn tasks_wait_in_the_queue_past_its_timeout(backend: Backend) {
    let app = TestApp::with(backend)
        .with_sim_gpus("1xRTX4090")
        .with_manual_clock()
        .start()
        .await;
    let carol = app.tenant("carol", "100").await;
    let (status, r) = carol
        .client
        .reserve(json!({"gpu_type": "rtx4090", "hours": 3, "array": "0-2"}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{r}");
    let array = id(&r);
    app.maintenance_tick().await;
    app.eventually("one running, two queued", || async {
        let (_, r) = carol
            .client
            .get(&format!("/api/v1/reservations/{array}"))
            .await;
        r["array"]["running"] == 1 && r["array"]["queued"] == 2
    })
    .await;
    // Past the queue's timeout (an hour): an array's tasks wait in it for their turn, as the
    // ones not started wait in the array.
    app.advance(chrono::Duration::hours(2));
    app.maintenance_tick().await;
    let (_, r) = carol
        .client
        .get(&format!("/api/v1/reservations/{array}"))
        .await;
    assert_eq!(r["array"]["queued"], 2, "{r}");
    assert_eq!(r["array"]["failed"], 0, "{r}");
    let all = tasks(&carol.client, &array).await;
    assert_eq!(all.len(), 3, "{all:?}");
    assert!(all.iter().all(|t| t["end_reason"].is_null()), "{all:?}");
}
both_stores!(
    tasks_wait_in_the_queue_past_its_timeout,
    tasks_wait_in_the_queue_past_its_timeout
);
