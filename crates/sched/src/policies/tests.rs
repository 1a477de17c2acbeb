use super::*;
use crate::cluster::{GpuDemand, Pod};
use crate::trace::NodeRow;
use crate::workload::Shape;

fn row(name: &str, gpus: u32) -> NodeRow {
    NodeRow {
        name: name.into(),
        cpu_milli: 64_000,
        memory_mib: 1 << 20,
        gpus,
        model: Some("T4".into()),
    }
}

fn pod(gpu: GpuDemand) -> Pod {
    Pod {
        cpu_milli: 1000,
        memory_mib: 1,
        gpu,
        models: None,
    }
}

fn share_workload() -> Workload {
    Workload {
        shapes: vec![(
            Shape {
                cpu_milli: 1000,
                gpu: GpuDemand::Share(500),
                models: None,
            },
            1.0,
        )],
    }
}

/// Node `a` has 8 idle GPUs; node `b` has 2, one of them with a 300-milli share on it.
fn cluster_and(policy: &str) -> (Cluster, Box<dyn Policy>) {
    let mut c = Cluster::from_rows(&[row("a", 8), row("b", 2)]).unwrap();
    let mut p = by_name(policy, &share_workload(), c.nodes.len()).unwrap();
    let share = pod(GpuDemand::Share(300));
    let a = Assignment {
        node: 1,
        gpus: vec![0],
    };
    c.allocate(&share, &a).unwrap();
    p.placed(&c, &a, &share);
    (c, p)
}

fn place(policy: &str, gpu: GpuDemand) -> Assignment {
    let (c, mut p) = cluster_and(policy);
    schedule(&c, &pod(gpu), p.as_mut(), &mut SimRng::new(1)).unwrap()
}

/// Node `a` has 8 free GPUs and `b` 1.7: a 1-GPU pod goes to `a` about 8 times in 9.7, and a
/// share to the GPU with the most free.
#[test]
fn vram_weighted_draws_in_proportion_to_free_gpu() {
    let (c, mut p) = cluster_and("vram-weighted");
    let mut rng = SimRng::new(1);
    let draws = 4000;
    let on_a = (0..draws)
        .filter(|_| {
            schedule(&c, &pod(GpuDemand::Whole(1)), p.as_mut(), &mut rng)
                .unwrap()
                .node
                == 0
        })
        .count();
    let share = f64::from(u32::try_from(on_a).unwrap()) / f64::from(draws);
    assert!((0.78..0.87).contains(&share), "{share}");
    for _ in 0..50 {
        let a = schedule(&c, &pod(GpuDemand::Share(200)), p.as_mut(), &mut rng).unwrap();
        if a.node == 1 {
            assert_eq!(a.gpus, vec![1], "the idle GPU, not the shared one");
        }
    }
}

#[test]
fn best_fit_fills_the_fuller_node_and_gpu() {
    let a = place("best-fit", GpuDemand::Share(500));
    assert_eq!((a.node, a.gpus), (1, vec![0]));
    assert_eq!(place("best-fit", GpuDemand::Whole(1)).node, 1);
}

#[test]
fn fgd_keeps_a_gpu_usable_for_the_expected_shares() {
    // Putting 500 on the GPU with 700 free would strand 200; on the idle GPU of `b` or any of
    // `a` it strands nothing: FGD never picks GPU 0 of `b`.
    for seed in 0..20 {
        let (c, mut p) = cluster_and("fgd");
        let a = schedule(
            &c,
            &pod(GpuDemand::Share(500)),
            p.as_mut(),
            &mut SimRng::new(seed),
        )
        .unwrap();
        assert_ne!((a.node, a.gpus.as_slice()), (1, &[0usize][..]));
    }
    // A 600 share strands 100 on the GPU with 700 free, 400 anywhere else.
    let a = place("fgd", GpuDemand::Share(600));
    assert_eq!((a.node, a.gpus), (1, vec![0]));
}

