//! The scheduling pass over queued reservations: the store's view of the queue, the live GPUs
//! and the work on them goes through `gpurent_sched::queue` (priorities with aging, EASY
//! backfill, spot preemption), and each placement it decides is committed by the store's
//! compare-and-set; one that lost a race to another transaction waits for the next pass.

use chrono::{DateTime, Utc};
use gpurent_sched::plan::{holds_in, slot_index, slots, tier_priority};
use std::num::NonZeroU64;

use gpurent_sched::fair_share::{decayed_gpu_seconds, FairShare};
use gpurent_sched::queue::{Pending, Queue, QueueConfig, Reason, Running};
use gpurent_sched::quota::WHOLE;
use gpurent_sched::Plan;
use gpurent_store::QueueView;

use crate::jobs::JobError;
use crate::state::AppState;

/// What one pass decided, in the store's terms.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct PassPlan {
    /// (queued reservation id, its plan), in the order they were placed.
    pub placements: Vec<(String, Plan)>,
    /// (reservation id, why it still waits).
    pub reasons: Vec<(String, String)>,
}

/// Ends the reservations queued too long, then places what the queue can place now.
pub(crate) async fn pass(state: &AppState) -> Result<(), JobError> {
    let now = state.now();
    let timeout =
        chrono::Duration::from_std(state.config.queue_timeout).unwrap_or(chrono::Duration::MAX);
    let timed_out = state
        .store
        .end_queue_timeouts(now.checked_sub_signed(timeout).unwrap_or(now), now)
        .await?;
    for id in &timed_out {
        tracing::info!(reservation_id = %id, "queued reservation timed out");
    }
    // The arrays' next tasks join the queue first.
    crate::arrays::pass::run(state).await?;
    let view = state.store.queue_view(state.live_since(), now).await?;
    if view.queued.is_empty() {
        return Ok(());
    }
    let plan = plan(
        &view,
        now,
        QueueConfig::default(),
        state.config.fair_share_half_life,
    );
    for (id, placement) in &plan.placements {
        match state
            .store
            .place_queued(id, placement, &state.live().prices, now)
            .await?
        {
            Some(nodes) => {
                for node in &nodes {
                    state.wake.wake(node);
                }
                if let Some(q) = view.queued.iter().find(|q| q.id == *id) {
                    let waited = (now - q.queued_at).to_std().unwrap_or_default();
                    state.metrics.observe_wait(waited);
                }
            }
            None => {
                tracing::debug!(reservation_id = %id, "placement from a stale view skipped; the next pass retries");
            }
        }
    }
    state.store.note_queue_reasons(&plan.reasons).await?;
    Ok(())
}

/// Fair share between the tenants with queued work (a team, or a user: a team of one), by
/// account number (their index in `view.teams`'s order of ids, from 1; 0 for one missing
/// there): weight the GPUs their quotas guarantee (one GPU without a quota), usage their
/// GPU-seconds decayed with `half_life`.
fn fair_share(
    view: &QueueView,
    now: DateTime<Utc>,
    half_life: std::time::Duration,
) -> (FairShare, std::collections::HashMap<&str, u64>) {
    let mut share = FairShare::new();
    let mut accounts = std::collections::HashMap::new();
    let half_life = NonZeroU64::new(half_life.as_secs()).unwrap_or(NonZeroU64::MIN);
    for (i, t) in view.teams.iter().enumerate() {
        let account = u64::try_from(i).unwrap_or(u64::MAX).saturating_add(1);
        let weight = t.guaranteed_milli.max(WHOLE);
        let usage = decayed_gpu_seconds(&t.ran, now.timestamp(), half_life);
        // A weight is positive and a decayed usage finite and not negative: never refused.
        if share.set(account, weight, usage).is_ok() {
            accounts.insert(t.team_id.as_str(), account);
        }
    }
    // Tenants with no quota and nothing run lately are at one GPU's weight and no usage.
    for q in &view.queued {
        let next = u64::try_from(accounts.len())
            .unwrap_or(u64::MAX)
            .saturating_add(1);
        if !accounts.contains_key(q.tenant_id.as_str()) && share.set(next, WHOLE, 0.0).is_ok() {
            accounts.insert(q.tenant_id.as_str(), next);
        }
    }
    (share, accounts)
}

