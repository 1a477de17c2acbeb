use proptest::prelude::*;

use super::*;
use crate::queue::{Queue, Running, ON_DEMAND};
use crate::Request;

const HOUR: i64 = 3600;
const DAY: i64 = 24 * HOUR;

fn half_life(s: u64) -> NonZeroU64 {
    NonZeroU64::new(s).unwrap()
}

fn interval(micro_gpus: u64, start_s: i64, end_s: Option<i64>) -> Interval {
    Interval {
        micro_gpus,
        start_s,
        end_s,
    }
}

fn close(a: f64, b: f64, rel: f64) -> bool {
    (a - b).abs() <= rel * a.abs().max(b.abs()).max(1e-12)
}

fn item(id: u64, account: u64, priority: i64, enqueued_at: i64) -> Pending {
    Pending {
        id,
        request: Request::Whole { count: 1 },
        priority,
        enqueued_at,
        duration_s: Some(HOUR as u64),
        account,
        guaranteed: false,
    }
}

#[test]
fn one_gpu_for_one_half_life_counts_half_of_it_over_ln_2() {
    let h = 7 * DAY;
    let got = decayed_gpu_seconds(&[interval(MICRO_GPU, 0, Some(h))], h, half_life(h as u64));
    // h/ln2 × (2^0 − 2^-1)
    assert!(close(got, h as f64 / LN_2 / 2.0, 1e-12), "{got}");
    // A quarter of a GPU counts a quarter; the part after `now` does not count; running work
    // counts until `now`.
    let quarter = decayed_gpu_seconds(
        &[interval(MICRO_GPU / 4, 0, Some(2 * h))],
        h,
        half_life(h as u64),
    );
    assert!(close(quarter, got / 4.0, 1e-12));
    let running = decayed_gpu_seconds(&[interval(MICRO_GPU, 0, None)], h, half_life(h as u64));
    assert!(close(running, got, 1e-12));
    assert_eq!(
        decayed_gpu_seconds(&[interval(MICRO_GPU, h + 1, None)], h, half_life(h as u64)),
        0.0,
        "work that starts after now"
    );
    assert_eq!(
        decayed_gpu_seconds(&[interval(MICRO_GPU, 10, Some(5))], h, half_life(h as u64)),
        0.0,
        "an interval that ends before it starts is empty"
    );
    // A second a moment ago is one GPU-second, even against a long half-life.
    let second = decayed_gpu_seconds(&[interval(MICRO_GPU, -1, Some(0))], 0, half_life(h as u64));
    assert!(close(second, 1.0, 1e-6), "{second}");
    // Extreme times neither overflow nor go negative.
    let far = decayed_gpu_seconds(
        &[interval(u64::MAX, i64::MIN, Some(i64::MIN + 1))],
        i64::MAX,
        NonZeroU64::MIN,
    );
    assert_eq!(far, 0.0);
}

#[test]
fn usage_does_not_grow_back_in_time() {
    let u = Usage {
        value: 100.0,
        at: 50,
    };
    assert_eq!(u.decayed_to(10, half_life(60)), u);
    assert_eq!(u.decayed_to(110, half_life(60)).value, 50.0);
}

#[test]
fn weights_are_positive_and_usage_finite() {
    let mut share = FairShare::new();
    assert_eq!(
        share.set(3, 0, 1.0),
        Err(FairShareError::ZeroWeight { account: 3 })
    );
    for bad in [f64::NAN, f64::INFINITY, -1.0] {
        assert!(matches!(
            share.set(3, 1, bad),
            Err(FairShareError::BadUsage { account: 3, .. })
        ));
    }
    assert_eq!(share.account(3), AccountShare::default());
    assert_eq!(share.account(3).weight, DEFAULT_WEIGHT);
    share.set(3, 5, 7.0).unwrap();
    assert_eq!(
        share.account(3),
        AccountShare {
            weight: 5,
            usage: 7.0
        }
    );
}

#[test]
fn placements_count_their_fraction_of_a_gpu() {
    let slot = |vram_mb| GpuSlot {
        node: 0,
        vram_mb,
        free_mb: vram_mb,
        switch: None,
    };
    let gpus = [slot(80_000), slot(80_000), slot(24_000)];
    let whole = Placement {
        gpus: vec![(0, 80_000), (1, 80_000)],
    };
    assert_eq!(placed_micro_gpus(&gpus, &whole), 2 * MICRO_GPU);
    let share = Placement {
        gpus: vec![(2, 6_000)],
    };
    assert_eq!(placed_micro_gpus(&gpus, &share), MICRO_GPU / 4);
    let nowhere = Placement {
        gpus: vec![(9, 6_000)],
    };
    assert_eq!(placed_micro_gpus(&gpus, &nowhere), 0);
    let fs = FairShare::new();
    assert_eq!(fs.charge(MICRO_GPU / 4, Some(400)), 100.0);
    assert_eq!(
        fs.charge(2 * MICRO_GPU, None),
        2.0 * NOMINAL_DURATION_S as f64
    );
    assert_eq!(fs.with_nominal_duration(10).charge(MICRO_GPU, None), 10.0);
}

