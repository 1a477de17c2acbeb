//! One placement decision, for an immediate reservation and for the queue alike: the candidate
//! GPUs and the work on them, a request and the expected workload give the GPUs to take and the
//! work to preempt ([`Plan`]), or the reason it does not fit. The store applies a plan by
//! compare-and-set, so a plan made from a stale view is refused, never half applied.

use std::collections::HashMap;

use gpurent_types::Tier;

use crate::{choose_victims, place_expecting, GpuSlot, NoFit, Placement, Request, Victim};

/// Base priority of on-demand work: above any spot bid (spot priorities are bids in
/// micro-units per GPU-hour, as `Quote::priority` gives them).
pub const ON_DEMAND: i64 = 1_000_000_000_000_000;
/// Base priority of reserved blocks: ahead of on-demand work.
pub const RESERVED: i64 = 2 * ON_DEMAND;

/// The priority of work of `tier`: a spot reservation's bid per whole GPU-hour (`spot_bid`,
/// zero when unknown), or its tier's base. Work already stopping frees its memory soon and is
/// nobody's victim: it ranks as reserved.
pub fn tier_priority(tier: Tier, spot_bid: Option<i64>, stopping: bool) -> i64 {
    match tier {
        _ if stopping => RESERVED,
        Tier::Spot => spot_bid.unwrap_or(0).min(ON_DEMAND - 1),
        Tier::Reserved => RESERVED,
        Tier::OnDemand | Tier::Stepped => ON_DEMAND,
    }
}

/// Whether work of this priority is spot, and so may be preempted by higher priority.
pub fn is_spot(priority: i64) -> bool {
    priority < ON_DEMAND
}

/// A candidate GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gpu {
    pub node_id: String,
    pub uuid: String,
    pub vram_mb: u64,
    pub free_mb: u64,
    /// Its PCIe switch on its node, when known.
    pub switch: Option<u32>,
}

/// Placed work holding memory on candidate GPUs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Work {
    pub id: String,
    /// As [`tier_priority`] gives it.
    pub priority: i64,
    /// What preempting it loses per hour (its price per hour, in micro-units).
    pub value: i64,
    /// When it started (or was placed), in microseconds: among equal bids the newest goes
    /// first.
    pub started_at: i64,
    /// When it is due to end, in microseconds.
    pub ends_at: i64,
    /// (GPU UUID, MiB) it holds.
    pub holds: Vec<(String, u64)>,
}

/// What a plan is made from: candidate GPUs, in the order ties go (tightest first), and the
/// work on them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct View {
    pub gpus: Vec<Gpu>,
    pub work: Vec<Work>,
}

/// The candidates' order with the GPUs of the `preferred` nodes (those that have the image
/// asked for) first, each part in the order it had: the placers look at the candidates' order
/// only to break ties, so a preferred node wins a tie and never a better fit.
pub fn preferred_order(gpus: &[Gpu], preferred: &std::collections::BTreeSet<String>) -> Vec<usize> {
    let mut order: Vec<usize> = (0..gpus.len()).collect();
    order.sort_by_key(|&i| !preferred.contains(&gpus[i].node_id));
    order
}

impl View {
    /// The GPUs in [`preferred_order`].
    pub fn prefer_nodes(&mut self, preferred: &std::collections::BTreeSet<String>) {
        let order = preferred_order(&self.gpus, preferred);
        let mut old: Vec<Option<Gpu>> = std::mem::take(&mut self.gpus)
            .into_iter()
            .map(Some)
            .collect();
        self.gpus = order
            .iter()
            .filter_map(|&i| old.get_mut(i)?.take())
            .collect();
    }
}

/// What is asked: the request and its priority ([`tier_priority`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ask {
    pub request: Request,
    pub priority: i64,
}

/// A decision to apply: the GPUs to take on one node and the work to preempt first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub node_id: String,
    /// (GPU UUID, MiB to take), all on `node_id`.
    pub gpus: Vec<(String, u64)>,
    /// Whole GPUs: each is taken only while all of its memory is free.
    pub whole: bool,
    /// Ids of the work to preempt, whose memory the GPUs need.
    pub victims: Vec<String>,
}

