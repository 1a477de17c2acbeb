//! Pure GPU placement: given the free capacity of the candidate GPUs and a request, which GPUs
//! (or which share of one) it gets. No I/O: the store reads candidates and commits the choice
//! with a compare-and-set, so a placement computed from a stale view can never double-book.

pub mod array;
pub mod autoscale;
mod best_fit;
pub mod cluster;
pub mod elastic;
pub mod experiment;
pub mod fair_share;
pub mod gang;
mod live;
pub mod plan;
pub mod policies;
mod preempt;
pub mod queue;
pub mod quota;
pub mod replay;
pub mod restart;
pub mod rng;
pub mod trace;
pub mod workload;

pub use best_fit::place;
pub use live::place_expecting;
pub use plan::{plan, preferred_order, Ask, Plan};
pub use preempt::{choose_victims, Victim};

/// One candidate GPU as the placer sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuSlot {
    /// Which node the GPU is in; GPUs of one node share this number.
    pub node: u32,
    pub vram_mb: u64,
    pub free_mb: u64,
    /// GPUs of a node with the same number share a PCIe switch; `None` where unknown. Whole
    /// GPUs for one request come from one switch when one has enough.
    pub switch: Option<u32>,
}

impl GpuSlot {
    pub fn is_whole_free(&self) -> bool {
        self.free_mb == self.vram_mb
    }
}

/// What a reservation asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Request {
    /// `count` whole GPUs on one node.
    Whole { count: u32 },
    /// A share of one GPU with this much memory.
    Share { vram_mb: u64 },
}

/// Indices into the candidate slice, with the memory taken from each.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    pub gpus: Vec<(usize, u64)>,
}

/// Why a request could not be placed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NoFit {
    #[error("asked for {wanted} whole GPUs on one node; the most free on any node is {most_on_one_node}")]
    NotEnoughOnOneNode { wanted: u32, most_on_one_node: u32 },
    #[error("no GPU has {wanted_mb} MiB of memory free")]
    NoShare { wanted_mb: u64 },
    #[error("a request for zero GPUs or zero memory cannot be placed")]
    Empty,
}
