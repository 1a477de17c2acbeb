//! How many sessions (SSH session channels, web console terminals) and forwarded connections
//! each reservation has open on this replica, capped ([`SessionCaps`]), and counted for
//! `/metrics`.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use crate::metrics::{Metrics, SshCounts};

/// Caps per reservation.
#[derive(Debug, Clone, Copy)]
pub struct SessionCaps {
    /// Shells, commands and SFTP sessions at once.
    pub sessions: usize,
    /// Forwarded TCP connections at once (a browser through `ssh -L` opens many).
    pub forwards: usize,
}

impl Default for SessionCaps {
    fn default() -> Self {
        SessionCaps {
            sessions: 16,
            forwards: 256,
        }
    }
}

#[derive(Debug, Default, Clone, Copy)]
struct Open {
    sessions: usize,
    forwards: usize,
}

/// The open sessions of this replica, by reservation: one table for the SSH endpoint and
/// the web console (`AppState::sessions`), so a reservation's cap holds across both.
#[derive(Debug)]
pub struct Sessions {
    caps: Mutex<SessionCaps>,
    open: Mutex<HashMap<String, Open>>,
    metrics: Arc<Metrics>,
}

/// An open channel; dropping it frees its place.
#[derive(Debug)]
pub struct Slot {
    sessions: Arc<Sessions>,
    reservation: String,
    forward: bool,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let ssh = &self.sessions.metrics.ssh;
        SshCounts::down(if self.forward {
            &ssh.forwards
        } else {
            &ssh.sessions
        });
        let mut open = self.sessions.lock();
        if let Some(o) = open.get_mut(&self.reservation) {
            if self.forward {
                o.forwards = o.forwards.saturating_sub(1);
            } else {
                o.sessions = o.sessions.saturating_sub(1);
            }
            if o.sessions == 0 && o.forwards == 0 {
                open.remove(&self.reservation);
            }
        }
    }
}

impl Sessions {
    pub fn new(caps: SessionCaps, metrics: Arc<Metrics>) -> Arc<Sessions> {
        Arc::new(Sessions {
            caps: Mutex::new(caps),
            open: Mutex::default(),
            metrics,
        })
    }

    /// The SSH endpoint's limits apply to every session of the replica from now on (places
    /// taken stay taken).
    pub fn set_caps(&self, caps: SessionCaps) {
        *self.caps.lock().unwrap_or_else(|e| e.into_inner()) = caps;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Open>> {
        self.open.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A place for a session channel, unless the reservation has its cap open.
    pub fn session(self: &Arc<Self>, reservation: &str) -> Option<Slot> {
        self.take(reservation, false)
    }

    /// A place for a forwarded connection, unless the reservation has its cap open.
    pub fn forward(self: &Arc<Self>, reservation: &str) -> Option<Slot> {
        self.take(reservation, true)
    }

    fn take(self: &Arc<Self>, reservation: &str, forward: bool) -> Option<Slot> {
        let caps = *self.caps.lock().unwrap_or_else(|e| e.into_inner());
        let mut open = self.lock();
        let o = open.entry(reservation.to_owned()).or_default();
        if forward {
            if o.forwards >= caps.forwards {
                return None;
            }
            o.forwards += 1;
        } else {
            if o.sessions >= caps.sessions {
                return None;
            }
            o.sessions += 1;
        }
        let ssh = &self.metrics.ssh;
        if forward {
            &ssh.forwards
        } else {
            &ssh.sessions
        }
        .fetch_add(1, Ordering::Relaxed);
        Some(Slot {
            sessions: self.clone(),
            reservation: reservation.to_owned(),
            forward,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_holds_and_a_dropped_slot_frees_its_place() {
        let metrics = Arc::new(Metrics::default());
        let s = Sessions::new(
            SessionCaps {
                sessions: 2,
                forwards: 1,
            },
            metrics.clone(),
        );
        let a = s.session("r1").unwrap();
        let _b = s.session("r1").unwrap();
        assert!(s.session("r1").is_none());
        assert!(
            s.session("r2").is_some(),
            "another reservation has its own cap"
        );
        let _f = s.forward("r1").unwrap();
        assert!(s.forward("r1").is_none());
        drop(a);
        assert!(s.session("r1").is_some());
        assert_eq!(metrics.ssh.sessions.load(Ordering::Relaxed), 1);
        assert_eq!(metrics.ssh.forwards.load(Ordering::Relaxed), 1);
    }
}