#[test]
fn the_account_furthest_below_its_share_goes_first_and_placements_charge_it() {
    // Account 1: weight 2, 1,000 GPU-s; account 2: weight 1, 400; account 3: no entry (weight
    // 1, no usage). Total weight 4: normalised 2,000, 1,600 and 0.
    let mut share = FairShare::new();
    share.set(1, 2, 1_000.0).unwrap();
    share.set(2, 1, 400.0).unwrap();
    share.set(9, 1, 0.0).unwrap(); // No queued work: not in the total weight.
    let items = vec![
        item(10, 1, 5, 0),
        item(11, 1, ON_DEMAND, 50),
        item(20, 2, 1, 0),
        item(21, 2, 1, 0),
        item(30, 3, 1, 0),
    ];
    let config = QueueConfig {
        aging_per_second: 0,
        ..QueueConfig::default()
    };
    let mut order = share.order(&items, &config, 100);
    assert_eq!(order.total_weight(), 4.0);
    assert_eq!(
        order.standings(),
        vec![(1, 2_000.0), (2, 1_600.0), (3, 0.0)]
    );
    // A higher tier before any account's standing: account 1's on-demand item first (not
    // placed: nothing charged).
    assert_eq!(order.next_item(), Some(1));
    // Then the spot tier: account 3 first; placed for an hour, it is charged 3,600 GPU-s
    // (normalised 14,400).
    assert_eq!(order.next_item(), Some(4));
    order.placed(3_600.0);
    // Account 2 next: its first item is not placed, so it stays furthest below; its second
    // (the same priority and age: the lower id first) is placed for 300 GPU-s (2,800).
    assert_eq!(order.next_item(), Some(2));
    assert_eq!(order.next_item(), Some(3));
    order.placed(300.0);
    // Account 1's spot item.
    assert_eq!(order.next_item(), Some(0));
    assert_eq!(order.next_item(), None);
    assert_eq!(
        order.standings(),
        vec![(1, 2_000.0), (2, 2_800.0), (3, 14_400.0)]
    );
}

#[test]
fn ties_go_to_the_lower_account_id() {
    let share = FairShare::new();
    let items = vec![item(1, 7, 1, 0), item(2, 3, 1, 0), item(3, 5, 1, 0)];
    let mut order = share.order(&items, &QueueConfig::default(), 0);
    let visited: Vec<usize> = std::iter::from_fn(|| order.next_item()).collect();
    assert_eq!(visited, vec![1, 2, 0]);
}

/// Three accounts of weights 1:2:1, each with an endless backlog of one-GPU, one-hour jobs, on
/// ten GPUs: passes every hour (when all the work ends) converge on 25/50/25% of the GPU-hours.
#[test]
fn shares_converge_on_the_weights() {
    let weights = [1u64, 2, 1];
    let gpus: Vec<GpuSlot> = (0..10)
        .map(|n| GpuSlot {
            node: n,
            vram_mb: 1_000,
            free_mb: 1_000,
            switch: None,
        })
        .collect();
    let h = half_life(7 * DAY as u64);
    let mut queue = Queue::new(QueueConfig::default());
    let mut usage = [Usage::default(); 3];
    let mut running: Vec<u64> = Vec::new(); // Accounts of the work of the last hour.
    let mut hours = [0u64; 3];
    let mut next_id = 0u64;
    let passes = 24 * 90;
    for pass in 0..passes {
        let now = pass * HOUR;
        for (a, u) in usage.iter_mut().enumerate() {
            let ran = running.iter().filter(|&&r| r == a as u64).count() as u64;
            *u = u.add(&interval(ran * MICRO_GPU, now - HOUR, Some(now)), now, h);
        }
        if pass >= passes / 2 {
            for &a in &running {
                hours[usize::try_from(a).unwrap()] += 1;
            }
        }
        // Keep ten jobs of each account waiting.
        for a in 0..3u64 {
            while queue.iter().filter(|p| p.account == a).count() < 10 {
                queue.push(item(next_id, a, 1, now)).unwrap();
                next_id += 1;
            }
        }
        let mut share = FairShare::new();
        for (a, (w, u)) in weights.iter().zip(&usage).enumerate() {
            share.set(a as u64, *w, u.value).unwrap();
        }
        let out = queue.pass_fair(now, &gpus, &[] as &[Running], &share, |_, _| true);
        assert_eq!(out.placed.len(), 10, "every GPU is busy every hour");
        running = out.placed.iter().map(|p| p.item.account).collect();
    }
    let total: u64 = hours.iter().sum();
    let shares: Vec<f64> = hours.iter().map(|&h| h as f64 / total as f64).collect();
    for (got, want) in shares.iter().zip([0.25, 0.5, 0.25]) {
        assert!((got - want).abs() < 0.02, "shares {shares:?}");
    }
}

