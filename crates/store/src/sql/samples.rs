//! Which syncs write the node's latest telemetry into its row: one whose sample says something
//! new (a GPU's utilisation, memory, processes or errors, a lost GPU, the driver, a burn-in, the
//! CPU's figure in another ten), or the first after `REFRESH_MICROS`; temperatures, power and a
//! few points of CPU alone wait for the refresh. An idle node's heartbeat then writes a small
//! row: no sample to send, compress (PostgreSQL's TOAST) and log. Each replica remembers what it
//! wrote; where a node's syncs reach several replicas, the row may lag by one refresh at most.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Mutex;

use gpurent_types::agent::NodeTelemetry;

/// The longest a node's stored sample goes without being written again, in microseconds.
const REFRESH_MICROS: i64 = 30_000_000;

/// What each node's last written sample said, and when it was written.
#[derive(Debug, Default)]
pub(super) struct LatestSamples {
    written: Mutex<HashMap<String, Written>>,
}

#[derive(Debug, Clone, Copy)]
struct Written {
    digest: u64,
    at: i64,
}

/// A sample to write with a sync, and what to remember once it is written.
#[derive(Debug)]
pub(super) struct Due {
    pub(super) json: String,
    digest: u64,
}

impl LatestSamples {
    /// The sample to write with this sync at `at`, if it says something new or is due.
    pub(super) fn due(&self, node_id: &str, t: Option<&NodeTelemetry>, at: i64) -> Option<Due> {
        let t = t?;
        let digest = digest(t);
        let last = self.lock().get(node_id).copied();
        let fresh = last.is_some_and(|w| w.digest == digest && at - w.at < REFRESH_MICROS);
        if fresh {
            return None;
        }
        Some(Due {
            json: serde_json::to_string(t).ok()?,
            digest,
        })
    }

    /// Remembers what was written at `at` (called once its statement succeeded).
    pub(super) fn written(&self, node_id: &str, due: &Due, at: i64) {
        let w = Written {
            digest: due.digest,
            at,
        };
        let mut written = self.lock();
        match written.get_mut(node_id) {
            Some(last) => *last = w,
            None => {
                written.insert(node_id.to_owned(), w);
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Written>> {
        // Nothing panics while the lock is held; a poisoned one holds consistent data.
        self.written.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// What a sample says, less its temperatures, power draws and the CPU's last few points.
fn digest(t: &NodeTelemetry) -> u64 {
    let mut h = DefaultHasher::new();
    t.cpu_utilization_pct.map(|pct| pct / 10).hash(&mut h);
    t.driver_version.hash(&mut h);
    t.cuda_version.hash(&mut h);
    // Rare (a burn-in running or failed): its JSON stands for it.
    t.burn_in
        .as_ref()
        .map(|b| serde_json::to_string(b).unwrap_or_default())
        .hash(&mut h);
    t.gpus.len().hash(&mut h);
    for g in &t.gpus {
        g.uuid.hash(&mut h);
        g.utilization_pct.hash(&mut h);
        g.memory_used_mb.hash(&mut h);
        g.memory_total_mb.hash(&mut h);
        g.ecc_uncorrected.hash(&mut h);
        g.xid_errors.hash(&mut h);
        g.lost.hash(&mut h);
        g.processes.len().hash(&mut h);
        for p in &g.processes {
            p.pid.hash(&mut h);
            p.used_mb.hash(&mut h);
            p.reservation_id.hash(&mut h);
        }
    }
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpurent_types::agent::GpuSample;

    fn sample(util: u32, temperature_c: u32) -> NodeTelemetry {
        NodeTelemetry {
            gpus: vec![GpuSample {
                uuid: "GPU-0".into(),
                utilization_pct: util,
                memory_used_mb: 1,
                temperature_c,
                power_mw: 21_000,
                ecc_uncorrected: 0,
                memory_total_mb: 24_564,
                xid_errors: Vec::new(),
                lost: false,
                processes: Vec::new(),
            }],
            ..NodeTelemetry::default()
        }
    }

    fn write(l: &LatestSamples, t: &NodeTelemetry, at: i64) -> bool {
        match l.due("n1", Some(t), at) {
            Some(due) => {
                l.written("n1", &due, at);
                true
            }
            None => false,
        }
    }

    #[test]
    fn a_sample_is_written_when_it_says_something_new_or_is_due() {
        let l = LatestSamples::default();
        assert!(write(&l, &sample(0, 34), 0), "the first");
        assert!(!write(&l, &sample(0, 34), 1_000_000), "the same again");
        assert!(!write(&l, &sample(0, 35), 2_000_000), "only warmer");
        let mut cpu = sample(0, 35);
        cpu.cpu_utilization_pct = Some(12);
        assert!(write(&l, &cpu, 2_000_000), "the CPU's figure, first given");
        cpu.cpu_utilization_pct = Some(17);
        assert!(!write(&l, &cpu, 2_000_000), "a few points");
        cpu.cpu_utilization_pct = Some(90);
        assert!(write(&l, &cpu, 2_000_000), "busy CPUs");
        assert!(write(&l, &sample(40, 35), 3_000_000), "a busy GPU");
        assert!(!write(&l, &sample(40, 36), 3_000_000 + REFRESH_MICROS - 1));
        assert!(
            write(&l, &sample(40, 36), 3_000_000 + REFRESH_MICROS),
            "the refresh"
        );
        assert!(
            l.due("n1", None, 0).is_none(),
            "no sample, nothing to write"
        );
        assert!(
            l.due("n2", Some(&sample(40, 36)), 0).is_some(),
            "another node"
        );
    }

    #[test]
    fn a_sample_not_written_is_not_remembered() {
        let l = LatestSamples::default();
        assert!(l.due("n1", Some(&sample(0, 34)), 0).is_some());
        // Its statement failed: the next sync writes it.
        assert!(l.due("n1", Some(&sample(0, 34)), 1).is_some());
    }
}
