//! The control plane's placement with our default policy (`fgd-cpu`): the candidate GPUs it
//! read, in MiB, seen as a small cluster in milli-GPU, and the requests it saw lately as the
//! expected workload whose fragmentation the choice keeps low.

use std::collections::{BTreeMap, HashMap};

use crate::best_fit::pick_whole;
use crate::cluster::{Cluster, GpuDemand, Node, Pod, MILLI};
use crate::policies::{schedule_with, FgdCpu, TieBreak};
use crate::rng::SimRng;
use crate::workload::{Shape, Workload};
use crate::{place, GpuSlot, NoFit, Placement, Request};

/// Places `request` on `candidates` with `fgd-cpu`, against the workload `expected` (recent
/// requests for the same GPU type; the more often a shape was asked, the more its
/// fragmentation counts). Equal scores go to the earlier candidate, so the caller's order
/// (tightest first) breaks ties. Without expected requests, or when the policy's choice would
/// not hold the request in MiB, this is [`place`]'s best fit; what cannot be placed is refused
/// with [`place`]'s reason.
pub fn place_expecting(
    candidates: &[GpuSlot],
    request: &Request,
    expected: &[Request],
) -> Result<Placement, NoFit> {
    let fallback = place(candidates, request)?;
    if expected.is_empty() {
        return Ok(fallback);
    }
    Ok(fgd_cpu(candidates, request, expected).unwrap_or(fallback))
}

fn fgd_cpu(candidates: &[GpuSlot], request: &Request, expected: &[Request]) -> Option<Placement> {
    let unit_mb = candidates
        .iter()
        .map(|g| g.vram_mb)
        .max()
        .filter(|&v| v > 0)?;
    let demand = demand_of(request, unit_mb);
    // Nodes in the order of their first candidate, and each node's GPUs as candidate indices.
    let mut node_of: HashMap<u32, usize> = HashMap::new();
    let mut gpus_of: Vec<Vec<usize>> = Vec::new();
    for (i, g) in candidates.iter().enumerate() {
        let next = gpus_of.len();
        let n = *node_of.entry(g.node).or_insert(next);
        if n == next {
            gpus_of.push(Vec::new());
        }
        gpus_of[n].push(i);
    }
    let nodes = gpus_of
        .iter()
        .map(|slots| Node {
            name: String::new(),
            cpu_milli: 0,
            memory_mib: 0,
            model: None,
            cpu_free: 0,
            memory_free: 0,
            gpu_free: slots.iter().map(|&i| milli_free(&candidates[i])).collect(),
        })
        .collect();
    let cluster = Cluster {
        nodes,
        models: Vec::new(),
    };
    let mut counts: BTreeMap<(u32, u32), u64> = BTreeMap::new();
    for r in expected {
        let d = demand_of(r, unit_mb);
        *counts
            .entry((d.gpu_count(), d.per_gpu_milli()))
            .or_default() += 1;
    }
    let total = counts.values().sum::<u64>() as f64;
    let shapes = counts
        .into_iter()
        .filter(|&((count, _), _)| count > 0)
        .map(|((count, milli), n)| {
            let gpu = if milli < MILLI {
                GpuDemand::Share(milli)
            } else {
                GpuDemand::Whole(count)
            };
            let shape = Shape {
                cpu_milli: 0,
                gpu,
                models: None,
            };
            (shape, n as f64 / total)
        })
        .collect();
    let mut policy = FgdCpu::new(Workload { shapes }, cluster.nodes.len());
    let rank: Vec<u32> = (0..u32::try_from(cluster.nodes.len()).ok()?).collect();
    let pod = Pod {
        cpu_milli: 0,
        memory_mib: 0,
        gpu: demand,
        models: None,
    };
    // Ties never draw: the rank decides, so the stream is unused.
    let mut rng = SimRng::new(0);
    let a = schedule_with(
        &cluster,
        &pod,
        &mut policy,
        &mut rng,
        TieBreak::Ranked(&rank),
    )?;
    let slots = gpus_of.get(a.node)?;
    if let Request::Whole { count } = *request {
        // FGD chose the node; the GPUs on it come from one switch where one has enough.
        let free: Vec<usize> = slots
            .iter()
            .copied()
            .filter(|&i| candidates[i].is_whole_free() && candidates[i].vram_mb > 0)
            .collect();
        let gpus = pick_whole(candidates, &free, usize::try_from(count).ok()?)?;
        return Some(Placement {
            gpus: gpus
                .into_iter()
                .map(|i| (i, candidates[i].vram_mb))
                .collect(),
        });
    }
    let gpus: Option<Vec<(usize, u64)>> = a
        .gpus
        .iter()
        .map(|&g| {
            let i = *slots.get(g)?;
            let c = &candidates[i];
            match *request {
                Request::Share { vram_mb } => (c.free_mb >= vram_mb).then_some((i, vram_mb)),
                Request::Whole { .. } => c.is_whole_free().then_some((i, c.vram_mb)),
            }
        })
        .collect();
    Some(Placement { gpus: gpus? })
}

/// A GPU's free memory in milli-GPU, rounded down: a GPU is whole-free (1000) only when all
/// of its memory is.
fn milli_free(g: &GpuSlot) -> u32 {
    if g.vram_mb == 0 {
        return 0;
    }
    let m = g.free_mb.min(g.vram_mb) * u64::from(MILLI) / g.vram_mb;
    u32::try_from(m).unwrap_or(MILLI)
}

/// A request in milli-GPU of a GPU of `unit_mb`; a share rounds up, so that a share that fits
/// in milli fits in MiB, and a share of a whole GPU or more counts as one whole GPU.
fn demand_of(request: &Request, unit_mb: u64) -> GpuDemand {
    match *request {
        Request::Whole { count } => GpuDemand::Whole(count),
        Request::Share { vram_mb } => {
            let milli = (vram_mb * u64::from(MILLI)).div_ceil(unit_mb);
            match u32::try_from(milli) {
                Ok(m) if m < MILLI => GpuDemand::Share(m.max(1)),
                _ => GpuDemand::Whole(1),
            }
        }
    }
}

#[cfg(test)]
mod tests;
