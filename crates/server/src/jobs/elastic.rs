//! Elastic capacity in the control plane: every `ScaleConfig::interval` the maintenance loop
//! reads the fleet's figures, the pure policy (`gpurent_sched::elastic`) judges them, and an
//! action goes to the configured hook (a command, a webhook, or both) in a task of its own, so
//! a slow hook never holds up settlement or the queue. A hook that fails lifts the action's
//! cooldown: the next evaluation asks again if the rule still holds.
//!
//! Each replica evaluates on its own; with several replicas each may call the hook, so the
//! hook should be idempotent over a cooldown (an autoscaler's desired count usually is).

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use chrono::{DateTime, Utc};
use gpurent_sched::elastic::{Action, Elastic, ElasticConfig, Figures};
use gpurent_store::FleetView;
use serde::Serialize;
use tokio::io::AsyncWriteExt;

use crate::jobs::JobError;
use crate::state::AppState;

/// How elastic capacity is configured; off unless a hook is.
#[derive(Debug, Clone)]
pub struct ScaleConfig {
    /// Run with `sh -c`, the action as JSON on stdin, `GPURENT_SCALE_ACTION` in its environment.
    pub hook_command: Option<String>,
    /// POSTed the action as JSON.
    pub hook_url: Option<String>,
    /// How often the fleet is judged.
    pub interval: Duration,
    /// How long a hook may take before it counts as failed (a command is killed).
    pub hook_timeout: Duration,
    pub policy: ElasticConfig,
}

impl Default for ScaleConfig {
    fn default() -> Self {
        ScaleConfig {
            hook_command: None,
            hook_url: None,
            interval: Duration::from_secs(60),
            hook_timeout: Duration::from_secs(30),
            policy: ElasticConfig::default(),
        }
    }
}

impl ScaleConfig {
    pub fn enabled(&self) -> bool {
        self.hook_command.is_some() || self.hook_url.is_some()
    }
}

/// The policy's memory and when it is next due, shared by the loop and the hook tasks.
#[derive(Debug)]
pub struct ElasticState {
    policy: Mutex<Elastic>,
    next_at: Mutex<Option<DateTime<Utc>>>,
    http: reqwest::Client,
}

impl ElasticState {
    pub fn new(config: &ScaleConfig) -> Self {
        ElasticState {
            policy: Mutex::new(Elastic::new(config.policy)),
            next_at: Mutex::new(None),
            http: reqwest::Client::builder()
                .timeout(config.hook_timeout)
                .build()
                .unwrap_or_default(),
        }
    }
}

/// What a hook receives (the README's "Elastic capacity" section is its contract).
#[derive(Debug, Clone, Serialize)]
pub struct ScaleEvent {
    /// `scale-out` or `scale-in`.
    pub action: &'static str,
    /// `busy`, `queue_wait` or `idle`.
    pub rule: &'static str,
    pub reason: String,
    pub at: DateTime<Utc>,
    /// The figures the policy judged, as it saw them.
    pub figures: Figures,
}

impl ScaleEvent {
    fn of(action: &Action, at: DateTime<Utc>) -> Self {
        ScaleEvent {
            action: action.kind.as_str(),
            rule: action.rule.as_str(),
            reason: action.reason.clone(),
            at,
            figures: action.figures.clone(),
        }
    }
}

/// The policy's figures from the store's view: percentages to two decimals.
pub fn figures(view: &FleetView, now: DateTime<Utc>) -> Figures {
    let round = |v: f64| (v * 100.0).round() / 100.0;
    let mean = |v: &[u32]| {
        (!v.is_empty())
            .then(|| round(v.iter().map(|&x| f64::from(x)).sum::<f64>() / v.len() as f64))
    };
    let held = view.vram_mb.saturating_sub(view.free_mb);
    Figures {
        live_nodes: view.live_nodes,
        gpus: view.gpus,
        gpu_allocation_pct: if view.vram_mb == 0 {
            0.0
        } else {
            round(held as f64 * 100.0 / view.vram_mb as f64)
        },
        gpu_utilization_pct: mean(&view.gpu_utilization_pct),
        cpu_utilization_pct: mean(&view.cpu_utilization_pct),
        queued: view.queued,
        oldest_queued_s: view
            .oldest_queued_at
            .map(|q| u64::try_from((now - q).num_seconds()).unwrap_or(0)),
    }
}

