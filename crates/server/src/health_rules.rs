//! GPU health rules: each GPU's latest sample judged against the owner's thresholds, with the
//! seeds' defaults (85 °C, VRAM 95% full), uncorrected ECC errors, critical XID events and a
//! GPU fallen off the bus. A node with a GPU in breach is `unhealthy` and gets no new work
//! until every GPU passes again.

use gpurent_types::agent::{BurnInState, GpuSample};
use gpurent_types::api::HealthIssue;

/// The thresholds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthRules {
    /// At or above this temperature a GPU is too hot.
    pub max_temperature_c: u32,
    /// At or above this share of its memory in use a GPU takes no more work, in percent.
    pub max_vram_pct: u32,
    /// XID codes that mean the GPU needs attention (NVIDIA's list of critical XIDs: 48 double-bit
    /// ECC, 62/64 internal errors, 63 page retirement, 74 NVLink, 79 fallen off the bus,
    /// 92/94/95 ECC and containment, 119/120 GSP).
    pub critical_xids: Vec<u64>,
}

impl Default for HealthRules {
    fn default() -> Self {
        HealthRules {
            max_temperature_c: 85,
            max_vram_pct: 95,
            critical_xids: vec![48, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120],
        }
    }
}

/// The node's burn-in as a breach: running (the GPUs are busy with it) or failed (until a run
/// passes). Named for all the node's GPUs (`*`).
pub fn burn_in_issue(state: Option<&BurnInState>) -> Option<HealthIssue> {
    let state = state?;
    let detail = match (&state.failed, state.running) {
        (_, true) => "burn-in running".to_owned(),
        (Some(why), false) => format!("burn-in failed: {why}"),
        (None, false) => return None,
    };
    Some(HealthIssue {
        gpu_uuid: "*".into(),
        rule: "burn_in".into(),
        detail,
    })
}

/// Every breach of `rules` in the node's latest samples.
pub fn breaches(rules: &HealthRules, samples: &[GpuSample]) -> Vec<HealthIssue> {
    let mut out = Vec::new();
    for s in samples {
        let mut breach = |rule: &str, detail: String| {
            out.push(HealthIssue {
                gpu_uuid: s.uuid.clone(),
                rule: rule.to_owned(),
                detail,
            });
        };
        if s.lost {
            breach("lost", "the GPU has fallen off the bus".into());
            continue;
        }
        if s.temperature_c >= rules.max_temperature_c {
            breach(
                "temperature",
                format!(
                    "{} °C, at or above {} °C",
                    s.temperature_c, rules.max_temperature_c
                ),
            );
        }
        let total = s.memory_total_mb;
        if total > 0
            && s.memory_used_mb.saturating_mul(100)
                >= total.saturating_mul(u64::from(rules.max_vram_pct))
        {
            breach(
                "vram",
                format!(
                    "{} of {} MiB in use, at or above {}%",
                    s.memory_used_mb, total, rules.max_vram_pct
                ),
            );
        }
        if s.ecc_uncorrected > 0 {
            breach(
                "ecc",
                format!("{} uncorrected ECC errors", s.ecc_uncorrected),
            );
        }
        for xid in &s.xid_errors {
            if rules.critical_xids.contains(xid) {
                breach("xid", format!("critical XID {xid}"));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h200() -> GpuSample {
        GpuSample {
            uuid: "GPU-h200".into(),
            utilization_pct: 99,
            memory_used_mb: 1138,
            temperature_c: 53,
            power_mw: 687_933,
            ecc_uncorrected: 0,
            memory_total_mb: 143_771,
            xid_errors: vec![],
            lost: false,
            processes: vec![],
        }
    }

    fn rules_broken(s: GpuSample) -> Vec<String> {
        breaches(&HealthRules::default(), &[s])
            .into_iter()
            .map(|b| b.rule)
            .collect()
    }

    #[test]
    fn a_busy_cool_gpu_passes() {
        assert!(rules_broken(h200()).is_empty());
        // 84 °C and 94.9% full are still fine.
        let warm = GpuSample {
            temperature_c: 84,
            memory_used_mb: 136_400,
            ..h200()
        };
        assert!(rules_broken(warm).is_empty());
    }

    #[test]
    fn each_rule_is_named() {
        assert_eq!(
            rules_broken(GpuSample {
                temperature_c: 85,
                ..h200()
            }),
            ["temperature"]
        );
        assert_eq!(
            rules_broken(GpuSample {
                memory_used_mb: 136_600,
                ..h200()
            }),
            ["vram"]
        );
        assert_eq!(
            rules_broken(GpuSample {
                ecc_uncorrected: 2,
                ..h200()
            }),
            ["ecc"]
        );
        assert_eq!(
            rules_broken(GpuSample {
                xid_errors: vec![13, 79],
                ..h200()
            }),
            ["xid"]
        );
        assert_eq!(
            rules_broken(GpuSample {
                xid_errors: vec![13],
                ..h200()
            }),
            Vec::<String>::new()
        );
        assert_eq!(
            rules_broken(GpuSample {
                lost: true,
                temperature_c: 0,
                ..h200()
            }),
            ["lost"]
        );
        let issues = breaches(
            &HealthRules::default(),
            &[GpuSample {
                temperature_c: 91,
                ..h200()
            }],
        );
        assert_eq!(issues[0].detail, "91 °C, at or above 85 °C");
        assert_eq!(issues[0].gpu_uuid, "GPU-h200");
    }

    #[test]
    fn an_unknown_memory_size_skips_the_vram_rule() {
        let s = GpuSample {
            memory_total_mb: 0,
            memory_used_mb: 999_999,
            ..h200()
        };
        assert!(rules_broken(s).is_empty());
    }
}