/// The candidates as the placers see them: slot `i` is `gpus[i]`, and GPUs of one node share
/// a node number (numbered in order of first appearance).
pub fn slots<'a>(gpus: impl IntoIterator<Item = &'a Gpu>) -> Vec<GpuSlot> {
    let mut nodes: HashMap<&str, u32> = HashMap::new();
    gpus.into_iter()
        .map(|g| {
            let next = u32::try_from(nodes.len()).unwrap_or(u32::MAX);
            GpuSlot {
                node: *nodes.entry(g.node_id.as_str()).or_insert(next),
                vram_mb: g.vram_mb,
                free_mb: g.free_mb.min(g.vram_mb),
                switch: g.switch,
            }
        })
        .collect()
}

/// Each candidate's slot by its UUID.
pub fn slot_index(gpus: &[Gpu]) -> HashMap<&str, usize> {
    gpus.iter()
        .enumerate()
        .map(|(i, g)| (g.uuid.as_str(), i))
        .collect()
}

/// `work`'s holds as (slot, MiB) by [`slot_index`]; holds on GPUs that are not candidates are
/// left out.
pub fn holds_in(index: &HashMap<&str, usize>, work: &Work) -> Vec<(usize, u64)> {
    work.holds
        .iter()
        .filter_map(|(uuid, mb)| index.get(uuid.as_str()).map(|&s| (s, *mb)))
        .collect()
}

impl Plan {
    /// The plan of `placement` (indices into `gpus`) preempting `victims`; `None` for an empty
    /// placement.
    pub fn of(
        gpus: &[Gpu],
        request: &Request,
        placement: &Placement,
        victims: Vec<String>,
    ) -> Option<Plan> {
        let node_id = gpus.get(placement.gpus.first()?.0)?.node_id.clone();
        Some(Plan {
            node_id,
            gpus: placement
                .gpus
                .iter()
                .filter_map(|&(i, mb)| gpus.get(i).map(|g| (g.uuid.clone(), mb)))
                .collect(),
            whole: matches!(request, Request::Whole { .. }),
            victims,
        })
    }
}

/// Places `ask` on `view`: on free memory where it fits (fragmenting `expected`, the recent
/// requests for the type, the least), else on one node by preempting the spot work of lower
/// priority that loses the least per hour. Deterministic: the same view, ask and expected
/// workload give the same plan.
pub fn plan(view: &View, ask: &Ask, expected: &[Request]) -> Result<Plan, NoFit> {
    let slots = slots(&view.gpus);
    let refused = match place_expecting(&slots, &ask.request, expected) {
        Ok(p) => return Plan::of(&view.gpus, &ask.request, &p, Vec::new()).ok_or(NoFit::Empty),
        Err(e) => e,
    };
    let index = slot_index(&view.gpus);
    let mut ids = Vec::new();
    let mut victims = Vec::new();
    for w in &view.work {
        let holds = holds_in(&index, w);
        // Only spot work of lower priority, and only when all it holds is in view (its memory
        // is freed whole).
        if !is_spot(w.priority) || w.priority >= ask.priority || holds.len() != w.holds.len() {
            continue;
        }
        ids.push(w.id.as_str());
        victims.push(Victim {
            priority: w.priority,
            value: w.value,
            started_at: w.started_at,
            holds,
        });
    }
    let chosen = choose_victims(&slots, &victims, &ask.request, ask.priority)
        .filter(|c| !c.is_empty())
        .ok_or(refused.clone())?;
    let node = victims[chosen[0]]
        .holds
        .first()
        .map(|&(s, _)| slots[s].node)
        .ok_or(refused.clone())?;
    // The victims' memory freed, only on their node: the request goes there.
    let mut freed: Vec<GpuSlot> = slots
        .iter()
        .map(|s| {
            if s.node == node {
                *s
            } else {
                GpuSlot {
                    free_mb: 0,
                    vram_mb: 0,
                    ..*s
                }
            }
        })
        .collect();
    for &v in &chosen {
        for &(s, mb) in &victims[v].holds {
            let slot = &mut freed[s];
            slot.free_mb = slot.free_mb.saturating_add(mb).min(slot.vram_mb);
        }
    }
    let placement = place_expecting(&freed, &ask.request, expected).map_err(|_| refused.clone())?;
    let mut chosen_ids: Vec<String> = chosen.iter().map(|&v| ids[v].to_owned()).collect();
    chosen_ids.sort();
    Plan::of(&view.gpus, &ask.request, &placement, chosen_ids).ok_or(refused)
}

#[cfg(test)]
mod tests;