fn intervals() -> impl Strategy<Value = Vec<Interval>> {
    proptest::collection::vec(
        (
            1u64..8 * MICRO_GPU,
            -30 * DAY..0,
            proptest::option::weighted(0.8, 1i64..10 * DAY),
        ),
        1..6,
    )
    .prop_map(|v| {
        v.into_iter()
            .map(|(g, start, len)| interval(g, start, len.map(|l| start + l)))
            .collect()
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// The closed form is the integral: a fine midpoint sum of rate × 2^(-(now-t)/h) agrees.
    #[test]
    fn the_closed_form_is_the_integral(
        intervals in intervals(),
        h in 3_600u64..30 * DAY as u64,
    ) {
        let now = 0;
        let exact = decayed_gpu_seconds(&intervals, now, half_life(h));
        let mut sum = 0.0;
        for i in &intervals {
            // Beyond 64 half-lives a second weighs under 2^-64 of one now: leave it out, so
            // that the steps stay fine against the half-life.
            let a = (i.start_s as f64).max(now as f64 - 64.0 * h as f64);
            let b = i.end_s.unwrap_or(now).min(now) as f64;
            if b <= a {
                continue;
            }
            let steps = 20_000;
            let dt = (b - a) / f64::from(steps);
            for k in 0..steps {
                let t = a + (f64::from(k) + 0.5) * dt;
                sum += i.micro_gpus as f64 / MICRO_GPU as f64
                    * (-(now as f64 - t) / h as f64).exp2()
                    * dt;
            }
        }
        // Relative, or a billionth of a GPU-second for what has all but decayed away.
        prop_assert!(
            close(exact, sum, 1e-6) || (exact - sum).abs() < 1e-9,
            "closed form {} against the sum {}", exact, sum
        );
    }

    /// One half-life later, finished work counts half, both in the closed form and in the
    /// running figure.
    #[test]
    fn usage_halves_after_one_half_life(intervals in intervals(), h in 1u64..30 * DAY as u64) {
        let now = 0;
        let done: Vec<Interval> = intervals
            .iter()
            .map(|i| Interval { end_s: Some(i.end_s.unwrap_or(now).min(now)), ..*i })
            .collect();
        let before = decayed_gpu_seconds(&done, now, half_life(h));
        let after = decayed_gpu_seconds(&done, now + h as i64, half_life(h));
        prop_assert!(close(after, before / 2.0, 1e-9), "{} then {}", before, after);
        let u = Usage { value: before, at: now }.decayed_to(now + h as i64, half_life(h));
        prop_assert!(close(u.value, before / 2.0, 1e-12));
    }

    /// A running figure updated at any checkpoints, each time with what ran since the last,
    /// is the closed form over all the work.
    #[test]
    fn the_running_figure_is_the_closed_form(
        intervals in intervals(),
        mut checkpoints in proptest::collection::vec(-30 * DAY..DAY, 0..8),
        h in 3_600u64..30 * DAY as u64,
    ) {
        let now = DAY;
        checkpoints.push(now);
        checkpoints.sort_unstable();
        let mut u = Usage { value: 0.0, at: -31 * DAY };
        for &t in &checkpoints {
            let last = u.at;
            for i in &intervals {
                // What of it ran in (last, t].
                let start = i.start_s.max(last);
                let end = i.end_s.unwrap_or(t).min(t);
                if end > start {
                    u = u.add(&interval(i.micro_gpus, start, Some(end)), t, half_life(h));
                }
            }
            u = u.decayed_to(t, half_life(h));
        }
        let exact = decayed_gpu_seconds(&intervals, now, half_life(h));
        prop_assert_eq!(u.at, now);
        prop_assert!(close(u.value, exact, 1e-9), "running {} against {}", u.value, exact);
    }
}
