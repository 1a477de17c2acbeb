//! The daily report: GPU-hours, VRAM-hours, revenue and utilisation per tenant, node and GPU,
//! each GPU's 24 hours, and the timeline of the reservations that held GPUs that day.

use std::collections::{BTreeMap, HashMap};

use chrono::{DateTime, NaiveDate, Utc};
use gpurent_store::{FleetGpu, UsageFacts, UsedReservation};
use gpurent_types::report::{
    DailyReport, DayTotals, GpuHourUsage, GpuUsage, MemberUsage, NodeUsage, TenantUsage,
    TimelineEntry,
};
use gpurent_types::Money;

use super::window::{clip, per_hour};
use super::{gb_hours, gpu_hours, mean_pct, ratio, round, MILLI};

const HOURS: usize = 24;

/// Integer sums of one row of the report.
#[derive(Debug, Default, Clone)]
struct Sums {
    milli_s: i64,
    mb_s: i64,
    revenue: i64,
    util_sum: i64,
    samples: i64,
    /// Utilisation weighted by GPU-time: sum of milli-GPU-seconds x hourly mean (percent).
    weighted_util: i128,
    weight: i64,
    reservations: u32,
}

#[derive(Debug, Default, Clone)]
struct GpuSums {
    sums: Sums,
    alloc_mb_s: Vec<i64>,
    hours: Vec<(i64, i64, i64, i64)>, // samples, util_sum, mem_used_sum, mem_max
}

/// Splits `total` micro-units into `n` parts that add up to it exactly (the first ones one
/// micro-unit more where it does not divide).
pub(crate) fn split(total: i64, n: usize) -> Vec<i64> {
    let n_i = i64::try_from(n.max(1)).unwrap_or(i64::MAX);
    let (each, rest) = (total.div_euclid(n_i), total.rem_euclid(n_i));
    (0..n_i).map(|i| each + i64::from(i < rest)).collect()
}

/// The GPU memory a reservation holds on each of its GPUs: all of it for whole GPUs.
fn allocations(
    r: &UsedReservation,
    gpus: &HashMap<&str, usize>,
    fleet: &[FleetGpu],
) -> Vec<(usize, i64)> {
    r.gpus
        .iter()
        .filter_map(|u| gpus.get(u.as_str()).copied())
        .map(|i| {
            (
                i,
                r.share_mb.unwrap_or(fleet[i].vram_mb).min(fleet[i].vram_mb),
            )
        })
        .collect()
}

