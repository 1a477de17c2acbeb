//! The CLI's `notifications add|ls|rm|test|deliveries`.

use std::time::Duration;

use gpurent_types::api::{AddNotification, NotificationDelivery, NotificationHook};

use super::access::time;
use super::client::segment;
use crate::api_client::{ApiClient, CliError};
use crate::cli::NotificationsCommand;
use crate::output::{print_json, print_line, print_table};

/// How long `test` waits for the first attempt's answer.
const TEST_WAIT: Duration = Duration::from_secs(30);

fn hooks_path(team: Option<&str>) -> String {
    match team {
        Some(t) => format!("/api/v1/notifications?team={}", segment(t)),
        None => "/api/v1/notifications".to_owned(),
    }
}

/// One line of how a delivery went.
fn outcome(d: &NotificationDelivery) -> String {
    let last = d.attempts.last().map(|a| match (a.status, &a.error) {
        (_, Some(error)) => error.clone(),
        (Some(status), None) => format!("answered {status}"),
        (None, None) => "no answer".to_owned(),
    });
    match (d.state.as_str(), last, d.next_at) {
        ("pending", None, _) => "not tried yet".to_owned(),
        ("pending", Some(last), Some(next)) => {
            format!("{last}; tried again at {}", time(Some(next)))
        }
        (state, Some(last), _) => format!("{state}: {last}"),
        (state, None, _) => state.to_owned(),
    }
}

pub async fn notifications(
    api: &ApiClient,
    command: NotificationsCommand,
    json: bool,
) -> Result<(), CliError> {
    match command {
        NotificationsCommand::Add { url, team, events } => {
            let body = AddNotification {
                url,
                team,
                events: (!events.is_empty()).then_some(events),
            };
            let hook: NotificationHook = api.post("/api/v1/notifications", &body, None).await?;
            if json {
                return print_json(&hook);
            }
            print_line(&format!(
                "added webhook {} for {}",
                hook.id,
                hook.events.join(",")
            ));
            print_line(&format!(
                "secret (shown once; X-Gpurent-Signature is sha256= and the hex HMAC-SHA256 of the body under it): {}",
                hook.secret.unwrap_or_default()
            ));
        }
        NotificationsCommand::Ls { team } => {
            let hooks: Vec<NotificationHook> = api.get(&hooks_path(team.as_deref())).await?;
            if json {
                return print_json(&hooks);
            }
            let rows: Vec<Vec<String>> = hooks
                .iter()
                .map(|h| {
                    vec![
                        h.id.clone(),
                        h.url.clone(),
                        h.events.join(","),
                        time(Some(h.created_at)),
                    ]
                })
                .collect();
            print_table(&["ID", "URL", "EVENTS", "ADDED"], &rows);
        }
        NotificationsCommand::Rm { id } => {
            api.delete_no_content(&format!("/api/v1/notifications/{}", segment(&id)))
                .await?;
            if json {
                return print_json(&serde_json::json!({"removed": id}));
            }
            print_line(&format!("removed webhook {id}"));
        }
        NotificationsCommand::Test { id } => {
            let path = format!("/api/v1/notifications/{}", segment(&id));
            let queued: NotificationDelivery = api
                .post(&format!("{path}/test"), &serde_json::json!({}), None)
                .await?;
            if !json {
                eprintln!("sent test delivery {}; waiting for its answer", queued.id);
            }
            let deadline = std::time::Instant::now() + TEST_WAIT;
            let mut delivery = queued.clone();
            while delivery.attempts.is_empty() && std::time::Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(200)).await;
                let all: Vec<NotificationDelivery> = api.get(&format!("{path}/deliveries")).await?;
                if let Some(d) = all.into_iter().find(|d| d.id == queued.id) {
                    delivery = d;
                }
            }
            if json {
                return print_json(&delivery);
            }
            print_line(&outcome(&delivery));
            if delivery.state != "delivered" {
                return Err(CliError::new(
                    "not_delivered",
                    format!("the test was not delivered: {}", outcome(&delivery)),
                ));
            }
        }
        NotificationsCommand::Deliveries { id } => {
            let path = format!("/api/v1/notifications/{}/deliveries", segment(&id));
            let all: Vec<NotificationDelivery> = api.get(&path).await?;
            if json {
                return print_json(&all);
            }
            let rows: Vec<Vec<String>> = all
                .iter()
                .map(|d| {
                    vec![
                        d.id.clone(),
                        d.kind.clone(),
                        time(Some(d.created_at)),
                        d.attempts.len().to_string(),
                        outcome(d),
                    ]
                })
                .collect();
            print_table(&["DELIVERY", "EVENT", "QUEUED", "ATTEMPTS", "LAST"], &rows);
        }
    }
    Ok(())
}
