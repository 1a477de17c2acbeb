//! Guaranteed work taking back borrowed work in the queue's pass.

use super::*;

fn guaranteed(id: u64, account: u64, priority: i64) -> Pending {
    Pending {
        account,
        guaranteed: true,
        ..item(id, ONE, priority, 0, Some(3600))
    }
}

fn borrowed(id: u64, account: u64, priority: i64, value: i64, gpu: usize) -> Running {
    Running {
        borrowed_of: Some(account),
        ..running(id, priority, value, None, vec![(gpu, 1000)])
    }
}

#[test]
fn guaranteed_work_takes_back_another_accounts_borrowed_work_first() {
    // One node, three GPUs: on-demand work borrowed by account 2 (paying the most), a spot
    // bid of 3, and account 1's own borrowed work.
    let gpus = [gpu(0, 1000, 0), gpu(0, 1000, 0), gpu(0, 1000, 0)];
    let run = [
        borrowed(10, 2, ON_DEMAND, 90, 0),
        running(11, 3, 3, None, vec![(1, 1000)]),
        borrowed(12, 1, ON_DEMAND, 1, 2),
    ];
    let mut q = queue(QueueConfig::default(), vec![guaranteed(1, 1, ON_DEMAND)]);
    let out = q.pass(0, &gpus, &run);
    assert_eq!(out.preempted, vec![10], "borrowed work before any spot bid");
    assert_eq!(out.placed[0].placement.gpus, vec![(0, 1000)]);
}

#[test]
fn work_beyond_its_quota_never_takes_back_borrowed_work() {
    let gpus = [gpu(0, 1000, 0)];
    let run = [borrowed(10, 2, ON_DEMAND, 1, 0)];
    let on_demand = Pending {
        account: 1,
        ..item(1, ONE, ON_DEMAND, 0, Some(3600))
    };
    let mut q = queue(QueueConfig::default(), vec![on_demand]);
    let out = q.pass(0, &gpus, &run);
    assert!(out.preempted.is_empty());
    assert_eq!(out.waiting.len(), 1);
}

#[test]
fn an_accounts_own_borrowed_work_is_not_taken_back() {
    let gpus = [gpu(0, 1000, 0)];
    let run = [borrowed(10, 1, ON_DEMAND, 1, 0)];
    let mut q = queue(QueueConfig::default(), vec![guaranteed(1, 1, ON_DEMAND)]);
    let out = q.pass(0, &gpus, &run);
    assert!(out.preempted.is_empty());
}

#[test]
fn a_guaranteed_spot_bid_takes_back_borrowed_work_but_not_a_lower_bid() {
    // GPU 0: a spot bid of 3; GPU 1: on-demand work borrowed by account 2.
    let gpus = [gpu(0, 1000, 0), gpu(1, 1000, 0)];
    let run = [
        running(10, 3, 3, None, vec![(0, 1000)]),
        borrowed(11, 2, ON_DEMAND, 50, 1),
    ];
    let mut q = queue(QueueConfig::default(), vec![guaranteed(1, 1, 7)]);
    let out = q.pass(0, &gpus, &run);
    assert_eq!(out.preempted, vec![11]);
    assert_eq!(out.placed[0].placement.gpus, vec![(1, 1000)]);
}
