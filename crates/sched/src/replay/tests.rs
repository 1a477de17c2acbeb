use proptest::prelude::*;

use super::*;
use crate::cluster::GpuDemand;
use crate::trace::{parse_nodes, parse_pods};

const HEADER: &str = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n";

fn cluster(nodes: &str) -> Cluster {
    let text = format!("sn,cpu_milli,memory_mib,gpu,model\n{nodes}");
    Cluster::from_rows(&parse_nodes(&text).unwrap()).unwrap()
}

/// Pods as `num_gpu,gpu_milli,gpu_spec,creation,deletion`, each with 1 CPU and 1 GiB.
fn pods(c: &Cluster, rows: &[&str]) -> TimedPods {
    let mut text = HEADER.to_owned();
    for (i, r) in rows.iter().enumerate() {
        let f: Vec<&str> = r.split(',').collect();
        text += &format!(
            "p{i},1000,1024,{},{},{},LS,Running,{},{},\n",
            f[0], f[1], f[2], f[3], f[4]
        );
    }
    timed_pods(c, &parse_pods(&text).unwrap())
}

fn no_clock() -> Duration {
    Duration::ZERO
}

fn replay(c: &Cluster, p: &[TimedPod], name: &str) -> Replay {
    let plain: Vec<Pod> = p.iter().map(|t| t.pod.clone()).collect();
    let workload = Workload::from_pods(&plain, POPULARITY);
    replay_policy(c, p, &workload, name, 42, &no_clock).unwrap()
}

#[test]
fn the_second_pod_waits_until_the_first_leaves() {
    let c = cluster("n0,8000,65536,1,T4\n");
    let p = pods(&c, &["1,1000,,0,10", "1,1000,,5,8"]);
    for name in policies::NAMES {
        let r = replay(&c, &p.pods, name);
        // The second runs its own 3 s from when it starts: 10 to 13.
        assert_eq!(r.starts, vec![Some(0), Some(10)], "{name}");
        assert_eq!(r.span, (0, 13));
        let s = r.summary(&p.pods, &c);
        assert_eq!((s.placed, s.never_placed), (2, 0));
        assert_eq!((s.mean_wait_s, s.p99_wait_s), (2.5, 5.0));
        // The GPU is busy from the first arrival to the last departure.
        assert_eq!(s.mean_gpu_allocation_ratio, 1.0);
        assert_eq!(s.decisions, 3, "two arrivals and one retry");
    }
}

#[test]
fn a_later_pod_that_fits_starts_before_the_head_of_the_queue() {
    let c = cluster("n0,8000,65536,2,T4\n");
    let p = pods(
        &c,
        &[
            "1,1000,,0,10",
            "1,1000,,0,20",
            // Waits for both GPUs; heads the queue from 1 s.
            "2,1000,,1,11",
            // Waits too, and at 10 s takes the GPU the head cannot use alone.
            "1,1000,,2,7",
        ],
    );
    for name in policies::NAMES {
        let r = replay(&c, &p.pods, name);
        assert_eq!(
            r.starts,
            vec![Some(0), Some(0), Some(20), Some(10)],
            "{name}"
        );
        let s = r.summary(&p.pods, &c);
        assert_eq!(s.mean_wait_s, (19.0 + 8.0) / 4.0);
        assert_eq!(s.p99_wait_s, 19.0);
        // 2 GPUs busy 0-15, one 15-20, both 20-30.
        let busy = 2000.0 * 15.0 + 1000.0 * 5.0 + 2000.0 * 10.0;
        assert!((s.mean_gpu_allocation_ratio - busy / (2000.0 * 30.0)).abs() < 1e-12);
    }
}

#[test]
fn a_pod_no_node_can_host_is_never_placed() {
    let c = cluster("n0,8000,65536,1,T4\nn1,8000,65536,2,P100\n");
    let p = pods(
        &c,
        &[
            "2,1000,T4,0,10",
            "4,1000,,1,10",
            "1,300,,2,10",
            "1,1000,V100M32,3,4",
        ],
    );
    for name in policies::NAMES {
        let r = replay(&c, &p.pods, name);
        assert_eq!(r.starts, vec![None, None, Some(2), None], "{name}");
        let s = r.summary(&p.pods, &c);
        assert_eq!((s.placed, s.never_placed), (1, 3));
        assert_eq!((s.mean_wait_s, s.p99_wait_s), (0.0, 0.0));
    }
}

