//! The VRAM watchdog's pure core: from each telemetry sample (its processes attributed to
//! reservations), the instances running and the time, what to report and what to stop.
//!
//! A share's processes together may use the share's memory (`Assignment::vram_mb`); a process
//! of an instance may be on its own GPUs only. A breach of either is reported at once and
//! stops the instance once it has lasted the grace; one that ends within the grace is
//! reported as over. A process of no instance on a GPU an instance holds is reported once.
//! Whole GPUs are not limited by memory (the card is theirs), but must stay on their GPUs.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use gpurent_types::agent::{AgentEvent, AgentEventKind, Assignment, NodeTelemetry};

/// What the agent does about one sample.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Reported to the control plane (`gpurent events`; a line in the reservation's log).
    Event(AgentEvent),
    /// The instance breached its share, or its GPUs, for the whole grace: stop it.
    Stop {
        reservation_id: String,
        epoch: i64,
        /// Why, in words (its log and its end say so).
        detail: String,
    },
}

/// A breach of one instance.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Breach {
    /// Its processes use more memory than its share.
    OverShare,
    /// It has processes on this GPU, which is not one of its own.
    Foreign(String),
}

/// A breach found in one sample.
struct Found {
    breach: Breach,
    /// The GPU it is on.
    gpu: String,
    detail: String,
}

/// The watchdog's memory between samples.
#[derive(Debug)]
pub struct Watchdog {
    grace: Duration,
    /// Breaches in their grace, since when, by (reservation, epoch).
    breaching: BTreeMap<(String, i64), BTreeMap<Breach, (Instant, String)>>,
    /// Instances the watchdog stopped: it says so once.
    stopped: BTreeSet<(String, i64)>,
    /// Processes of no instance on a rented GPU already reported, as (GPU, pid).
    unowned: BTreeSet<(String, u32)>,
}

impl Watchdog {
    /// `grace`: how long a breach may last before its instance is stopped (zero: at once).
    pub fn new(grace: Duration) -> Self {
        Watchdog {
            grace,
            breaching: BTreeMap::new(),
            stopped: BTreeSet::new(),
            unowned: BTreeSet::new(),
        }
    }

    /// Judges one sample taken at `now`. `running`: the instances that run now as their
    /// assignments say (those being stopped left out).
    pub fn check(
        &mut self,
        sample: &NodeTelemetry,
        running: &[Assignment],
        now: Instant,
    ) -> Vec<Verdict> {
        let mut verdicts = Vec::new();
        let live: BTreeSet<(String, i64)> = running
            .iter()
            .map(|a| (a.reservation_id.clone(), a.epoch))
            .collect();
        // What ran and ended meanwhile is forgotten.
        self.breaching.retain(|k, _| live.contains(k));
        self.stopped.retain(|k| live.contains(k));
        for a in running {
            let key = (a.reservation_id.clone(), a.epoch);
            if self.stopped.contains(&key) {
                continue;
            }
            let found = breaches(sample, a);
            let event = |kind, gpu: &str, detail: String| {
                Verdict::Event(AgentEvent {
                    kind,
                    reservation_id: Some(a.reservation_id.clone()),
                    gpu_uuid: gpu.to_owned(),
                    detail,
                })
            };
            let known = self.breaching.entry(key.clone()).or_default();
            // Breaches that ended within the grace.
            let mut ended = Vec::new();
            known.retain(|breach, (_, gpu)| {
                let still = found.iter().any(|f| &f.breach == breach);
                if !still {
                    ended.push((breach.clone(), gpu.clone()));
                }
                still
            });
            for (breach, gpu) in ended {
                let detail = match &breach {
                    Breach::OverShare => format!(
                        "GPU memory back within the share's {} MiB on {gpu}: the instance keeps running",
                        a.vram_mb.unwrap_or(0)
                    ),
                    Breach::Foreign(_) => {
                        format!("no process of the instance on {gpu} any more: it keeps running")
                    }
                };
                verdicts.push(event(AgentEventKind::VramBackUnder, &gpu, detail));
            }
            let mut stop = None;
            for f in found {
                let since = match known.get(&f.breach) {
                    Some((since, _)) => *since,
                    None => {
                        let kind = match f.breach {
                            Breach::OverShare => AgentEventKind::VramOverShare,
                            Breach::Foreign(_) => AgentEventKind::ForeignGpu,
                        };
                        let detail = format!(
                            "{}; the instance is stopped if this lasts {} s",
                            f.detail,
                            self.grace.as_secs()
                        );
                        verdicts.push(event(kind, &f.gpu, detail));
                        known.insert(f.breach.clone(), (now, f.gpu.clone()));
                        now
                    }
                };
                if stop.is_none() && now.saturating_duration_since(since) >= self.grace {
                    stop = Some(f);
                }
            }
            if let Some(f) = stop {
                // The stop's reason, kept as its `end_message` (and so in its log).
                let detail = format!("{} for {} s, the grace", f.detail, self.grace.as_secs());
                verdicts.push(event(
                    AgentEventKind::VramExceeded,
                    &f.gpu,
                    format!("stopped (vram_exceeded): {detail}"),
                ));
                verdicts.push(Verdict::Stop {
                    reservation_id: a.reservation_id.clone(),
                    epoch: a.epoch,
                    detail,
                });
                self.breaching.remove(&key);
                self.stopped.insert(key);
            }
        }
        verdicts.extend(self.unowned_processes(sample, running));
        verdicts
    }