/// The report of the UTC day `date`, [from, to); work still running counts up to `now`.
pub(crate) fn daily(
    facts: &UsageFacts,
    date: NaiveDate,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
    now: DateTime<Utc>,
) -> DailyReport {
    let (f, t, now_s) = (from.timestamp(), to.timestamp(), now.timestamp());
    let fleet = &facts.gpus;
    let index: HashMap<&str, usize> = fleet
        .iter()
        .enumerate()
        .map(|(i, g)| (g.uuid.as_str(), i))
        .collect();
    let mut per_gpu: Vec<GpuSums> = vec![
        GpuSums {
            alloc_mb_s: vec![0; HOURS],
            hours: vec![(0, 0, 0, 0); HOURS],
            ..GpuSums::default()
        };
        fleet.len()
    ];
    for h in &facts.hours {
        let Some(&i) = index.get(h.gpu_uuid.as_str()) else {
            continue;
        };
        let Ok(hour) = usize::try_from((h.hour.timestamp() - f).div_euclid(3600)) else {
            continue;
        };
        if let Some(slot) = per_gpu[i].hours.get_mut(hour) {
            *slot = (h.samples, h.util_sum, h.mem_used_mb_sum, h.mem_max_mb);
            per_gpu[i].sums.samples += h.samples;
            per_gpu[i].sums.util_sum += h.util_sum;
        }
    }
    let mut tenants: BTreeMap<(String, String), Sums> = BTreeMap::new();
    // Teams' reservations by member: (team id, member name).
    let mut members: BTreeMap<(String, String), Sums> = BTreeMap::new();
    let teams: std::collections::HashSet<&str> = facts
        .reservations
        .iter()
        .filter(|r| r.team)
        .map(|r| r.tenant_id.as_str())
        .collect();
    let mut node_revenue: HashMap<&str, i64> = HashMap::new();
    let node_earnings: HashMap<&str, i64> = facts
        .node_earnings
        .iter()
        .map(|(n, m)| (n.as_str(), m.micros()))
        .collect();
    let mut timeline = Vec::new();
    let mut revenue = 0i64;
    for r in &facts.reservations {
        let tenant = tenants
            .entry((r.tenant.clone(), r.tenant_id.clone()))
            .or_default();
        tenant.reservations += 1;
        tenant.revenue += r.charged.micros();
        let mut member = r.made_by.as_ref().map(|m| {
            let sums = members.entry((r.tenant_id.clone(), m.clone())).or_default();
            sums.reservations += 1;
            sums.revenue += r.charged.micros();
            sums
        });
        revenue += r.charged.micros();
        if let Some(node) = &r.node_id {
            *node_revenue.entry(node).or_default() += r.charged.micros();
        }
        let allocs = allocations(r, &index, fleet);
        for (&(i, _), part) in allocs.iter().zip(split(r.charged.micros(), allocs.len())) {
            per_gpu[i].sums.revenue += part;
        }
        let Some(start) = r.started_at else { continue };
        let end = r.ended_at.map_or(now_s, |e| e.timestamp());
        let Some((s, e)) = clip(start.timestamp(), end, f, t) else {
            continue;
        };
        let seconds = per_hour(s, e, f, HOURS);
        for &(i, mb) in &allocs {
            let milli = MILLI * mb / fleet[i].vram_mb.max(1);
            let g = &mut per_gpu[i];
            for (h, &secs) in seconds.iter().enumerate() {
                g.alloc_mb_s[h] += mb * secs;
                let (samples, util, _, _) = g.hours[h];
                if samples > 0 && secs > 0 {
                    tenant.weighted_util +=
                        i128::from(milli * secs) * i128::from(util) / i128::from(samples);
                    tenant.weight += milli * secs;
                }
            }
            let total: i64 = seconds.iter().sum();
            g.sums.milli_s += milli * total;
            g.sums.mb_s += mb * total;
            tenant.milli_s += milli * total;
            tenant.mb_s += mb * total;
            if let Some(m) = member.as_mut() {
                m.milli_s += milli * total;
            }
        }
        timeline.push(TimelineEntry {
            reservation_id: r.id.clone(),
            tenant: r.tenant.clone(),
            node: r.node.clone(),
            gpus: r.gpus.clone(),
            tier: r.tier,
            status: r.status,
            vram_mb: r.share_mb.and_then(|m| u64::try_from(m).ok()),
            start: at(s),
            end: at(e),
            ongoing: r.ended_at.is_none_or(|x| x.timestamp() > e),
            made_by: r.made_by.clone(),
        });
    }

    let day_s = t - f;
    let gpus: Vec<GpuUsage> = fleet
        .iter()
        .zip(&per_gpu)
        .map(|(g, s)| GpuUsage {
            uuid: g.uuid.clone(),
            node: g.node.clone(),
            index: g.index,
            model: g.model.clone(),
            vram_mb: u64::try_from(g.vram_mb).unwrap_or(0),
            gpu_hours: gpu_hours(s.sums.milli_s),
            vram_gb_hours: gb_hours(s.sums.mb_s),
            revenue: Money::from_micros(s.sums.revenue),
            allocation_pct: pct(s.sums.milli_s, MILLI * day_s),
            utilization_pct: mean_pct(s.sums.util_sum, s.sums.samples),
            hours: (0..HOURS)
                .map(|h| {
                    let (samples, util, used, max) = s.hours[h];
                    GpuHourUsage {
                        hour: u32::try_from(h).unwrap_or(0),
                        allocated_mb: u64::try_from(s.alloc_mb_s[h] / 3600).unwrap_or(0),
                        used_mb: (samples > 0).then(|| u64::try_from(used / samples).unwrap_or(0)),
                        used_max_mb: (samples > 0).then(|| u64::try_from(max).unwrap_or(0)),
                        utilization_pct: mean_pct(util, samples),
                        samples: u64::try_from(samples).unwrap_or(0),
                    }
                })
                .collect(),
        })
        .collect();

    let mut nodes: BTreeMap<(String, String), (u32, Sums)> = BTreeMap::new();
    for (g, s) in fleet.iter().zip(&per_gpu) {
        let (count, n) = nodes
            .entry((g.node.clone(), g.node_id.clone()))
            .or_default();
        *count += 1;
        n.milli_s += s.sums.milli_s;
        n.mb_s += s.sums.mb_s;
        n.util_sum += s.sums.util_sum;
        n.samples += s.sums.samples;
    }
    let nodes: Vec<NodeUsage> = nodes
        .into_iter()
        .map(|((name, id), (count, n))| {
            let revenue = node_revenue.get(id.as_str()).copied().unwrap_or_default();
            let earned = node_earnings.get(id.as_str()).copied().unwrap_or_default();
            NodeUsage {
                gpus: count,
                gpu_hours: gpu_hours(n.milli_s),
                vram_gb_hours: gb_hours(n.mb_s),
                revenue: Money::from_micros(revenue),
                host_earnings: Money::from_micros(earned),
                allocation_pct: pct(n.milli_s, MILLI * day_s * i64::from(count)),
                utilization_pct: mean_pct(n.util_sum, n.samples),
                node_id: id,
                node: name,
            }
        })
        .collect();

    let tenants: Vec<TenantUsage> = tenants
        .into_iter()
        .map(|((name, id), s)| TenantUsage {
            reservations: s.reservations,
            gpu_hours: gpu_hours(s.milli_s),
            vram_gb_hours: gb_hours(s.mb_s),
            revenue: Money::from_micros(s.revenue),
            #[allow(clippy::cast_precision_loss)] // a report figure
            utilization_pct: (s.weight > 0)
                .then(|| round(s.weighted_util as f64 / s.weight as f64, 2)),
            team: teams.contains(id.as_str()),
            members: members
                .range((id.clone(), String::new())..)
                .take_while(|((team, _), _)| *team == id)
                .map(|((_, member), m)| MemberUsage {
                    member: member.clone(),
                    reservations: m.reservations,
                    gpu_hours: gpu_hours(m.milli_s),
                    revenue: Money::from_micros(m.revenue),
                })
                .collect(),
            tenant_id: id,
            tenant: name,
        })
        .collect();

    let all = per_gpu.iter().fold(Sums::default(), |mut a, g| {
        a.milli_s += g.sums.milli_s;
        a.mb_s += g.sums.mb_s;
        a.util_sum += g.sums.util_sum;
        a.samples += g.sums.samples;
        a
    });
    let count = i64::try_from(fleet.len()).unwrap_or(i64::MAX);
    DailyReport {
        date,
        from,
        to,
        totals: DayTotals {
            gpus: u32::try_from(fleet.len()).unwrap_or(u32::MAX),
            gpu_hours: gpu_hours(all.milli_s),
            vram_gb_hours: gb_hours(all.mb_s),
            revenue: Money::from_micros(revenue),
            host_earnings: Money::from_micros(node_earnings.values().sum()),
            allocation_pct: pct(all.milli_s, MILLI * day_s * count),
            utilization_pct: mean_pct(all.util_sum, all.samples),
        },
        tenants,
        nodes,
        gpus,
        timeline,
    }
}