#[test]
fn a_departure_frees_room_for_an_arrival_of_the_same_second() {
    let c = cluster("n0,8000,65536,1,T4\n");
    let p = pods(&c, &["1,1000,,0,10", "1,1000,,10,12", "1,1000,,12,12"]);
    let r = replay(&c, &p.pods, "best-fit");
    assert_eq!(r.starts, vec![Some(0), Some(10), Some(12)]);
    assert_eq!(r.summary(&p.pods, &c).mean_wait_s, 0.0);
}

#[test]
fn rows_without_both_times_are_skipped_and_counted() {
    let c = cluster("n0,8000,65536,1,T4\n");
    let p = pods(
        &c,
        &["1,1000,,0,10", "1,1000,,,10", "1,1000,,3,", "1,500,,9,4"],
    );
    assert_eq!(p.skipped, 3);
    assert_eq!(p.pods.len(), 1);
    assert_eq!((p.pods[0].creation, p.pods[0].duration), (0, 10));
    assert_eq!(
        run(&c, &[], &["fgd"], 1, &no_clock),
        Err(ReplayError::NoTimes)
    );
    assert_eq!(
        run(&c, &p.pods, &["first-fit"], 1, &no_clock),
        Err(ReplayError::UnknownPolicy("first-fit".into()))
    );
}

#[test]
fn every_policy_is_deterministic_for_a_seed() {
    let c = cluster("n0,8000,65536,2,T4\nn1,8000,65536,2,T4\nn2,8000,65536,4,P100\n");
    let rows: Vec<String> = (0..40)
        .map(|i| {
            let gpu = ["1,1000,", "1,400,", "2,1000,", "0,0,", "1,700,T4"][i % 5];
            format!("{gpu},{},{}", i * 3, i * 3 + 10 + (i * 7) % 25)
        })
        .collect();
    let rows: Vec<&str> = rows.iter().map(String::as_str).collect();
    let p = pods(&c, &rows);
    let a = run(&c, &p.pods, &policies::NAMES, 5, &no_clock).unwrap();
    assert_eq!(a, run(&c, &p.pods, &policies::NAMES, 5, &no_clock).unwrap());
    assert_eq!(a.len(), policies::NAMES.len());
    for r in &a {
        assert_eq!(r.placed + r.never_placed, 40, "{}", r.policy);
        assert!(r.mean_gpu_allocation_ratio > 0.0 && r.mean_gpu_allocation_ratio <= 1.0);
    }
}

/// The plain version of the replay: after every event, the whole queue is handed to the policy
/// in order, node by node.
fn replay_naively(
    cluster: &Cluster,
    pods: &[TimedPod],
    workload: &Workload,
    name: &str,
    seed: u64,
) -> Vec<Option<(u64, Assignment)>> {
    let mut c = cluster.clone();
    let mut policy = policies::by_name(name, workload, c.nodes.len()).unwrap();
    let mut rng = SimRng::new(seed ^ 0x7E91_A75E_ED0F_71E5);
    let rank = node_rank(c.nodes.len(), seed);
    let mut events: Vec<(u64, u8, usize)> = pods
        .iter()
        .enumerate()
        .map(|(i, p)| (p.creation, ARRIVE, i))
        .collect();
    let mut out: Vec<Option<(u64, Assignment)>> = vec![None; pods.len()];
    let mut queue: Vec<usize> = Vec::new();
    while !events.is_empty() {
        let k = (0..events.len()).min_by_key(|&k| events[k]).unwrap();
        let (now, kind, i) = events.swap_remove(k);
        if kind == ARRIVE {
            queue.push(i);
        } else {
            let a = &out[i].as_ref().unwrap().1;
            c.release(&pods[i].pod, a).unwrap();
            policy.released(&c, a, &pods[i].pod);
        }
        let mut waiting = Vec::new();
        for q in queue {
            let pod = &pods[q].pod;
            match schedule_with(&c, pod, policy.as_mut(), &mut rng, TieBreak::Ranked(&rank)) {
                Some(a) => {
                    c.allocate(pod, &a).unwrap();
                    policy.placed(&c, &a, pod);
                    events.push((now + pods[q].duration, DEPART, q));
                    out[q] = Some((now, a));
                }
                None => waiting.push(q),
            }
        }
        queue = waiting;
    }
    out
}

