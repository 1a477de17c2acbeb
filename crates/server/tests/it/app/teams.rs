//! Teams as the tests set them up: made by an owner, with members in roles and credit moved in.

use reqwest::StatusCode;
use serde_json::{json, Value};

use super::{Client, TestApp};

impl TestApp {
    /// Makes team `name` of `owner` with `members` (user name, role) and `credit` moved in from
    /// the owner ("0": none); the team as made.
    pub async fn team(
        &self,
        owner: &Client,
        name: &str,
        members: &[(&str, &str)],
        credit: &str,
    ) -> Value {
        let (status, team) = owner.post("/api/v1/teams", &json!({ "name": name })).await;
        assert_eq!(status, StatusCode::CREATED, "{team}");
        for (user, role) in members {
            let path = format!("/api/v1/teams/{name}/members/{user}");
            let (status, _, body) = owner
                .send("PUT", &path, Some(&json!({ "role": role })))
                .await;
            assert_eq!(status, StatusCode::OK, "{body}");
        }
        if credit != "0" {
            let path = format!("/api/v1/teams/{name}/credit");
            let (status, body) = owner.post(&path, &json!({ "amount": credit })).await;
            assert_eq!(status, StatusCode::OK, "{body}");
        }
        team
    }
}