    /// Processes of no instance on GPUs instances hold, each reported once while it lasts.
    fn unowned_processes(
        &mut self,
        sample: &NodeTelemetry,
        running: &[Assignment],
    ) -> Vec<Verdict> {
        let mut verdicts = Vec::new();
        let mut present = BTreeSet::new();
        for gpu in &sample.gpus {
            let holders: Vec<&str> = running
                .iter()
                .filter(|a| a.gpus.contains(&gpu.uuid))
                .map(|a| a.reservation_id.as_str())
                .collect();
            if holders.is_empty() {
                continue;
            }
            for p in gpu.processes.iter().filter(|p| p.reservation_id.is_none()) {
                let key = (gpu.uuid.clone(), p.pid);
                present.insert(key.clone());
                if self.unowned.insert(key) {
                    verdicts.push(Verdict::Event(AgentEvent {
                        kind: AgentEventKind::UnownedGpuProcess,
                        reservation_id: None,
                        gpu_uuid: gpu.uuid.clone(),
                        detail: format!(
                            "process {} of no instance uses {} MiB on {}, which {} rents",
                            p.pid,
                            p.used_mb,
                            gpu.uuid,
                            holders.join(", ")
                        ),
                    }));
                }
            }
        }
        // A process gone is forgotten (its pid may come back as another).
        self.unowned.retain(|k| present.contains(k));
        verdicts
    }
}