fn pct(part: i64, whole: i64) -> f64 {
    round(100.0 * ratio(part, whole), 2)
}

fn at(s: i64) -> DateTime<Utc> {
    DateTime::from_timestamp(s, 0).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::super::fixture::{at, facts};
    use super::*;

    fn m(s: &str) -> Money {
        s.parse().unwrap()
    }

    #[test]
    fn a_teams_row_says_so_and_what_each_member_made_for_it() {
        let mut facts = facts();
        for (r, member) in facts.reservations.iter_mut().zip(["olga", "arty", "olga"]) {
            r.tenant = "lab".into();
            r.tenant_id = "id-lab".into();
            r.team = true;
            r.made_by = Some(member.into());
        }
        let from = at(0, 0);
        let r = daily(&facts, from.date_naive(), from, at(24, 0), at(24, 0));
        assert_eq!(r.tenants.len(), 1);
        let lab = &r.tenants[0];
        assert!(lab.team);
        let members: Vec<(&str, u32, Money)> = lab
            .members
            .iter()
            .map(|m| (m.member.as_str(), m.reservations, m.revenue))
            .collect();
        // bob's 1.00 and alice's later 1.25 are olga's; alice's 7.500001 is arty's.
        assert_eq!(
            members,
            vec![("arty", 1, m("7.500001")), ("olga", 2, m("2.25"))]
        );
        let hours: f64 = lab.members.iter().map(|m| m.gpu_hours).sum();
        assert!(
            (hours - lab.gpu_hours).abs() < 1e-9,
            "{hours} {}",
            lab.gpu_hours
        );
        assert!(r.timeline.iter().all(|t| t.made_by.is_some()));
    }

    #[test]
    fn the_day_matches_the_hand_computation() {
        let from = at(0, 0);
        let r = daily(&facts(), from.date_naive(), from, at(24, 0), at(24, 0));
        // GPU 0: alice 1.5 h whole + bob 1 h of a quarter = 1.75 GPU-h, 36 + 6 GB-h.
        // GPU 1: alice 1.5 h + 0.5 h = 2 GPU-h, 48 GB-h.
        let g0 = &r.gpus[0];
        assert_eq!((g0.gpu_hours, g0.vram_gb_hours), (1.75, 42.0));
        assert_eq!((r.gpus[1].gpu_hours, r.gpus[1].vram_gb_hours), (2.0, 48.0));
        // 7.500001 split over two GPUs, the odd micro-unit to the first.
        assert_eq!((g0.revenue, r.gpus[1].revenue), (m("4.750001"), m("5.00")));
        assert_eq!(g0.utilization_pct, Some(80.0)); // (150 + 90) / 3
        assert_eq!(r.gpus[1].utilization_pct, None);
        let h10 = &g0.hours[10];
        assert_eq!(
            (
                h10.allocated_mb,
                h10.used_mb,
                h10.used_max_mb,
                h10.utilization_pct
            ),
            (12_288, Some(15_000), Some(20_000), Some(75.0))
        );
        assert_eq!(g0.hours[0].allocated_mb, 6144);
        assert_eq!(g0.hours.len(), 24);

        let alice = &r.tenants[0];
        assert_eq!((alice.tenant.as_str(), alice.reservations), ("alice", 2));
        assert_eq!((alice.gpu_hours, alice.vram_gb_hours), (3.5, 84.0));
        assert_eq!(alice.revenue, m("8.750001"));
        // Her GPU-time with samples: 30 min at 75% and 60 min at 90% on GPU 0.
        assert_eq!(alice.utilization_pct, Some(85.0));
        let bob = &r.tenants[1];
        assert_eq!(
            (bob.gpu_hours, bob.vram_gb_hours, bob.revenue),
            (0.25, 6.0, m("1.00"))
        );
        assert_eq!(bob.utilization_pct, None);

        let node = &r.nodes[0];
        assert_eq!(
            (node.gpus, node.gpu_hours, node.vram_gb_hours),
            (2, 3.75, 90.0)
        );
        assert_eq!(
            (node.revenue, node.host_earnings),
            (m("9.750001"), m("7.80"))
        );
        assert_eq!(node.allocation_pct, 7.81); // 3.75 of 48 GPU-hours
        assert_eq!(r.totals.revenue, m("9.750001"));
        assert_eq!(r.totals.gpu_hours, 3.75);

        let spans: Vec<_> = r
            .timeline
            .iter()
            .map(|e| (e.reservation_id.as_str(), e.start, e.end, e.ongoing))
            .collect();
        assert_eq!(
            spans,
            [
                ("b", at(0, 0), at(1, 0), false),
                ("a", at(10, 30), at(12, 0), false),
                ("c", at(23, 30), at(24, 0), true),
            ]
        );
    }

    #[test]
    fn work_still_running_counts_up_to_now() {
        let from = at(0, 0);
        let r = daily(&facts(), from.date_naive(), from, at(24, 0), at(23, 45));
        assert_eq!(r.gpus[1].gpu_hours, 1.75);
        assert_eq!(r.timeline[2].end, at(23, 45));
    }

    fn reservation() -> impl Strategy<Value = (i64, i64, Vec<usize>, bool, i64, usize)> {
        (
            -86_400i64..172_800,
            1i64..100_000,
            proptest::sample::subsequence(vec![0usize, 1, 2, 3], 1..=4),
            any::<bool>(),
            0i64..50_000_000,
            0usize..3,
        )
    }

    proptest! {
        #[test]
        fn money_adds_up_every_way_and_the_timeline_stays_in_the_day(
            rs in proptest::collection::vec(reservation(), 0..12)
        ) {
            let mut f = facts();
            f.gpus.extend(f.gpus.clone().into_iter().map(|mut g| {
                g.index += 2;
                g.uuid = format!("GPU-{}", g.index);
                g
            }));
            let template = f.reservations[1].clone();
            f.reservations = rs
                .iter()
                .enumerate()
                .map(|(k, (start, len, gpus, share, charged, tenant))| {
                    let mut r = template.clone();
                    r.id = format!("r{k}");
                    r.tenant = format!("t{tenant}");
                    r.tenant_id = format!("id-t{tenant}");
                    r.gpus = if *share {
                        vec![format!("GPU-{}", gpus[0])]
                    } else {
                        gpus.iter().map(|g| format!("GPU-{g}")).collect()
                    };
                    r.share_mb = share.then_some(4096);
                    r.started_at = Some(at(0, 0) + chrono::Duration::seconds(*start));
                    r.ended_at = Some(at(0, 0) + chrono::Duration::seconds(start + len));
                    r.charged = Money::from_micros(*charged);
                    r
                })
                .collect();
            let r = daily(&f, at(0, 0).date_naive(), at(0, 0), at(24, 0), at(48, 0));
            let total: i64 = rs.iter().map(|x| x.4).sum();
            let sum = |ms: Vec<Money>| ms.iter().map(|m| m.micros()).sum::<i64>();
            prop_assert_eq!(r.totals.revenue.micros(), total);
            prop_assert_eq!(sum(r.tenants.iter().map(|t| t.revenue).collect()), total);
            prop_assert_eq!(sum(r.nodes.iter().map(|n| n.revenue).collect()), total);
            prop_assert_eq!(sum(r.gpus.iter().map(|g| g.revenue).collect()), total);
            let tenant_hours: f64 = r.tenants.iter().map(|t| t.gpu_hours).sum();
            prop_assert!((tenant_hours - r.totals.gpu_hours).abs() < 0.001 * (1.0 + r.tenants.len() as f64));
            for e in &r.timeline {
                prop_assert!(at(0, 0) <= e.start && e.start < e.end && e.end <= at(24, 0));
            }
            for g in &r.gpus {
                // No hour holds more than the GPU's memory per reservation on it.
                let on_gpu = rs.len() as u64;
                prop_assert!(g.hours.iter().all(|h| h.allocated_mb <= g.vram_mb * on_gpu.max(1)));
            }
        }

        #[test]
        fn splits_add_up(total in 0i64..10_000_000_000, n in 1usize..9) {
            let parts = split(total, n);
            prop_assert_eq!(parts.len(), n);
            prop_assert_eq!(parts.iter().sum::<i64>(), total);
            prop_assert!(parts.iter().max().unwrap() - parts.iter().min().unwrap() <= 1);
        }
    }
}