/// One evaluation when it is due (called on every maintenance tick); hooks run in the
/// background.
pub(crate) async fn tick(state: &AppState) -> Result<(), JobError> {
    let config = &state.config.scale;
    if !config.enabled() {
        return Ok(());
    }
    let now = state.now();
    {
        let mut next = state
            .elastic
            .next_at
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if next.is_some_and(|n| now < n) {
            return Ok(());
        }
        let interval = chrono::Duration::from_std(config.interval).unwrap_or(chrono::Duration::MAX);
        *next = Some(now + interval);
    }
    let view = state.store.fleet(state.live_since()).await?;
    let figures = figures(&view, now);
    tracing::debug!(?figures, "elastic capacity evaluation");
    let action = state
        .elastic
        .policy
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .evaluate(now.timestamp(), figures);
    if let Some(action) = action {
        tracing::info!(action = action.kind.as_str(), reason = %action.reason, "elastic capacity: calling the scale hook");
        let state = state.clone();
        tokio::spawn(async move {
            let event = ScaleEvent::of(&action, now);
            if !deliver(&state, &event).await {
                state
                    .elastic
                    .policy
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .undelivered(action.kind, action.at_s);
            }
        });
    }
    Ok(())
}

/// Runs every configured hook; true when all of them succeeded.
async fn deliver(state: &AppState, event: &ScaleEvent) -> bool {
    let config = &state.config.scale;
    let body = match serde_json::to_vec(event) {
        Ok(b) => b,
        Err(e) => {
            tracing::error!(error = %e, "cannot encode the scale action");
            return false;
        }
    };
    let mut ok = true;
    if let Some(command) = &config.hook_command {
        ok &= run_command(command, event.action, &body, config.hook_timeout).await;
    }
    if let Some(url) = &config.hook_url {
        ok &= post(&state.elastic.http, url, &body).await;
    }
    ok
}

async fn run_command(command: &str, action: &str, body: &[u8], timeout: Duration) -> bool {
    let child = tokio::process::Command::new("sh")
        .arg("-c")
        .arg(command)
        .env("GPURENT_SCALE_ACTION", action)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(error = %e, "cannot start the scale hook command");
            return false;
        }
    };
    let run = async {
        if let Some(mut stdin) = child.stdin.take() {
            // A hook that does not read its input may close it early: not a failure.
            let mut line = body.to_vec();
            line.push(b'\n');
            if let Err(e) = stdin.write_all(&line).await {
                tracing::debug!(error = %e, "the scale hook did not read all its input");
            }
        }
        child.wait_with_output().await
    };
    match tokio::time::timeout(timeout, run).await {
        Ok(Ok(out)) if out.status.success() => {
            tracing::info!(action, status = %out.status, "scale hook command done");
            true
        }
        Ok(Ok(out)) => {
            tracing::warn!(
                action,
                status = %out.status,
                stderr = %String::from_utf8_lossy(&out.stderr).trim(),
                "scale hook command failed; asking again at the next evaluation if the rule still holds"
            );
            false
        }
        Ok(Err(e)) => {
            tracing::warn!(action, error = %e, "scale hook command failed");
            false
        }
        Err(_) => {
            tracing::warn!(
                action,
                ?timeout,
                "scale hook command timed out and was killed"
            );
            false
        }
    }
}

async fn post(http: &reqwest::Client, url: &str, body: &[u8]) -> bool {
    let sent = http
        .post(url)
        .header("content-type", "application/json")
        .body(body.to_vec())
        .send()
        .await
        .and_then(reqwest::Response::error_for_status);
    match sent {
        Ok(r) => {
            tracing::info!(url, status = %r.status(), "scale webhook done");
            true
        }
        Err(e) => {
            tracing::warn!(url, error = %e, "scale webhook failed; asking again at the next evaluation if the rule still holds");
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_from_the_view() {
        let now = Utc::now();
        let view = FleetView {
            live_nodes: 2,
            gpus: 3,
            vram_mb: 3000,
            free_mb: 500,
            gpu_utilization_pct: vec![100, 50, 0],
            cpu_utilization_pct: vec![71, 80],
            queued: 1,
            oldest_queued_at: Some(now - chrono::Duration::seconds(61)),
        };
        let f = figures(&view, now);
        assert_eq!(f.gpu_allocation_pct, 83.33);
        assert_eq!(f.gpu_utilization_pct, Some(50.0));
        assert_eq!(f.cpu_utilization_pct, Some(75.5));
        assert_eq!(f.oldest_queued_s, Some(61));
        let empty = figures(&FleetView::default(), now);
        assert_eq!(
            (empty.gpu_allocation_pct, empty.cpu_utilization_pct),
            (0.0, None)
        );
    }
}
