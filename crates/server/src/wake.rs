//! Wakes agents' long-polls when their node's desired state changes in this replica, and the
//! scheduling pass when capacity may have been freed. Changes made by another replica are seen
//! by the version watch (`jobs/versions.rs`, within a second) and the next maintenance tick.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

#[derive(Debug, Default)]
pub struct NodeWakers {
    nodes: Mutex<HashMap<String, Arc<Notify>>>,
    shutting_down: AtomicBool,
    scheduler: Notify,
}

impl NodeWakers {
    pub fn for_node(&self, node_id: &str) -> Arc<Notify> {
        let mut nodes = self.nodes.lock().unwrap_or_else(|p| p.into_inner());
        nodes.entry(node_id.to_owned()).or_default().clone()
    }

    pub fn wake(&self, node_id: &str) {
        let nodes = self.nodes.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = nodes.get(node_id) {
            n.notify_waiters();
        }
    }

    /// Asks for a scheduling pass soon: a stop, an end or new GPUs may let queued work fit.
    /// Wake-ups before the pass runs coalesce into one.
    pub fn wake_scheduler(&self) {
        self.scheduler.notify_one();
    }

    /// Resolves at the next [`NodeWakers::wake_scheduler`] (or one made since the last pass).
    pub async fn scheduler_woken(&self) {
        self.scheduler.notified().await;
    }

    /// Wakes every waiting sync for good: the server is shutting down.
    pub fn wake_all(&self) {
        self.shutting_down.store(true, Ordering::SeqCst);
        let nodes = self.nodes.lock().unwrap_or_else(|p| p.into_inner());
        for n in nodes.values() {
            n.notify_waiters();
        }
    }

    pub fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::SeqCst)
    }
}
