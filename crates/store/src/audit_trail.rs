//! Verifies the whole retained audit trail, page by page, against the server's public key;
//! and what a record written in another transaction's commit carries.

use std::sync::Arc;

use gpurent_audit::{Entry, Signer, Verdict, Verifier};
use gpurent_types::api::Reservation;

use crate::{AuditFilter, AuditStore, CheckpointPolicy, Result};

/// A request's audit record, written by the store in the transaction of what the request
/// changed instead of afterwards by the trail's writer (`ReservationStore::reserve_recorded`):
/// one wait and one commit for both, and no moment in which one is kept without the other.
#[derive(Debug, Clone)]
pub struct RecordWithin {
    /// The record as the request's middleware began it; the store fills in the outcome and
    /// the allocation.
    pub entry: Entry,
    /// Signs a checkpoint when `policy` says one is due, as the writer's appends do.
    pub signer: Arc<Signer>,
    pub policy: CheckpointPolicy,
}

/// What a record names of a reservation: `ID 2x RTX4090 on box-1: GPU-a, GPU-b`, or
/// `ID 12 GB of 1x RTX4090 on ...` for a share.
pub fn allocation_of(r: &Reservation) -> String {
    let node = r.node.as_deref().unwrap_or("no node yet");
    let gpus = if r.gpus.is_empty() {
        String::new()
    } else {
        format!(": {}", r.gpus.join(", "))
    };
    let size = match r.vram_gb {
        Some(gb) => format!("{gb} GB of 1x {}", r.gpu_type),
        None => format!("{}x {}", r.gpu_count, r.gpu_type),
    };
    // A team's reservation names the team: the record's user is the member who acted.
    let team = r
        .team
        .as_ref()
        .map_or_else(String::new, |t| format!(" for team {t}"));
    format!("{} {size} on {node}{gpus}{team}", r.id)
}

/// Records read per page.
const PAGE: u32 = 10_000;

/// Walks every retained record in order (from the anchor, where older ones were pruned)
/// against the chain, the signed checkpoints and the head.
pub async fn verify_audit(store: &dyn AuditStore, public_key: &str) -> Result<Verdict> {
    let anchor = store.audit_anchor().await?;
    let checkpoints = store.audit_checkpoints().await?;
    let mut verifier = Verifier::new(public_key, checkpoints, anchor.as_ref());
    let all = AuditFilter::default();
    let mut after = anchor.as_ref().map_or(0, |a| a.seq);
    'pages: loop {
        let page = store.audit_records(&all, after, PAGE).await?;
        let Some(last) = page.last() else { break };
        after = last.seq;
        for r in &page {
            if !verifier.push(r) {
                // The first problem is named; the rest need not be read.
                break 'pages;
            }
        }
    }
    let (seq, hash) = store.audit_head().await?;
    Ok(verifier.finish(Some((seq, &hash))))
}
