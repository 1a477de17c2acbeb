//! Wakes agents' long-polls when their node's desired state changes in this replica.
//! Changes made by another replica are seen at the next periodic version check.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

#[derive(Debug, Default)]
pub struct NodeWakers {
    nodes: Mutex<HashMap<String, Arc<Notify>>>,
    shutting_down: AtomicBool,
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
