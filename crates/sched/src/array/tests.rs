use super::*;
use proptest::prelude::*;

#[test]
fn specs_parse_and_print() {
    let spec: ArraySpec = "0-999%50".parse().expect("spec");
    assert_eq!(
        spec,
        ArraySpec {
            first: 0,
            last: 999,
            max_running: Some(50)
        }
    );
    assert_eq!((spec.len(), spec.window()), (1000, 50));
    assert_eq!(spec.to_string(), "0-999%50");
    let one: ArraySpec = "7".parse().expect("spec");
    assert_eq!((one.first, one.last, one.len()), (7, 7, 1));
    assert_eq!(one.window(), DEFAULT_WINDOW);
    assert_eq!(one.to_string(), "7-7");
    let big: ArraySpec = "0-99999".parse().expect("spec");
    assert_eq!(big.len(), 100_000);
}

#[test]
fn bad_specs_say_why() {
    let err = |s: &str| s.parse::<ArraySpec>().expect_err(s).to_string();
    assert!(err("").contains("FIRST-LAST"), "{}", err(""));
    assert!(err("%5").contains("FIRST-LAST"));
    assert!(err("0-").contains("FIRST-LAST"));
    assert!(
        err("a-9").contains("\"a\" is not an index"),
        "{}",
        err("a-9")
    );
    assert!(err("-1-5").contains("FIRST-LAST") || err("-1-5").contains("not an index"));
    assert!(err("+1").contains("not an index"));
    assert!(err("0-10000000").contains("not an index"));
    assert!(err("9-3").contains("first index 9 is after the last 3"));
    assert!(err("0-9%0").contains("\"0\" is not a limit"));
    assert!(err("0-9%x").contains("not a limit"));
    assert!(err("0-9%10001").contains("from 1 to 10000"));
    assert!(err("0-9999999").contains("10000000 tasks is more than"));
}

proptest! {
    /// Whatever order tasks end in, an array never has more tasks queued or running than its
    /// window, and starts every index exactly once.
    #[test]
    fn a_window_is_never_exceeded_and_every_index_runs_once(
        len in 1u64..400,
        first in 0u64..1000,
        limit in prop::option::of(1u32..60),
        picks in prop::collection::vec(any::<prop::sample::Index>(), 0..2000),
    ) {
        let spec = ArraySpec { first, last: first + len - 1, max_running: limit };
        let mut next = spec.first;
        let mut live: Vec<u64> = Vec::new();
        let mut started = Vec::new();
        let mut picks = picks.into_iter();
        loop {
            let n = to_start(&spec, live.len() as u64, next);
            for _ in 0..n {
                live.push(next);
                started.push(next);
                next += 1;
            }
            prop_assert!(live.len() as u64 <= u64::from(spec.window()));
            if live.is_empty() {
                break;
            }
            // One task ends: the one the test picks, or the oldest once the picks run out.
            let i = picks.next().map_or(0, |p| p.index(live.len()));
            live.remove(i);
        }
        prop_assert_eq!(started, (spec.first..=spec.last).collect::<Vec<_>>());
    }

    /// An array is ended only when no task is live and none is left to start (or it was
    /// stopped), and is done only when each of its tasks exited 0.
    #[test]
    fn an_array_ends_only_when_its_tasks_have(
        done in 0u64..5, failed in 0u64..5, stopped_tasks in 0u64..5,
        running in 0u64..5, queued in 0u64..5, unstarted in 0u64..5, stopped: bool,
    ) {
        let tally = Tally { done, failed, stopped: stopped_tasks, running, queued };
        let s = state(&tally, unstarted, stopped);
        let ended = matches!(s, ArrayState::Done | ArrayState::Failed | ArrayState::Stopped);
        prop_assert_eq!(ended, tally.live() == 0 && (unstarted == 0 || stopped));
        if s == ArrayState::Done {
            prop_assert!(failed == 0 && stopped_tasks == 0 && unstarted == 0);
        }
        if s == ArrayState::Running {
            prop_assert!(running > 0);
        }
    }
}