/// The breaches of one instance in one sample.
fn breaches(sample: &NodeTelemetry, a: &Assignment) -> Vec<Found> {
    let mine = |p: &&gpurent_types::agent::GpuProcess| {
        p.reservation_id.as_deref() == Some(a.reservation_id.as_str())
    };
    let mut found = Vec::new();
    let mut own_mb = 0u64;
    let mut own_gpu = None;
    for gpu in &sample.gpus {
        let procs: Vec<_> = gpu.processes.iter().filter(mine).collect();
        if procs.is_empty() {
            continue;
        }
        let used: u64 = procs.iter().map(|p| p.used_mb).sum();
        if a.gpus.contains(&gpu.uuid) {
            own_mb = own_mb.saturating_add(used);
            own_gpu.get_or_insert(gpu.uuid.as_str());
        } else {
            let pids: Vec<String> = procs.iter().map(|p| p.pid.to_string()).collect();
            found.push(Found {
                breach: Breach::Foreign(gpu.uuid.clone()),
                gpu: gpu.uuid.clone(),
                detail: format!(
                    "process {} of the instance uses {used} MiB on {}, which is not its GPU",
                    pids.join(", "),
                    gpu.uuid
                ),
            });
        }
    }
    if let Some(share) = a.vram_mb.filter(|share| own_mb > *share) {
        let gpu = own_gpu
            .or(a.gpus.first().map(String::as_str))
            .unwrap_or_default()
            .to_owned();
        found.insert(
            0,
            Found {
                breach: Breach::OverShare,
                detail: format!("GPU memory {own_mb} MiB on {gpu}, over the share's {share} MiB"),
                gpu,
            },
        );
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpurent_types::agent::{GpuProcess, GpuSample};
    use proptest::prelude::*;

    const GPU: &str = "GPU-h200";
    const OTHER: &str = "GPU-other";
    const GRACE: Duration = Duration::from_secs(10);

    fn share(id: &str, gpu: &str, vram_mb: Option<u64>) -> Assignment {
        Assignment {
            reservation_id: id.to_owned(),
            epoch: 1,
            restart_count: 0,
            array_index: None,
            gpus: vec![gpu.to_owned()],
            vram_mb,
            image: None,
            command: vec![],
            env: Default::default(),
            run: true,
            log_offset: 0,
            stop_grace_s: None,
            checkpoint: false,
            secrets: Default::default(),
            sealed_secrets: None,
            ports: vec![],
            mounts: Vec::new(),
        }
    }

    /// A sample of both GPUs with these processes, as (GPU, pid, MiB, reservation).
    fn sample(procs: &[(&str, u32, u64, Option<&str>)]) -> NodeTelemetry {
        let gpu = |uuid: &str| GpuSample {
            uuid: uuid.to_owned(),
            utilization_pct: 0,
            memory_used_mb: 0,
            temperature_c: 40,
            power_mw: 0,
            ecc_uncorrected: 0,
            memory_total_mb: 143_771,
            xid_errors: vec![],
            lost: false,
            processes: procs
                .iter()
                .filter(|p| p.0 == uuid)
                .map(|&(_, pid, used_mb, r)| GpuProcess {
                    pid,
                    used_mb,
                    reservation_id: r.map(str::to_owned),
                })
                .collect(),
        };
        NodeTelemetry {
            gpus: vec![gpu(GPU), gpu(OTHER)],
            ..NodeTelemetry::default()
        }
    }

    fn kinds(v: &[Verdict]) -> Vec<(AgentEventKind, Option<&str>)> {
        v.iter()
            .filter_map(|v| match v {
                Verdict::Event(e) => Some((e.kind, e.reservation_id.as_deref())),
                Verdict::Stop { .. } => None,
            })
            .collect()
    }

    fn stops(v: &[Verdict]) -> Vec<&str> {
        v.iter()
            .filter_map(|v| match v {
                Verdict::Stop { reservation_id, .. } => Some(reservation_id.as_str()),
                Verdict::Event(_) => None,
            })
            .collect()
    }

    #[test]
    fn a_share_over_its_memory_is_stopped_when_the_grace_is_over_and_its_neighbour_is_not() {
        let mut w = Watchdog::new(GRACE);
        let t0 = Instant::now();
        let running = [share("a", GPU, Some(40_960)), share("b", GPU, Some(40_960))];
        // a: two processes, 50 GiB together; b: within its share.
        let over = sample(&[
            (GPU, 10, 30_000, Some("a")),
            (GPU, 11, 21_000, Some("a")),
            (GPU, 20, 40_960, Some("b")),
        ]);
        let v = w.check(&over, &running, t0);
        assert_eq!(kinds(&v), vec![(AgentEventKind::VramOverShare, Some("a"))]);
        let Verdict::Event(e) = &v[0] else {
            panic!("{v:?}")
        };
        assert_eq!(e.gpu_uuid, GPU);
        assert!(e.detail.contains("51000 MiB"), "{}", e.detail);
        assert!(e.detail.contains("40960 MiB"), "{}", e.detail);
        // Within the grace: nothing new, the breach is known.
        let v = w.check(&over, &running, t0 + GRACE - Duration::from_millis(1));
        assert_eq!(v, vec![]);
        // The grace is over exactly now: stopped.
        let v = w.check(&over, &running, t0 + GRACE);
        assert_eq!(kinds(&v), vec![(AgentEventKind::VramExceeded, Some("a"))]);
        assert_eq!(stops(&v), vec!["a"]);
        // Said once, even while it is still seen running (its stop takes a moment).
        let v = w.check(&over, &running, t0 + GRACE * 2);
        assert_eq!(v, vec![]);
    }

    #[test]
    fn a_share_back_under_within_the_grace_recovers_and_a_new_breach_starts_a_new_grace() {
        let mut w = Watchdog::new(GRACE);
        let t0 = Instant::now();
        let running = [share("a", GPU, Some(1000))];
        let over = sample(&[(GPU, 10, 1001, Some("a"))]);
        let at = sample(&[(GPU, 10, 1000, Some("a"))]);
        assert_eq!(
            kinds(&w.check(&over, &running, t0)),
            vec![(AgentEventKind::VramOverShare, Some("a"))]
        );
        // Exactly its share is within it.
        let v = w.check(&at, &running, t0 + Duration::from_secs(9));
        assert_eq!(kinds(&v), vec![(AgentEventKind::VramBackUnder, Some("a"))]);
        assert_eq!(stops(&v), Vec::<&str>::new());
        let t1 = t0 + Duration::from_secs(15);
        assert_eq!(
            kinds(&w.check(&over, &running, t1)),
            vec![(AgentEventKind::VramOverShare, Some("a"))]
        );
        // Measured from the new breach, not the first.
        assert_eq!(
            w.check(&over, &running, t1 + Duration::from_secs(9)),
            vec![]
        );
        assert_eq!(stops(&w.check(&over, &running, t1 + GRACE)), vec!["a"]);
    }

    #[test]
    fn a_zero_grace_stops_at_once() {
        let mut w = Watchdog::new(Duration::ZERO);
        let v = w.check(
            &sample(&[(GPU, 10, 2000, Some("a"))]),
            &[share("a", GPU, Some(1000))],
            Instant::now(),
        );
        assert_eq!(
            kinds(&v),
            vec![
                (AgentEventKind::VramOverShare, Some("a")),
                (AgentEventKind::VramExceeded, Some("a"))
            ]
        );
        assert_eq!(stops(&v), vec!["a"]);
    }

    #[test]
    fn whole_gpus_have_no_memory_limit_but_a_process_on_a_foreign_gpu_is_stopped_after_the_grace() {
        let mut w = Watchdog::new(GRACE);
        let t0 = Instant::now();
        let running = [share("whole", GPU, None), share("n", OTHER, Some(1000))];
        let escaped = sample(&[
            (GPU, 10, 143_000, Some("whole")),
            (OTHER, 11, 500, Some("whole")),
            (OTHER, 12, 100, Some("n")),
        ]);
        let v = w.check(&escaped, &running, t0);
        assert_eq!(kinds(&v), vec![(AgentEventKind::ForeignGpu, Some("whole"))]);
        let Verdict::Event(e) = &v[0] else {
            panic!("{v:?}")
        };
        assert_eq!(e.gpu_uuid, OTHER);
        assert!(e.detail.contains("process 11 "), "{}", e.detail);
        let v = w.check(&escaped, &running, t0 + GRACE);
        assert_eq!(
            kinds(&v),
            vec![(AgentEventKind::VramExceeded, Some("whole"))]
        );
        assert_eq!(stops(&v), vec!["whole"]);
    }

    #[test]
    fn a_process_that_leaves_a_foreign_gpu_within_the_grace_is_forgiven() {
        let mut w = Watchdog::new(GRACE);
        let t0 = Instant::now();
        let running = [share("a", GPU, Some(1000))];
        w.check(&sample(&[(OTHER, 11, 10, Some("a"))]), &running, t0);
        let v = w.check(
            &sample(&[(GPU, 11, 10, Some("a"))]),
            &running,
            t0 + GRACE / 2,
        );
        assert_eq!(kinds(&v), vec![(AgentEventKind::VramBackUnder, Some("a"))]);
        assert_eq!(
            w.check(
                &sample(&[(GPU, 11, 10, Some("a"))]),
                &running,
                t0 + GRACE * 2
            ),
            vec![]
        );
    }

    #[test]
    fn a_process_of_no_instance_on_a_rented_gpu_is_reported_once_per_pid() {
        let mut w = Watchdog::new(GRACE);
        let t0 = Instant::now();
        let running = [share("a", GPU, Some(1000))];
        // pid 30 on a GPU nobody rents is the host's business.
        let host = sample(&[(GPU, 30, 700, None), (OTHER, 31, 700, None)]);
        let v = w.check(&host, &running, t0);
        assert_eq!(kinds(&v), vec![(AgentEventKind::UnownedGpuProcess, None)]);
        let Verdict::Event(e) = &v[0] else {
            panic!("{v:?}")
        };
        assert_eq!(e.gpu_uuid, GPU);
        assert!(
            e.detail.starts_with("process 30 ") && e.detail.ends_with("which a rents"),
            "{}",
            e.detail
        );
        for s in 1..5 {
            assert_eq!(
                w.check(&host, &running, t0 + Duration::from_secs(s)),
                vec![]
            );
        }
        // Another pid is another event; a pid that went and came back is a new process.
        let two = sample(&[(GPU, 30, 700, None), (GPU, 32, 1, None)]);
        assert_eq!(w.check(&two, &running, t0).len(), 1);
        w.check(&sample(&[]), &running, t0);
        assert_eq!(w.check(&two, &running, t0).len(), 2);
        // Nobody rents it any more: nothing to say.
        assert_eq!(w.check(&sample(&[(GPU, 33, 1, None)]), &[], t0), vec![]);
    }

    #[test]
    fn an_instance_gone_or_of_a_new_epoch_starts_afresh() {
        let mut w = Watchdog::new(GRACE);
        let t0 = Instant::now();
        let a = share("a", GPU, Some(1000));
        let over = sample(&[(GPU, 10, 2000, Some("a"))]);
        w.check(&over, std::slice::from_ref(&a), t0);
        assert_eq!(
            stops(&w.check(&over, std::slice::from_ref(&a), t0 + GRACE)),
            vec!["a"]
        );
        // Its next epoch (rescheduled) gets a grace of its own.
        let mut next = a.clone();
        next.epoch = 2;
        let v = w.check(&over, std::slice::from_ref(&next), t0 + GRACE * 2);
        assert_eq!(kinds(&v), vec![(AgentEventKind::VramOverShare, Some("a"))]);
        // Not running (being stopped by the control plane): its breach is forgotten.
        w.check(&over, &[], t0 + GRACE * 3);
        let v = w.check(&over, std::slice::from_ref(&next), t0 + GRACE * 3);
        assert_eq!(stops(&v), Vec::<&str>::new());
    }

    proptest! {
        /// Over a run of samples of one share: it is stopped exactly when it has been over in
        /// every sample of the last grace (or longer), once, and every breach reported before.
        #[test]
        fn a_share_is_stopped_exactly_when_over_for_the_whole_grace(
            steps in proptest::collection::vec((0u64..6, any::<bool>()), 1..40),
        ) {
            let grace = Duration::from_secs(5);
            let mut w = Watchdog::new(grace);
            let running = [share("a", GPU, Some(100))];
            let t0 = Instant::now();
            let mut t = t0;
            let mut over_since: Option<Instant> = None;
            let mut stopped = false;
            let mut in_breach = false;
            for (dt, over) in steps {
                t += Duration::from_secs(dt);
                let used = if over { 101 } else { 100 };
                let v = w.check(&sample(&[(GPU, 1, used, Some("a"))]), &running, t);
                let k = kinds(&v);
                if stopped {
                    prop_assert!(v.is_empty(), "{v:?} after the stop");
                    continue;
                }
                over_since = if over { over_since.or(Some(t)) } else { None };
                let expect_stop = over_since.is_some_and(|s| t - s >= grace);
                prop_assert_eq!(stops(&v).len(), usize::from(expect_stop));
                if over && !in_breach {
                    prop_assert!(k.contains(&(AgentEventKind::VramOverShare, Some("a"))));
                }
                if !over && in_breach {
                    prop_assert_eq!(k, vec![(AgentEventKind::VramBackUnder, Some("a"))]);
                }
                in_breach = over;
                stopped = expect_stop;
            }
        }
    }
}