/// Whether queued `q` is within its tenant's quota of its type as `view` saw it (the store
/// checks again as it places it): a share sized against the type's largest live card.
fn guaranteed(view: &QueueView, q: &gpurent_store::QueuedReservation) -> bool {
    let Some(quota) = view
        .quotas
        .iter()
        .find(|u| u.tenant_id == q.tenant_id && u.type_key == q.type_key)
    else {
        return false;
    };
    let card = view
        .gpus
        .iter()
        .filter(|g| g.type_key == q.type_key)
        .map(|g| g.gpu.vram_mb)
        .max()
        .unwrap_or(1);
    let asked = gpurent_sched::quota::asked(q.want, card);
    gpurent_sched::quota::standing(true, Some(quota.quota), quota.used_milli, asked)
        == Ok(gpurent_sched::quota::Standing::Guaranteed)
}

/// One pass of the queue over `view` at `now`, with fair share between its tenants: pure, so
/// that it can be tested without a store.
pub(crate) fn plan(
    view: &QueueView,
    now: DateTime<Utc>,
    config: QueueConfig,
    half_life: std::time::Duration,
) -> PassPlan {
    let (share, accounts) = fair_share(view, now, half_life);
    // Borrowed work's tenants, numbered as the queued ones are: only the tenant matters.
    let mut owners = accounts.clone();
    let borrowed: std::collections::HashMap<&str, u64> = view
        .borrowed
        .iter()
        .map(|(id, tenant)| {
            let next = u64::try_from(owners.len())
                .unwrap_or(u64::MAX)
                .saturating_add(1);
            (id.as_str(), *owners.entry(tenant.as_str()).or_insert(next))
        })
        .collect();
    let gpus: Vec<gpurent_sched::plan::Gpu> = view.gpus.iter().map(|g| g.gpu.clone()).collect();
    let slots = slots(&gpus);
    let index = slot_index(&gpus);
    let running: Vec<Running> = view
        .held
        .iter()
        .enumerate()
        .filter_map(|(i, w)| {
            let holds = holds_in(&index, w);
            (!holds.is_empty()).then(|| Running {
                id: i as u64,
                priority: w.priority,
                value: w.value,
                started_at: w.started_at,
                ends_at: Some(w.ends_at.div_euclid(1_000_000)),
                holds,
                borrowed_of: borrowed.get(w.id.as_str()).copied(),
            })
        })
        .collect();
    let mut queue = Queue::new(config);
    let mut plan = PassPlan::default();
    for (i, q) in view.queued.iter().enumerate() {
        let pushed = queue.push(Pending {
            id: i as u64,
            request: q.want,
            priority: tier_priority(q.tier, q.priority, false),
            enqueued_at: q.queued_at.timestamp(),
            duration_s: Some(q.duration_s),
            account: accounts.get(q.tenant_id.as_str()).copied().unwrap_or(0),
            guaranteed: guaranteed(view, q),
        });
        if let Err(e) = pushed {
            plan.reasons.push((q.id.clone(), e.to_string()));
        }
    }
    let queued_of = |id: u64| usize::try_from(id).ok().and_then(|i| view.queued.get(i));
    let outcome = queue.pass_fair(now.timestamp(), &slots, &running, &share, |item, gpu| {
        queued_of(item.id).is_some_and(|q| {
            let g = &view.gpus[gpu];
            g.type_key == q.type_key
                && q.node_filter.admits(
                    &g.gpu.node_id,
                    view.shared_volume_nodes.contains(&g.gpu.node_id),
                )
        })
    });
    for placed in &outcome.placed {
        let Some(q) = queued_of(placed.item.id) else {
            continue;
        };
        let victims = placed
            .preempts
            .iter()
            .filter_map(|&r| {
                usize::try_from(r)
                    .ok()
                    .and_then(|r| view.held.get(r))
                    .map(|h| h.id.clone())
            })
            .collect();
        if let Some(p) = Plan::of(&gpus, &q.want, &placed.placement, victims) {
            plan.placements.push((q.id.clone(), p));
        }
    }
    for (id, reason) in &outcome.waiting {
        let Some(q) = queued_of(*id) else { continue };
        let text = match reason {
            // Which reservation is ahead is another tenant's business: only when it ends.
            Reason::ReservedForHead { until, .. } => format!(
                "waiting: its GPUs are held for a reservation ahead of it in the queue until {}",
                DateTime::<Utc>::from_timestamp(*until, 0)
                    .map_or_else(|| until.to_string(), |t| t.to_rfc3339())
            ),
            other => other.to_string(),
        };
        let text = match (&q.node_filter, &q.tie) {
            (gpurent_store::NodeFilter::Any, _) => text,
            // Its node is down: that, not the room on the others, is why it waits.
            (_, Some(tie)) if tie.node_down.is_some() => tie.describe(),
            (_, Some(tie)) => format!("{text}; {}", tie.describe()),
            (filter, None) => format!("{text}; {}", filter.describe()),
        };
        plan.reasons.push((q.id.clone(), text));
    }
    plan
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone;
    use gpurent_sched::plan::Work;
    use gpurent_store::{LiveGpu, QueuedReservation, Want};
    use gpurent_types::Tier;

    use super::*;

    const WEEK: std::time::Duration = std::time::Duration::from_secs(7 * 86_400);

    fn at(s: i64) -> DateTime<Utc> {
        Utc.timestamp_opt(1_800_000_000 + s, 0)
            .single()
            .unwrap_or_default()
    }

    fn gpu(uuid: &str, free_mb: u64) -> LiveGpu {
        LiveGpu {
            type_key: "rtx4090".into(),
            gpu: gpurent_sched::plan::Gpu {
                uuid: uuid.into(),
                node_id: "n1".into(),
                vram_mb: 24_576,
                free_mb,
                switch: None,
            },
        }
    }

    fn queued(id: &str, tier: Tier, priority: Option<i64>, queued_at: i64) -> QueuedReservation {
        QueuedReservation {
            id: id.into(),
            type_key: "rtx4090".into(),
            want: Want::Whole { count: 1 },
            tier,
            priority,
            queued_at: at(queued_at),
            duration_s: 3600,
            node_filter: Default::default(),
            tie: None,
            tenant_id: "t1".into(),
        }
    }

    fn held(id: &str, tier: Tier, uuid: &str) -> Work {
        Work {
            id: id.into(),
            priority: tier_priority(tier, (tier == Tier::Spot).then_some(1_000_000), false),
            value: 1_000_000,
            started_at: at(0).timestamp_micros(),
            ends_at: at(7200).timestamp_micros(),
            holds: vec![(uuid.into(), 24_576)],
        }
    }

    #[test]
    fn on_demand_goes_before_spot_queued_earlier() {
        let view = QueueView {
            queued: vec![
                queued("spot", Tier::Spot, Some(1_000_000), 0),
                queued("od", Tier::OnDemand, None, 10),
            ],
            gpus: vec![gpu("g0", 24_576)],
            held: vec![],
            shared_volume_nodes: vec![],
            teams: Vec::new(),
            ..QueueView::default()
        };
        let plan = plan(&view, at(20), QueueConfig::default(), WEEK);
        assert_eq!(plan.placements.len(), 1);
        assert_eq!(plan.placements[0].0, "od");
        assert_eq!(plan.placements[0].1.gpus, vec![("g0".to_owned(), 24_576)]);
        assert_eq!(
            plan.reasons,
            vec![(
                "spot".to_owned(),
                "waiting behind higher priority".to_owned()
            )]
        );
    }

    #[test]
    fn on_demand_preempts_spot_but_not_on_demand_and_types_do_not_mix() {
        let mut other_type = queued("a100", Tier::OnDemand, None, 0);
        other_type.type_key = "a10080gb".into();
        let view = QueueView {
            queued: vec![other_type, queued("od", Tier::OnDemand, None, 5)],
            gpus: vec![gpu("g0", 0), gpu("g1", 0)],
            held: vec![
                held("busy", Tier::OnDemand, "g0"),
                held("cheap", Tier::Spot, "g1"),
            ],
            shared_volume_nodes: Vec::new(),
            teams: Vec::new(),
            ..QueueView::default()
        };
        let plan = plan(&view, at(20), QueueConfig::default(), WEEK);
        assert_eq!(plan.placements.len(), 1, "{plan:?}");
        assert_eq!(plan.placements[0].0, "od");
        assert_eq!(plan.placements[0].1.victims, vec!["cheap".to_owned()]);
        assert_eq!(plan.placements[0].1.gpus[0].0, "g1");
        assert_eq!(plan.reasons.len(), 1);
        assert_eq!(plan.reasons[0].0, "a100");
    }

    #[test]
    fn spot_does_not_preempt_from_the_queue_and_says_why() {
        let view = QueueView {
            queued: vec![queued("spot", Tier::Spot, Some(5_000_000), 0)],
            gpus: vec![gpu("g0", 0)],
            held: vec![held("cheap", Tier::Spot, "g0")],
            shared_volume_nodes: vec![],
            teams: Vec::new(),
            ..QueueView::default()
        };
        let plan = plan(&view, at(20), QueueConfig::default(), WEEK);
        assert!(plan.placements.is_empty());
        assert_eq!(
            plan.reasons[0].1,
            "asked for 1 whole GPUs on one node; the most free on any node is 0"
        );
    }

    #[test]
    fn queued_work_within_its_quota_takes_back_another_tenants_borrowed_work() {
        let quota = |used_milli| gpurent_store::QuotaUse {
            tenant_id: "t1".into(),
            type_key: "rtx4090".into(),
            quota: gpurent_sched::quota::Quota {
                guaranteed: 1000,
                borrow_limit: None,
            },
            used_milli,
        };
        let view = |used_milli, lender: &str| QueueView {
            queued: vec![queued("mine", Tier::OnDemand, None, 0)],
            gpus: vec![gpu("g0", 0)],
            held: vec![held("lent", Tier::OnDemand, "g0")],
            quotas: vec![quota(used_milli)],
            borrowed: vec![("lent".into(), lender.into())],
            ..QueueView::default()
        };
        let taken = plan(&view(0, "t2"), at(20), QueueConfig::default(), WEEK);
        assert_eq!(taken.placements.len(), 1, "{taken:?}");
        assert_eq!(taken.placements[0].1.victims, vec!["lent".to_owned()]);
        // Its quota already used, or the borrowed work its own: it waits.
        for (used, lender) in [(1000, "t2"), (0, "t1")] {
            let waits = plan(&view(used, lender), at(20), QueueConfig::default(), WEEK);
            assert!(waits.placements.is_empty(), "{used} {lender}: {waits:?}");
        }
    }

    #[test]
    fn backfill_never_delays_the_head_and_the_reason_names_it() {
        let mut head = queued("head", Tier::OnDemand, None, 0);
        head.want = Want::Whole { count: 2 };
        let long = queued("long", Tier::OnDemand, None, 1);
        let mut short = queued("short", Tier::OnDemand, None, 2);
        short.duration_s = 600;
        let mut busy = held("busy", Tier::OnDemand, "g0");
        busy.ends_at = at(1800).timestamp_micros();
        let view = QueueView {
            queued: vec![head, long, short],
            gpus: vec![gpu("g0", 0), gpu("g1", 24_576)],
            held: vec![busy],
            shared_volume_nodes: vec![],
            teams: Vec::new(),
            ..QueueView::default()
        };
        let plan = plan(&view, at(0), QueueConfig::default(), WEEK);
        let placed: Vec<&str> = plan.placements.iter().map(|(id, _)| id.as_str()).collect();
        assert_eq!(placed, vec!["short"]);
        let long_reason = plan
            .reasons
            .iter()
            .find(|(id, _)| id == "long")
            .map(|(_, r)| r.as_str());
        assert_eq!(
            long_reason,
            Some("waiting: its GPUs are held for a reservation ahead of it in the queue until 2027-01-15T08:30:00+00:00")
        );
    }

    #[test]
    fn the_tenant_below_its_share_goes_first_and_quotas_weigh() {
        let mut heavy = queued("heavy", Tier::OnDemand, None, 0);
        heavy.tenant_id = "busy-team".into();
        let mut light = queued("light", Tier::OnDemand, None, 10);
        light.tenant_id = "quiet-team".into();
        // The busy team ran 8 GPUs for the last day; the quiet one nothing.
        let ran = |gpus: u64| gpurent_store::TeamUsage {
            team_id: "busy-team".into(),
            guaranteed_milli: gpus,
            ran: vec![gpurent_sched::fair_share::Interval {
                micro_gpus: 8_000_000,
                start_s: at(-86_400).timestamp(),
                end_s: Some(at(0).timestamp()),
            }],
        };
        let view = |busy: gpurent_store::TeamUsage| QueueView {
            queued: vec![heavy.clone(), light.clone()],
            gpus: vec![gpu("g0", 24_576)],
            held: vec![],
            shared_volume_nodes: vec![],
            teams: vec![busy],
            ..QueueView::default()
        };
        let first = plan(&view(ran(0)), at(20), QueueConfig::default(), WEEK);
        assert_eq!(first.placements.len(), 1, "{first:?}");
        assert_eq!(
            first.placements[0].0, "light",
            "queued later, but below its share"
        );
        // Without the usage, the order is today's: the earlier first.
        let idle = gpurent_store::TeamUsage {
            ran: vec![],
            ..ran(0)
        };
        let second = plan(&view(idle), at(20), QueueConfig::default(), WEEK);
        assert_eq!(second.placements[0].0, "heavy");
        // The quiet team ran 1 GPU that day; the busy one's quota of 1000 GPUs makes its 8 a
        // smaller part of its share.
        let mut weighed = view(ran(1_000_000));
        weighed.teams.push(gpurent_store::TeamUsage {
            team_id: "quiet-team".into(),
            guaranteed_milli: 0,
            ran: vec![gpurent_sched::fair_share::Interval {
                micro_gpus: 1_000_000,
                start_s: at(-86_400).timestamp(),
                end_s: Some(at(0).timestamp()),
            }],
        });
        let third = plan(&weighed, at(20), QueueConfig::default(), WEEK);
        assert_eq!(third.placements[0].0, "heavy", "{third:?}");
    }
}