fn arb_pod() -> impl Strategy<Value = TimedPod> {
    (
        prop_oneof![
            Just(GpuDemand::None),
            (1u32..1000).prop_map(GpuDemand::Share),
            (1u32..=4).prop_map(GpuDemand::Whole),
            Just(GpuDemand::Whole(8)),
        ],
        0u64..24_000,
        prop_oneof![Just(None), Just(Some(0b01)), Just(Some(0b10))],
        0u64..60,
        prop_oneof![Just(0u64), 1u64..40],
    )
        .prop_map(|(gpu, cpu_milli, models, creation, duration)| TimedPod {
            pod: Pod {
                cpu_milli,
                memory_mib: 1024,
                gpu,
                models,
            },
            creation,
            duration,
        })
}

proptest! {
    /// On random pods: every pod starts at most once, never before it arrives; at no moment is
    /// more allocated than the nodes have (the placements, applied in time order to a fresh
    /// cluster with the departures of each second first, are all accepted); what is never placed fits nowhere even on the empty cluster;
    /// and the placements are exactly those of retrying the whole queue after every event.
    #[test]
    fn replay_keeps_capacity_and_matches_the_plain_version(
        pods in proptest::collection::vec(arb_pod(), 1..40),
        seed in 0u64..1000,
    ) {
        let c = cluster("a,16000,65536,4,T4\nb,8000,65536,2,P100\nc,4000,65536,0,nan\n");
        let plain: Vec<Pod> = pods.iter().map(|t| t.pod.clone()).collect();
        let workload = Workload::from_pods(&plain, POPULARITY);
        for name in policies::NAMES {
            let r = replay_policy(&c, &pods, &workload, name, seed, &no_clock).unwrap();
            let s = r.summary(&pods, &c);
            prop_assert_eq!(s.placed + s.never_placed, pods.len() as u64);
            prop_assert!(s.mean_wait_s >= 0.0 && s.p99_wait_s >= 0.0);
            prop_assert!((0.0..=1.0).contains(&s.mean_gpu_allocation_ratio));
            let mut events = Vec::new();
            for (i, (p, (start, a))) in pods.iter().zip(r.starts.iter().zip(&r.assignments)).enumerate() {
                prop_assert_eq!(start.is_some(), a.is_some());
                match start {
                    Some(t) => {
                        prop_assert!(*t >= p.creation);
                        // A pod of no duration holds nothing over time; its assignment must
                        // still be valid.
                        if p.duration > 0 {
                            events.push((*t, ARRIVE, i));
                            events.push((t + p.duration, DEPART, i));
                        } else {
                            prop_assert!(c.clone().allocate(&p.pod, a.as_ref().unwrap()).is_ok());
                        }
                    }
                    None => prop_assert!(!c.nodes.iter().any(|n| n.fits(&p.pod)), "{} never placed {:?}", name, p.pod),
                }
            }
            events.sort_unstable();
            let mut check = c.clone();
            for (_, kind, i) in events {
                let a = r.assignments[i].as_ref().unwrap();
                if kind == ARRIVE {
                    prop_assert!(check.allocate(&pods[i].pod, a).is_ok(), "{}: over capacity", name);
                } else {
                    prop_assert!(check.release(&pods[i].pod, a).is_ok());
                }
                prop_assert!(check.gpu_allocated_milli() <= check.gpu_capacity_milli());
            }
            prop_assert_eq!(check, c.clone());
            let naive = replay_naively(&c, &pods, &workload, name, seed);
            let fast: Vec<Option<(u64, Assignment)>> = r
                .starts
                .iter()
                .zip(&r.assignments)
                .map(|(s, a)| s.zip(a.clone()))
                .collect();
            prop_assert_eq!(fast, naive, "{}", name);
        }
    }
}