/// A GPU-rich node (8 GPUs, 64 cores) and a CPU-rich one (2 GPUs, 64 cores), for 1-GPU pods of
/// 8 cores: a CPU-only pod of 16 cores fits either without breaking any expected shape, so FGD
/// takes the first node of the order; ours keeps the GPU-rich node's cores for its GPUs.
#[test]
fn fgd_cpu_keeps_the_cores_of_gpu_rich_nodes() {
    let c = Cluster::from_rows(&[row("gpu-rich", 8), row("cpu-rich", 2)]).unwrap();
    let workload = Workload {
        shapes: vec![(
            Shape {
                cpu_milli: 8000,
                gpu: GpuDemand::Whole(1),
                models: None,
            },
            1.0,
        )],
    };
    let cpu_only = Pod {
        cpu_milli: 16_000,
        memory_mib: 1,
        gpu: GpuDemand::None,
        models: None,
    };
    let choose = |name: &str| {
        let mut p = by_name(name, &workload, c.nodes.len()).unwrap();
        let rank = [0u32, 1];
        schedule_with(
            &c,
            &cpu_only,
            p.as_mut(),
            &mut SimRng::new(1),
            TieBreak::Ranked(&rank),
        )
        .unwrap()
        .node
    };
    assert_eq!(choose("fgd"), 0);
    assert_eq!(choose("fgd-cpu"), 1);
    // With its cores to spare, a GPU pod still goes where FGD sends it.
    let mut p = by_name("fgd-cpu", &workload, c.nodes.len()).unwrap();
    let mut q = by_name("fgd", &workload, c.nodes.len()).unwrap();
    let gpu_pod = Pod {
        cpu_milli: 8000,
        ..cpu_only
    };
    let gpu_pod = Pod {
        gpu: GpuDemand::Whole(1),
        ..gpu_pod
    };
    let rank = [0u32, 1];
    let ours = schedule_with(
        &c,
        &gpu_pod,
        p.as_mut(),
        &mut SimRng::new(1),
        TieBreak::Ranked(&rank),
    );
    let theirs = schedule_with(
        &c,
        &gpu_pod,
        q.as_mut(),
        &mut SimRng::new(1),
        TieBreak::Ranked(&rank),
    );
    assert_eq!(ours, theirs);
}

#[test]
fn packing_prefers_shared_gpus_then_used_nodes() {
    let a = place("gpu-packing", GpuDemand::Share(500));
    assert_eq!((a.node, a.gpus), (1, vec![0]));
    assert_eq!(place("gpu-packing", GpuDemand::Whole(1)).node, 1);
}

#[test]
fn clustering_puts_shares_with_shares() {
    assert_eq!(place("gpu-clustering", GpuDemand::Share(100)).node, 1);
    // A whole GPU is a different kind: the idle node (band 1) beats the node of shares (band 0).
    assert_eq!(place("gpu-clustering", GpuDemand::Whole(1)).node, 0);
}

#[test]
fn a_release_undoes_what_a_placement_told_the_policy() {
    // After the share on `b` leaves, every policy scores each node as on a fresh cluster (GPU
    // clustering forgets that `b` held shares; FGD recomputes `b`).
    for name in NAMES {
        let (mut c, mut p) = cluster_and(name);
        let share = pod(GpuDemand::Share(300));
        let a = Assignment {
            node: 1,
            gpus: vec![0],
        };
        c.release(&share, &a).unwrap();
        p.released(&c, &a, &share);
        let fresh_cluster = Cluster::from_rows(&[row("a", 8), row("b", 2)]).unwrap();
        let mut fresh = by_name(name, &share_workload(), 2).unwrap();
        for gpu in [
            GpuDemand::Share(500),
            GpuDemand::Whole(1),
            GpuDemand::Whole(2),
        ] {
            for node in 0..2 {
                assert_eq!(
                    p.score(&c, node, &pod(gpu)),
                    fresh.score(&fresh_cluster, node, &pod(gpu)),
                    "{name}, {gpu:?} on node {node}"
                );
            }
        }
    }
}

#[test]
fn dot_product_prefers_less_free_gpu() {
    assert_eq!(place("dot-product", GpuDemand::Whole(1)).node, 1);
}

#[test]
fn random_uses_every_fitting_node_and_is_seeded() {
    let mut seen = [false; 2];
    for seed in 0..50 {
        let a = place_seeded("random", seed);
        seen[a.node] = true;
        assert_eq!(a, place_seeded("random", seed));
    }
    assert_eq!(seen, [true, true]);
}

