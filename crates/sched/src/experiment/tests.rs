use super::*;
use crate::trace::{parse_nodes, parse_pods};

const NODES: &str = "sn,cpu_milli,memory_mib,gpu,model
n0,64000,262144,8,G2
n1,64000,262144,8,G2
n2,32000,131072,4,T4
n3,32000,131072,2,T4
n4,16000,65536,0,nan
";

const PODS: &str = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time
p0,4000,8000,1,500,,LS,Running,0,10,0
p1,8000,16000,1,1000,,LS,Running,1,10,1
p2,2000,4000,1,250,T4,LS,Running,2,10,2
p3,16000,32000,4,1000,,LS,Running,3,10,3
p4,1000,1000,0,0,,BE,Running,4,10,4
p5,6000,12000,2,1000,G2,LS,Running,5,10,5
p6,3000,6000,1,700,,LS,Running,6,10,6
";

fn setup() -> (Cluster, Vec<Pod>) {
    let cluster = Cluster::from_rows(&parse_nodes(NODES).unwrap()).unwrap();
    let pods = parse_pods(PODS)
        .unwrap()
        .iter()
        .map(|r| cluster.pod(r))
        .collect();
    (cluster, pods)
}

fn no_clock() -> Duration {
    Duration::ZERO
}

#[test]
fn arrivals_reach_the_target_and_stop() {
    let (cluster, pods) = setup();
    let cap = cluster.gpu_capacity_milli();
    let order = arrivals(&pods, cap, 1.3, 42).unwrap();
    let total: u64 = order.iter().map(|&i| pods[i].gpu.total_milli()).sum();
    let last = pods[*order.last().unwrap()].gpu.total_milli();
    assert!(total as f64 >= 1.3 * cap as f64);
    assert!(
        ((total - last) as f64) < 1.3 * cap as f64,
        "cut after the crossing pod"
    );
    // Every pod of the list is there at least once, unless the cut came first.
    assert_eq!(order, arrivals(&pods, cap, 1.3, 42).unwrap());
    assert_ne!(order, arrivals(&pods, cap, 1.3, 43).unwrap());
}

#[test]
fn deterministic_for_a_seed_and_within_capacity() {
    let (cluster, pods) = setup();
    let a = run(&cluster, &pods, &policies::NAMES, 7, &no_clock).unwrap();
    let b = run(&cluster, &pods, &policies::NAMES, 7, &no_clock).unwrap();
    assert_eq!(a, b);
    for r in &a {
        assert_eq!(r.checkpoints.len(), 3, "{}", r.policy);
        for c in &r.checkpoints {
            assert!((0.0..=1.0).contains(&c.gpu_allocation_ratio));
            assert!((0.0..=1.0 + 1e-9).contains(&c.fragmentation_ratio));
        }
        // Past 100% arrived something must fail: the request exceeds the capacity.
        assert!(r.failed_placements > 0);
        let alloc: Vec<f64> = r
            .checkpoints
            .iter()
            .map(|c| c.gpu_allocation_ratio)
            .collect();
        assert!(alloc.windows(2).all(|w| w[0] <= w[1]), "no departures");
    }
}

#[test]
fn errors_are_named() {
    let (cluster, pods) = setup();
    assert_eq!(
        run(&cluster, &pods, &["nope"], 1, &no_clock),
        Err(ExperimentError::UnknownPolicy("nope".into()))
    );
    let cpu_only: Vec<Pod> = pods
        .iter()
        .filter(|p| p.gpu.total_milli() == 0)
        .cloned()
        .collect();
    assert_eq!(
        arrivals(&cpu_only, 1000, 1.3, 1),
        Err(ExperimentError::NoGpuRequest)
    );
    assert_eq!(arrivals(&pods, 0, 1.3, 1), Err(ExperimentError::NoGpu));
}

#[test]
fn node_rank_is_a_seeded_permutation() {
    let rank = node_rank(50, 42);
    let mut sorted = rank.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, (0..50).collect::<Vec<u32>>());
    assert_eq!(rank, node_rank(50, 42));
    assert_ne!(rank, node_rank(50, 43));
    assert!(node_rank(0, 42).is_empty());
}

#[test]
fn the_curve_climbs_with_the_arrivals_and_ends_at_the_last_checkpoint() {
    let (cluster, pods) = setup();
    for r in run(&cluster, &pods, &policies::NAMES, 42, &no_clock).unwrap() {
        assert_eq!(r.curve.len(), 131, "{}: one point per percent", r.policy);
        assert_eq!(r.curve[0], (0.0, 0.0));
        assert!(
            r.curve
                .windows(2)
                .all(|w| w[0].0 <= w[1].0 && w[0].1 <= w[1].1),
            "{}: arrived and allocation never go down",
            r.policy
        );
        let (arrived, allocation) = *r.curve.last().unwrap();
        assert!(arrived >= 1.3, "{}: ends at {arrived}", r.policy);
        let at_130 = r.checkpoints.last().unwrap();
        assert_eq!(at_130.arrived, 1.3);
        assert_eq!(allocation, at_130.gpu_allocation_ratio, "{}", r.policy);
    }
}

#[test]
fn each_decision_is_timed() {
    let (cluster, pods) = setup();
    // Every call of the clock is one microsecond after the previous, so each decision,
    // timed from one call to the next, takes one.
    let calls = std::cell::Cell::new(0u64);
    let ticking = || {
        calls.set(calls.get() + 1);
        Duration::from_micros(calls.get())
    };
    let r = run(&cluster, &pods, &["best-fit"], 42, &ticking).unwrap();
    assert_eq!((r[0].decision_p50_us, r[0].decision_p99_us), (1.0, 1.0));
    let still = run(&cluster, &pods, &["best-fit"], 42, &no_clock).unwrap();
    assert_eq!(still[0].decision_p99_us, 0.0);
}

#[test]
fn percentiles_take_the_nearest_rank() {
    let nanos: Vec<u32> = (1..=200).map(|n| n * 1000).collect();
    assert_eq!(percentile_us(&nanos, 50), 100.0);
    assert_eq!(percentile_us(&nanos, 99), 198.0);
    assert_eq!(percentile_us(&[7000], 99), 7.0);
    assert_eq!(percentile_us(&[], 99), 0.0);
}
