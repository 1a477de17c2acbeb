//! The node's CPU utilisation for its telemetry: the busy share of the CPU time counted in
//! `/proc/stat` between two samples (the parser is pure and tested on captured text).

use std::path::PathBuf;

/// Where the agent's CPU figure comes from.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum CpuSource {
    /// Deltas of `/proc/stat` between heartbeats (Linux).
    #[default]
    ProcStat,
    /// A fixed figure in percent (simulated nodes, tests).
    Fixed(u32),
    /// None reported.
    Off,
}

/// The aggregate `cpu` line of `/proc/stat`, in clock ticks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuTimes {
    /// Ticks doing anything but idling or waiting for I/O.
    pub busy: u64,
    /// All ticks (user, nice, system, idle, iowait, irq, softirq, steal; guest time is
    /// already counted in user and nice).
    pub total: u64,
}

/// Reads the aggregate `cpu` line of `/proc/stat` text; `None` when there is none or it is
/// malformed.
pub fn parse_proc_stat(text: &str) -> Option<CpuTimes> {
    let line = text
        .lines()
        .find(|l| l.split_whitespace().next() == Some("cpu"))?;
    let fields: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .take(8)
        .map(str::parse)
        .collect::<Result<_, _>>()
        .ok()?;
    // Kernels before 2.6.11 lacked steal (and before 2.6 iowait, irq, softirq): at least user,
    // nice, system, idle.
    if fields.len() < 4 {
        return None;
    }
    let idle = fields[3] + fields.get(4).copied().unwrap_or(0);
    let total: u64 = fields.iter().sum();
    Some(CpuTimes {
        busy: total.saturating_sub(idle),
        total,
    })
}

/// Busy percent between two samples, rounded; `None` when no time passed (or the counters went
/// back, as after a restore).
pub fn utilization_pct(before: CpuTimes, after: CpuTimes) -> Option<u32> {
    let total = after.total.checked_sub(before.total)?;
    let busy = after.busy.checked_sub(before.busy)?;
    if total == 0 || busy > total {
        return None;
    }
    u32::try_from((busy * 100 + total / 2) / total).ok()
}

/// Remembers the last reading, so that each sample covers the time since the previous one.
#[derive(Debug)]
pub struct CpuSampler {
    source: CpuSource,
    path: PathBuf,
    last: Option<CpuTimes>,
    warned: bool,
}

impl CpuSampler {
    pub fn new(source: CpuSource) -> Self {
        CpuSampler {
            source,
            path: PathBuf::from("/proc/stat"),
            last: None,
            warned: false,
        }
    }

    /// The utilisation since the last call (none on the first: no interval yet).
    pub fn sample(&mut self) -> Option<u32> {
        match self.source {
            CpuSource::Off => None,
            CpuSource::Fixed(pct) => Some(pct.min(100)),
            CpuSource::ProcStat => {
                let now = match std::fs::read_to_string(&self.path) {
                    Ok(text) => parse_proc_stat(&text),
                    Err(e) => {
                        if !self.warned {
                            tracing::warn!(path = %self.path.display(), error = %e, "cannot read CPU times; no CPU utilisation in telemetry");
                            self.warned = true;
                        }
                        None
                    }
                };
                let before = std::mem::replace(&mut self.last, now);
                utilization_pct(before?, now?)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Captured from a 2-CPU Linux 6.x machine, a few seconds apart.
    const BEFORE: &str = "cpu  1384850 50143 359858 2088645 16584 0 9517 349 0 0
cpu0 648743 24804 152335 1118076 5777 0 3664 171 0 0
cpu1 736106 25338 207522 970569 10807 0 5853 177 0 0
intr 25624530 0 0 0 0
ctxt 61234567
btime 1764470000
processes 123456
procs_running 3
procs_blocked 0
softirq 1234 0 1 2 3 4 5 6 7 8 9
";
    const AFTER: &str = "cpu  1385150 50143 359958 2088745 16584 0 9517 349 0 0
cpu0 648893 24804 152385 1118126 5777 0 3664 171 0 0
cpu1 736256 25338 207572 970619 10807 0 5853 177 0 0
intr 25625530 0 0 0 0
";

    #[test]
    fn parses_the_aggregate_line() {
        let t = parse_proc_stat(BEFORE);
        let total = 1384850 + 50143 + 359858 + 2088645 + 16584 + 9517 + 349;
        assert_eq!(
            t,
            Some(CpuTimes {
                busy: total - 2088645 - 16584,
                total
            })
        );
    }

    #[test]
    fn utilisation_is_the_busy_share_of_the_delta() {
        let (Some(a), Some(b)) = (parse_proc_stat(BEFORE), parse_proc_stat(AFTER)) else {
            panic!("unparsed");
        };
        // 300 user + 100 system busy, 100 idle: 80%.
        assert_eq!(utilization_pct(a, b), Some(80));
        assert_eq!(utilization_pct(a, a), None, "no time passed");
        assert_eq!(utilization_pct(b, a), None, "counters went back");
    }

    #[test]
    fn old_kernels_and_garbage() {
        assert_eq!(
            parse_proc_stat("cpu 10 0 10 80\n"),
            Some(CpuTimes {
                busy: 20,
                total: 100
            })
        );
        for bad in [
            "",
            "cpu0 1 2 3 4\n",
            "cpu 1 2 x 4\n",
            "cpu 1 2\n",
            "intr 1 2 3 4 5\n",
        ] {
            assert_eq!(parse_proc_stat(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn sampler_needs_two_readings_and_fixed_is_fixed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("stat");
        let mut s = CpuSampler::new(CpuSource::ProcStat);
        s.path = path.clone();
        std::fs::write(&path, BEFORE).expect("write");
        assert_eq!(s.sample(), None);
        std::fs::write(&path, AFTER).expect("write");
        assert_eq!(s.sample(), Some(80));
        assert_eq!(CpuSampler::new(CpuSource::Fixed(250)).sample(), Some(100));
        assert_eq!(CpuSampler::new(CpuSource::Off).sample(), None);
    }
}