fn place_seeded(policy: &str, seed: u64) -> Assignment {
    let (c, mut p) = cluster_and(policy);
    schedule(
        &c,
        &pod(GpuDemand::Whole(1)),
        p.as_mut(),
        &mut SimRng::new(seed),
    )
    .unwrap()
}

#[test]
fn ranked_ties_go_to_the_lowest_rank_except_for_random_fit() {
    // Two idle nodes tie for FGD (both keep every GPU usable); the rank decides.
    let c = Cluster::from_rows(&[row("a", 4), row("b", 4)]).unwrap();
    for rank in [[0u32, 1], [1, 0]] {
        for seed in 0..10 {
            let mut p = by_name("fgd", &share_workload(), c.nodes.len()).unwrap();
            let a = schedule_with(
                &c,
                &pod(GpuDemand::Whole(1)),
                p.as_mut(),
                &mut SimRng::new(seed),
                TieBreak::Ranked(&rank),
            )
            .unwrap();
            let first = if rank[0] == 0 { 0 } else { 1 };
            assert_eq!(a.node, first);
        }
    }
    let mut seen = [false; 2];
    for seed in 0..50 {
        let mut p = by_name("random", &share_workload(), c.nodes.len()).unwrap();
        let a = schedule_with(
            &c,
            &pod(GpuDemand::Whole(1)),
            p.as_mut(),
            &mut SimRng::new(seed),
            TieBreak::Ranked(&[0, 1]),
        )
        .unwrap();
        seen[a.node] = true;
    }
    assert_eq!(seen, [true, true]);
}

#[test]
fn nothing_fits_nothing_placed() {
    for name in NAMES {
        let (c, mut p) = cluster_and(name);
        let mut v100 = pod(GpuDemand::Whole(1));
        v100.models = Some(0b10);
        assert_eq!(
            schedule(&c, &v100, p.as_mut(), &mut SimRng::new(0)),
            None,
            "{name}"
        );
        assert_eq!(
            schedule(
                &c,
                &pod(GpuDemand::Whole(9)),
                p.as_mut(),
                &mut SimRng::new(0)
            ),
            None
        );
    }
}

mod properties {
    use super::*;
    use proptest::prelude::*;

    fn arb_pod() -> impl Strategy<Value = Pod> {
        (
            0u64..20_000,
            prop_oneof![
                Just(GpuDemand::None),
                (1u32..1000).prop_map(GpuDemand::Share),
                prop_oneof![Just(1u32), Just(2), Just(4), Just(8)].prop_map(GpuDemand::Whole),
            ],
            prop_oneof![Just(None), Just(Some(0b01u64)), Just(Some(0b10u64))],
        )
            .prop_map(|(cpu, gpu, models)| Pod {
                cpu_milli: cpu,
                memory_mib: cpu,
                gpu,
                models,
            })
    }

    proptest! {
        /// Whatever arrives, every policy's choice is a valid allocation: a gang on one node
        /// on distinct GPUs of an allowed model, never over any capacity; and a pod is refused
        /// only when no node fits it.
        #[test]
        fn policies_only_make_valid_placements(pods in proptest::collection::vec(arb_pod(), 1..80), seed in 0u64..1000) {
            let rows = [
                NodeRow { model: Some("T4".into()), ..row("a", 8) },
                NodeRow { model: Some("A10".into()), ..row("b", 4) },
                NodeRow { model: None, ..row("c", 0) },
            ];
            let workload = Workload::from_pods(&pods, 1.0);
            for name in NAMES {
                let mut c = Cluster::from_rows(&rows).unwrap();
                let mut p = by_name(name, &workload, c.nodes.len()).unwrap();
                let mut rng = SimRng::new(seed);
                for pod in &pods {
                    match schedule(&c, pod, p.as_mut(), &mut rng) {
                        Some(a) => {
                            let mut gpus = a.gpus.clone();
                            gpus.sort_unstable();
                            gpus.dedup();
                            prop_assert_eq!(gpus.len(), pod.gpu.gpu_count() as usize);
                            prop_assert!(c.nodes[a.node].accessible(pod));
                            prop_assert!(c.allocate(pod, &a).is_ok(), "{}", name);
                            p.placed(&c, &a, pod);
                        }
                        None => prop_assert!(c.nodes.iter().all(|n| !n.fits(pod)), "{}", name),
                    }
                    prop_assert!(c.check_invariants().is_ok());
                }
            }
        }
    }
}
