//! The reconciler's pure core: `plan(desired, actual)` says what to start and stop, and
//! `reports(desired, actual)` what to tell the control plane. No I/O, tested exhaustively.

use std::collections::BTreeMap;
use std::time::Duration;

use gpurent_types::agent::{Assignment, InstanceReport, InstanceState, PullProgress};

/// What the agent sees of one instance on the node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observed {
    pub reservation_id: String,
    pub epoch: i64,
    pub state: ObservedState,
    /// How its image's pull went, where its node pulled it (reported while it runs too, so
    /// the last figures are the final ones).
    pub pull: Option<PullProgress>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ObservedState {
    /// Not started yet: its node pulls its image.
    Pulling(PullProgress),
    Running,
    /// The workload ended by itself.
    Exited(i32),
    /// The executor could not start it.
    Failed(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    Start(Box<Assignment>),
    Stop {
        reservation_id: String,
        epoch: i64,
        /// Between SIGTERM and SIGKILL; None: the executor's default.
        grace: Option<Duration>,
    },
}

/// The actions that converge `actual` to `desired`. An assignment with an older epoch than
/// what runs is stale and ignored (fencing); instances nobody wants are stopped.
///
/// A start waits while one of its GPUs belongs to an instance still being stopped (a
/// preempted spot instance in its grace period): its GPUs are given to the preemptor at
/// once, but the preemptor starts only once the preempted instance is gone.
pub fn plan(desired: &[Assignment], actual: &[Observed]) -> Vec<Action> {
    let wanted: BTreeMap<&str, &Assignment> = desired
        .iter()
        .map(|a| (a.reservation_id.as_str(), a))
        .collect();
    let have: BTreeMap<&str, &Observed> = actual
        .iter()
        .map(|o| (o.reservation_id.as_str(), o))
        .collect();
    let mut actions = Vec::new();
    for o in actual {
        // The assignment's grace applies to its own instance, not to an orphan or to an
        // earlier epoch's.
        let stop = match wanted.get(o.reservation_id.as_str()) {
            None => Some(None),
            Some(a) if a.epoch < o.epoch => None,
            Some(a) if a.epoch > o.epoch => Some(None),
            Some(a) if !a.run => Some(a.stop_grace_s.map(Duration::from_secs)),
            Some(_) => None,
        };
        // A failed start left nothing to stop; forgetting it is enough.
        if let Some(grace) = stop.filter(|_| !matches!(o.state, ObservedState::Failed(_))) {
            actions.push(Action::Stop {
                reservation_id: o.reservation_id.clone(),
                epoch: o.epoch,
                grace,
            });
        }
    }
    // GPUs of instances that are to stop but still there.
    let stopping: Vec<&str> = desired
        .iter()
        .filter(|b| {
            !b.run
                && have
                    .get(b.reservation_id.as_str())
                    .is_some_and(|o| !matches!(o.state, ObservedState::Failed(_)))
        })
        .flat_map(|b| b.gpus.iter().map(String::as_str))
        .collect();
    for a in desired.iter().filter(|a| a.run) {
        let start = match have.get(a.reservation_id.as_str()) {
            None => true,
            Some(o) => a.epoch > o.epoch,
        };
        if start && !a.gpus.iter().any(|g| stopping.contains(&g.as_str())) {
            actions.push(Action::Start(Box::new(a.clone())));
        }
    }
    actions
}

/// What to report for each assignment, given what runs now.
pub fn reports(desired: &[Assignment], actual: &[Observed]) -> Vec<InstanceReport> {
    let have: BTreeMap<&str, &Observed> = actual
        .iter()
        .map(|o| (o.reservation_id.as_str(), o))
        .collect();
    desired
        .iter()
        .filter_map(|a| {
            let report = |state, exit_code, message| InstanceReport {
                reservation_id: a.reservation_id.clone(),
                epoch: a.epoch,
                state,
                exit_code,
                message,
                ports: Vec::new(),
                end_reason: None,
                disk: None,
                pull: None,
            };
            match have.get(a.reservation_id.as_str()) {
                Some(o) if o.epoch == a.epoch => Some(match &o.state {
                    ObservedState::Pulling(progress) if a.run => InstanceReport {
                        pull: Some(progress.clone()),
                        ..report(InstanceState::Starting, None, None)
                    },
                    // Cancelled: its stop is reported once it is gone.
                    ObservedState::Pulling(_) => return None,
                    ObservedState::Running if a.run => InstanceReport {
                        pull: o.pull.clone(),
                        ..report(InstanceState::Running, None, None)
                    },
                    // Still to be stopped: say nothing until it is gone.
                    ObservedState::Running => return None,
                    ObservedState::Exited(code) => {
                        report(InstanceState::Exited, Some(*code), exit_message(*code))
                    }
                    ObservedState::Failed(msg) => {
                        report(InstanceState::Failed, None, Some(msg.clone()))
                    }
                }),
                Some(_) => None,
                None if !a.run => Some(report(InstanceState::Stopped, None, None)),
                None => None,
            }
        })
        .collect()
}

/// What a non-zero exit code tells the tenant (`end_message`): the shell's codes for a
/// command not found or not runnable, else the code. None for a clean exit.
pub fn exit_message(code: i32) -> Option<String> {
    match code {
        0 => None,
        127 => Some("the command was not found (exit code 127)".to_owned()),
        126 => Some("the command could not be run: not executable (exit code 126)".to_owned()),
        code => Some(format!("the command exited with code {code}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn assignment(id: &str, epoch: i64, run: bool) -> Assignment {
        Assignment {
            reservation_id: id.to_owned(),
            epoch,
            restart_count: 0,
            array_index: None,
            gpus: vec![format!("GPU-{id}")],
            vram_mb: None,
            image: None,
            command: vec![],
            env: Default::default(),
            run,
            log_offset: 0,
            stop_grace_s: None,
            checkpoint: false,
            secrets: Default::default(),
            sealed_secrets: None,
            ports: vec![],
            mounts: Vec::new(),
        }
    }

    fn observed(id: &str, epoch: i64, state: ObservedState) -> Observed {
        Observed {
            reservation_id: id.to_owned(),
            epoch,
            state,
            pull: None,
        }
    }

    fn stop(id: &str, epoch: i64) -> Action {
        Action::Stop {
            reservation_id: id.to_owned(),
            epoch,
            grace: None,
        }
    }

    fn on_gpus(mut a: Assignment, gpus: &[&str]) -> Assignment {
        a.gpus = gpus.iter().map(|g| (*g).to_owned()).collect();
        a
    }

    #[test]
    fn starts_what_is_wanted_and_stops_what_is_not() {
        let desired = [assignment("a", 1, true), assignment("b", 1, false)];
        let actual = [
            observed("b", 1, ObservedState::Running),
            observed("orphan", 3, ObservedState::Running),
        ];
        assert_eq!(
            plan(&desired, &actual),
            vec![
                stop("b", 1),
                stop("orphan", 3),
                Action::Start(Box::new(assignment("a", 1, true)))
            ]
        );
    }

    #[test]
    fn an_exit_with_an_error_says_why() {
        let desired = [assignment("a", 1, true), assignment("b", 1, true)];
        let actual = [
            observed("a", 1, ObservedState::Exited(127)),
            observed("b", 1, ObservedState::Exited(0)),
        ];
        let r = reports(&desired, &actual);
        assert_eq!(
            r[0].message.as_deref(),
            Some("the command was not found (exit code 127)")
        );
        assert_eq!(r[1].message, None);
        assert_eq!(
            exit_message(3).as_deref(),
            Some("the command exited with code 3")
        );
    }

    #[test]
    fn epochs_fence_assignments() {
        // Newer epoch: replace. Older epoch: a stale command, ignored.
        let actual = [observed("a", 2, ObservedState::Running)];
        assert_eq!(
            plan(&[assignment("a", 3, true)], &actual),
            vec![
                stop("a", 2),
                Action::Start(Box::new(assignment("a", 3, true)))
            ]
        );
        assert_eq!(plan(&[assignment("a", 1, true)], &actual), vec![]);
        assert_eq!(plan(&[assignment("a", 1, false)], &actual), vec![]);
    }

    #[test]
    fn a_stop_carries_the_grace_of_its_assignment() {
        let mut spot = assignment("spot", 2, false);
        spot.stop_grace_s = Some(30);
        let mut replaced = assignment("replaced", 3, false);
        replaced.stop_grace_s = Some(30);
        let actual = [
            observed("spot", 2, ObservedState::Running),
            // An earlier epoch's instance and an orphan get the executor's default.
            observed("replaced", 2, ObservedState::Running),
            observed("orphan", 1, ObservedState::Running),
        ];
        assert_eq!(
            plan(&[spot, replaced], &actual),
            vec![
                Action::Stop {
                    reservation_id: "spot".into(),
                    epoch: 2,
                    grace: Some(Duration::from_secs(30)),
                },
                stop("replaced", 2),
                stop("orphan", 1),
            ]
        );
    }

    #[test]
    fn a_preemptor_starts_once_the_preempted_instance_is_gone() {
        let mut spot = on_gpus(assignment("spot", 1, false), &["GPU-0"]);
        spot.stop_grace_s = Some(30);
        let preemptor = on_gpus(assignment("pre", 1, true), &["GPU-0", "GPU-1"]);
        let elsewhere = on_gpus(assignment("other", 1, true), &["GPU-2"]);
        let desired = [spot, preemptor.clone(), elsewhere.clone()];
        // In its grace period: stopped, and the preemptor waits; other GPUs do not.
        let grace = [observed("spot", 1, ObservedState::Running)];
        assert_eq!(
            plan(&desired, &grace),
            vec![
                Action::Stop {
                    reservation_id: "spot".into(),
                    epoch: 1,
                    grace: Some(Duration::from_secs(30)),
                },
                Action::Start(Box::new(elsewhere.clone())),
            ]
        );
        // Gone, or never started at all: the preemptor starts.
        let started = [observed("other", 1, ObservedState::Running)];
        assert_eq!(
            plan(&desired, &started),
            vec![Action::Start(Box::new(preemptor.clone()))]
        );
        let failed = [
            observed("spot", 1, ObservedState::Failed("no image".into())),
            observed("other", 1, ObservedState::Running),
        ];
        assert_eq!(
            plan(&desired, &failed),
            vec![Action::Start(Box::new(preemptor))]
        );
        // Shares of one GPU both run: neither waits for the other.
        let shares = [
            on_gpus(assignment("s1", 1, true), &["GPU-0"]),
            on_gpus(assignment("s2", 1, true), &["GPU-0"]),
        ];
        assert_eq!(
            plan(&shares, &[observed("s1", 1, ObservedState::Running)]),
            vec![Action::Start(Box::new(shares[1].clone()))]
        );
    }

    #[test]
    fn exited_and_failed_instances_are_not_restarted() {
        let desired = [assignment("a", 1, true), assignment("b", 1, true)];
        let actual = [
            observed("a", 1, ObservedState::Exited(0)),
            observed("b", 1, ObservedState::Failed("no image".into())),
        ];
        assert_eq!(plan(&desired, &actual), vec![]);
        let r = reports(&desired, &actual);
        assert_eq!(r[0].state, InstanceState::Exited);
        assert_eq!(r[0].exit_code, Some(0));
        assert_eq!(r[1].state, InstanceState::Failed);
    }

    #[test]
    fn reports_say_running_and_stopped() {
        let desired = [
            assignment("a", 1, true),
            assignment("b", 1, false),
            assignment("c", 1, false),
        ];
        let actual = [
            observed("a", 1, ObservedState::Running),
            observed("c", 1, ObservedState::Running),
        ];
        let r = reports(&desired, &actual);
        assert_eq!(r.len(), 2);
        assert_eq!(
            (r[0].reservation_id.as_str(), r[0].state),
            ("a", InstanceState::Running)
        );
        assert_eq!(
            (r[1].reservation_id.as_str(), r[1].state),
            ("b", InstanceState::Stopped)
        );
    }

    fn arb_state() -> impl Strategy<Value = ObservedState> {
        prop_oneof![
            Just(ObservedState::Running),
            (0i32..3).prop_map(ObservedState::Exited),
            Just(ObservedState::Failed("x".into())),
        ]
    }

    proptest! {
        /// Applying the plan converges in one step: planning again on the result does nothing,
        /// and nothing unwanted is left running.
        #[test]
        fn plan_converges(
            desired in proptest::collection::btree_map(0u8..6, (1i64..4, any::<bool>()), 0..6),
            actual in proptest::collection::btree_map(0u8..6, (1i64..4, arb_state()), 0..6),
        ) {
            let desired: Vec<Assignment> = desired.iter().map(|(id, (e, run))| assignment(&id.to_string(), *e, *run)).collect();
            let actual: Vec<Observed> = actual.iter().map(|(id, (e, s))| observed(&id.to_string(), *e, s.clone())).collect();
            let mut after: BTreeMap<String, Observed> = actual.iter().map(|o| (o.reservation_id.clone(), o.clone())).collect();
            for action in plan(&desired, &actual) {
                match action {
                    Action::Stop { reservation_id, epoch, .. } => {
                        let removed = after.remove(&reservation_id);
                        prop_assert_eq!(removed.map(|o| o.epoch), Some(epoch));
                    }
                    Action::Start(a) => {
                        prop_assert!(a.run);
                        let previous = after.insert(a.reservation_id.clone(), observed(&a.reservation_id, a.epoch, ObservedState::Running));
                        let replaced_failure = matches!(previous, None | Some(Observed { state: ObservedState::Failed(_), .. }));
                        prop_assert!(replaced_failure, "started over a live instance");
                    }
                }
            }
            let after: Vec<Observed> = after.into_values().collect();
            let again: Vec<Action> = plan(&desired, &after)
                .into_iter()
                .filter(|a| !matches!(a, Action::Stop { .. }))
                .collect();
            prop_assert!(again.is_empty(), "{again:?}");
            for o in &after {
                if o.state == ObservedState::Running {
                    let wanted = desired.iter().any(|a| a.reservation_id == o.reservation_id && (a.run || a.epoch < o.epoch));
                    prop_assert!(wanted, "unwanted instance left running: {o:?}");
                }
            }
        }

        /// With GPUs shared between assignments: no instance is started on a GPU of an
        /// instance that is being stopped but still there, and such a start is only deferred:
        /// once the stops are done, it happens.
        #[test]
        fn no_start_on_the_gpus_of_an_instance_being_stopped(
            desired in proptest::collection::btree_map(
                0u8..6,
                (1i64..4, any::<bool>(), proptest::collection::btree_set(0u8..3, 1..3)),
                0..6,
            ),
            actual in proptest::collection::btree_map(0u8..6, (1i64..4, arb_state()), 0..6),
        ) {
            let desired: Vec<Assignment> = desired
                .iter()
                .map(|(id, (e, run, gpus))| {
                    let mut a = assignment(&id.to_string(), *e, *run);
                    a.gpus = gpus.iter().map(|g| format!("GPU-{g}")).collect();
                    a
                })
                .collect();
            let mut after: BTreeMap<String, Observed> = actual
                .iter()
                .map(|(id, (e, s))| (id.to_string(), observed(&id.to_string(), *e, s.clone())))
                .collect();
            // The instance of a `run == false` assignment, still there, that holds a GPU of `a`.
            let blocker = |a: &Assignment, now: &BTreeMap<String, Observed>| {
                desired
                    .iter()
                    .find(|b| {
                        !b.run
                            && b.gpus.iter().any(|g| a.gpus.contains(g))
                            && now.get(&b.reservation_id).is_some_and(|o| !matches!(o.state, ObservedState::Failed(_)))
                    })
                    .map(|b| (b.clone(), now[&b.reservation_id].clone()))
            };
            for _round in 0..2 {
                let now: Vec<Observed> = after.values().cloned().collect();
                for action in plan(&desired, &now) {
                    match action {
                        Action::Stop { reservation_id, .. } => {
                            after.remove(&reservation_id);
                        }
                        Action::Start(a) => {
                            let blocked = blocker(&a, &after);
                            prop_assert!(blocked.is_none(), "{} started over {blocked:?}", a.reservation_id);
                            after.insert(a.reservation_id.clone(), observed(&a.reservation_id, a.epoch, ObservedState::Running));
                        }
                    }
                }
            }
            // Whatever still waits is held by an instance that is not being stopped: one of a
            // newer epoch than its (stale) assignment.
            let now: Vec<Observed> = after.values().cloned().collect();
            for action in plan(&desired, &now) {
                if let Action::Start(a) = action {
                    let blocked = blocker(&a, &after);
                    let stale = blocked.as_ref().is_some_and(|(b, o)| o.epoch > b.epoch);
                    prop_assert!(stale, "{} never started; held by {blocked:?}", a.reservation_id);
                }
            }
        }
    }
}
