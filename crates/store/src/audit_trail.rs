//! Verifies the whole retained audit trail, page by page, against the server's public key.

use gpurent_audit::{Verdict, Verifier};

use crate::{AuditFilter, AuditStore, Result};

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
