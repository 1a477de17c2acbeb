//! The usage reports, computed from the store's facts without I/O: the time windows (`window`),
//! a day per tenant, node and GPU (`daily`), a week per price tier (`weekly`), and the day's
//! charts (`plot`).

mod daily;
pub mod plot;
mod weekly;
pub(crate) mod window;

pub(crate) use daily::daily;
pub(crate) use weekly::weekly;

/// How long the hourly telemetry rollup is kept: a year and a month, so that a day can be
/// compared with the same day a year before.
pub(crate) const KEEP_TELEMETRY: chrono::Duration = chrono::Duration::days(400);

/// GPU use is counted in milli-GPU-seconds: a whole GPU for a second is 1000, a share its part
/// of the GPU's memory. Integers, so that every sum is exact; hours only at the edge.
const MILLI: i64 = 1000;

/// A count of milli-GPU-seconds as GPU-hours, to 4 decimals.
fn gpu_hours(milli_s: i64) -> f64 {
    round(ratio(milli_s, MILLI * 3600), 4)
}

/// MiB-seconds as GB-hours (GiB, as `vram_gb` everywhere), to 4 decimals.
fn gb_hours(mb_s: i64) -> f64 {
    round(ratio(mb_s, 1024 * 3600), 4)
}

#[allow(clippy::cast_precision_loss)] // report figures, far below 2^52
fn ratio(a: i64, b: i64) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 / b as f64
    }
}

fn round(x: f64, decimals: i32) -> f64 {
    let k = 10f64.powi(decimals);
    (x * k).round() / k
}

/// The mean utilisation of samples, in percent to 2 decimals; `None` without samples.
fn mean_pct(sum: i64, samples: i64) -> Option<f64> {
    (samples > 0).then(|| round(ratio(sum, samples), 2))
}

/// A day on one node with two 24 GiB GPUs, for the tests of both reports: alice's two whole
/// GPUs 10:30-12:00 (on-demand), bob's quarter of GPU 0 from 23:00 the day before to 01:00
/// (spot, preempted), alice's GPU 1 from 23:30 on (reserved, still running).
#[cfg(test)]
pub(crate) mod fixture {
    use chrono::{DateTime, TimeZone, Utc};
    use gpurent_store::{FleetGpu, GpuHour, UsageFacts, UsedReservation};
    use gpurent_types::{Money, ReservationStatus, Tier};

    pub(crate) fn at(h: u32, m: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 3, 2, 0, 0, 0).unwrap()
            + chrono::Duration::minutes(i64::from(h * 60 + m))
    }

    fn gpu(i: u32) -> FleetGpu {
        FleetGpu {
            uuid: format!("GPU-{i}"),
            node_id: "n1".into(),
            node: "box".into(),
            index: i,
            model: "RTX 4090".into(),
            vram_mb: 24_576,
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn reservation(
        id: &str,
        tenant: &str,
        gpus: &[u32],
        share_mb: Option<i64>,
        tier: Tier,
        (start, end): (DateTime<Utc>, Option<DateTime<Utc>>),
        charged: &str,
    ) -> UsedReservation {
        UsedReservation {
            id: id.into(),
            tenant_id: format!("id-{tenant}"),
            tenant: tenant.into(),
            team: false,
            made_by: None,
            node_id: Some("n1".into()),
            node: Some("box".into()),
            gpus: gpus.iter().map(|i| format!("GPU-{i}")).collect(),
            share_mb,
            tier,
            status: if end.is_some() {
                ReservationStatus::Stopped
            } else {
                ReservationStatus::Running
            },
            end_reason: None,
            started_at: Some(start),
            ended_at: end,
            charged: charged.parse::<Money>().unwrap(),
            host_share_bps: 8000,
        }
    }

    pub(crate) fn facts() -> UsageFacts {
        let mut bob = reservation(
            "b",
            "bob",
            &[0],
            Some(6144),
            Tier::Spot,
            (at(0, 0) - chrono::Duration::hours(1), Some(at(1, 0))),
            "1.00",
        );
        bob.status = ReservationStatus::Preempted;
        bob.end_reason = Some("preempted".into());
        UsageFacts {
            reservations: vec![
                bob,
                reservation(
                    "a",
                    "alice",
                    &[0, 1],
                    None,
                    Tier::OnDemand,
                    (at(10, 30), Some(at(12, 0))),
                    "7.500001",
                ),
                reservation(
                    "c",
                    "alice",
                    &[1],
                    None,
                    Tier::Reserved,
                    (at(23, 30), None),
                    "1.25",
                ),
            ],
            gpus: vec![gpu(0), gpu(1)],
            hours: vec![
                GpuHour {
                    gpu_uuid: "GPU-0".into(),
                    hour: at(10, 0),
                    samples: 2,
                    util_sum: 150,
                    mem_used_mb_sum: 30_000,
                    mem_max_mb: 20_000,
                },
                GpuHour {
                    gpu_uuid: "GPU-0".into(),
                    hour: at(11, 0),
                    samples: 1,
                    util_sum: 90,
                    mem_used_mb_sum: 1_000,
                    mem_max_mb: 1_000,
                },
            ],
            node_earnings: vec![("n1".into(), "7.80".parse::<Money>().unwrap())],
        }
    }
}
