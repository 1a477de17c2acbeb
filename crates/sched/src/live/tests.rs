use super::*;
use proptest::prelude::*;

fn gpu(node: u32, vram_mb: u64, free_mb: u64) -> GpuSlot {
    GpuSlot {
        node,
        vram_mb,
        free_mb,
        switch: None,
    }
}

#[test]
fn without_history_it_is_best_fit() {
    let c = [gpu(0, 24_000, 14_000), gpu(1, 24_000, 24_000)];
    let r = Request::Share { vram_mb: 10_000 };
    assert_eq!(place_expecting(&c, &r, &[]), place(&c, &r));
}

/// Shares of 12 GB are expected. Best fit puts a 10 GB share in the 14 GB left on GPU 0,
/// leaving 4 GB no expected share can use; FGD puts it on the idle GPU, whose 14 GB left
/// still takes a 12 GB share.
#[test]
fn keeps_room_for_the_expected_shares() {
    let c = [gpu(0, 24_000, 14_000), gpu(1, 24_000, 24_000)];
    let r = Request::Share { vram_mb: 10_000 };
    assert_eq!(place(&c, &r).unwrap().gpus, vec![(0, 10_000)]);
    let expected = vec![Request::Share { vram_mb: 12_000 }; 10];
    assert_eq!(
        place_expecting(&c, &r, &expected).unwrap().gpus,
        vec![(1, 10_000)]
    );
}

/// 8-GPU requests are expected: a single GPU goes to the node that cannot hold 8 anyway.
#[test]
fn keeps_whole_nodes_for_the_expected_gangs() {
    let mut c: Vec<GpuSlot> = (0..8).map(|_| gpu(0, 80_000, 80_000)).collect();
    c.extend((0..4).map(|_| gpu(1, 80_000, 80_000)));
    let expected = [Request::Whole { count: 8 }, Request::Whole { count: 1 }];
    let p = place_expecting(&c, &Request::Whole { count: 1 }, &expected).unwrap();
    assert_eq!(p.gpus.len(), 1);
    assert_eq!(c[p.gpus[0].0].node, 1);
}

#[test]
fn refuses_as_best_fit_does() {
    let c = [gpu(0, 24_000, 5_000)];
    let expected = [Request::Share { vram_mb: 1_000 }];
    assert_eq!(
        place_expecting(&c, &Request::Share { vram_mb: 8_000 }, &expected),
        Err(NoFit::NoShare { wanted_mb: 8_000 })
    );
    assert_eq!(
        place_expecting(&c, &Request::Whole { count: 0 }, &expected),
        Err(NoFit::Empty)
    );
}

fn arb_request() -> impl Strategy<Value = Request> {
    prop_oneof![
        (1u32..5).prop_map(|count| Request::Whole { count }),
        (1u64..30_000).prop_map(|vram_mb| Request::Share { vram_mb }),
    ]
}

proptest! {
    /// Whatever the history, a placement takes only free memory, keeps a gang on one node on
    /// distinct whole-free GPUs, and is refused exactly when best fit refuses it.
    #[test]
    fn places_only_what_fits(
        gpus in proptest::collection::vec((0u32..4, prop_oneof![Just(24_000u64), Just(16_000u64)], 0u64..=24_000), 1..16),
        request in arb_request(),
        expected in proptest::collection::vec(arb_request(), 0..12),
    ) {
        let c: Vec<GpuSlot> = gpus.iter().map(|&(n, v, f)| gpu(n, v, f.min(v))).collect();
        let ours = place_expecting(&c, &request, &expected);
        prop_assert_eq!(ours.is_ok(), place(&c, &request).is_ok());
        if let Ok(p) = ours {
            let mut seen: Vec<usize> = p.gpus.iter().map(|&(i, _)| i).collect();
            seen.sort_unstable();
            seen.dedup();
            prop_assert_eq!(seen.len(), p.gpus.len());
            for &(i, mb) in &p.gpus {
                prop_assert!(c[i].free_mb >= mb);
            }
            match request {
                Request::Whole { count } => {
                    prop_assert_eq!(p.gpus.len(), count as usize);
                    let node = c[p.gpus[0].0].node;
                    for &(i, mb) in &p.gpus {
                        prop_assert_eq!(c[i].node, node);
                        prop_assert!(c[i].is_whole_free());
                        prop_assert_eq!(mb, c[i].vram_mb);
                    }
                }
                Request::Share { vram_mb } => {
                    prop_assert_eq!(p.gpus.len(), 1);
                    prop_assert_eq!(p.gpus[0].1, vram_mb);
                }
            }
        }
    }
}

/// FGD chooses the node; on it, four GPUs come from the switch that has four free.
#[test]
fn whole_gpus_come_from_one_switch() {
    let c: Vec<GpuSlot> = (0..8)
        .map(|i| GpuSlot {
            switch: Some(u32::from(i >= 4)),
            ..gpu(0, 80_000, if i == 1 { 0 } else { 80_000 })
        })
        .collect();
    let expected = [Request::Whole { count: 4 }, Request::Whole { count: 1 }];
    let p = place_expecting(&c, &Request::Whole { count: 4 }, &expected).unwrap();
    let gpus: Vec<usize> = p.gpus.iter().map(|&(i, _)| i).collect();
    assert_eq!(gpus, [4, 5, 6, 7]);
}
