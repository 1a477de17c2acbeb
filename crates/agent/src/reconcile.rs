//! The reconciler's pure core: `plan(desired, actual)` says what to start and stop, and
//! `reports(desired, actual)` what to tell the control plane. No I/O, tested exhaustively.

use std::collections::BTreeMap;

use gpurent_types::agent::{Assignment, InstanceReport, InstanceState};

/// What the agent sees of one instance on the node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observed {
    pub reservation_id: String,
    pub epoch: i64,
    pub state: ObservedState,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ObservedState {
    Running,
    /// The workload ended by itself.
    Exited(i32),
    /// The executor could not start it.
    Failed(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    Start(Assignment),
    Stop { reservation_id: String, epoch: i64 },
}

/// The actions that converge `actual` to `desired`. An assignment with an older epoch than
/// what runs is stale and ignored (fencing); instances nobody wants are stopped.
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
        let stop = match wanted.get(o.reservation_id.as_str()) {
            None => true,
            Some(a) if a.epoch < o.epoch => false,
            Some(a) => a.epoch > o.epoch || !a.run,
        };
        // A failed start left nothing to stop; forgetting it is enough.
        if stop && !matches!(o.state, ObservedState::Failed(_)) {
            actions.push(Action::Stop {
                reservation_id: o.reservation_id.clone(),
                epoch: o.epoch,
            });
        }
    }
    for a in desired.iter().filter(|a| a.run) {
        let start = match have.get(a.reservation_id.as_str()) {
            None => true,
            Some(o) => a.epoch > o.epoch,
        };
        if start {
            actions.push(Action::Start(a.clone()));
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
            };
            match have.get(a.reservation_id.as_str()) {
                Some(o) if o.epoch == a.epoch => Some(match &o.state {
                    ObservedState::Running if a.run => report(InstanceState::Running, None, None),
                    // Still to be stopped: say nothing until it is gone.
                    ObservedState::Running => return None,
                    ObservedState::Exited(code) => report(InstanceState::Exited, Some(*code), None),
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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn assignment(id: &str, epoch: i64, run: bool) -> Assignment {
        Assignment {
            reservation_id: id.to_owned(),
            epoch,
            gpus: vec![format!("GPU-{id}")],
            vram_mb: None,
            image: None,
            command: vec![],
            env: Default::default(),
            run,
            log_offset: 0,
            stop_grace_s: None,
            ports: vec![],
        }
    }

    fn observed(id: &str, epoch: i64, state: ObservedState) -> Observed {
        Observed {
            reservation_id: id.to_owned(),
            epoch,
            state,
        }
    }

    fn stop(id: &str, epoch: i64) -> Action {
        Action::Stop {
            reservation_id: id.to_owned(),
            epoch,
        }
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
                Action::Start(assignment("a", 1, true))
            ]
        );
    }

    #[test]
    fn epochs_fence_assignments() {
        // Newer epoch: replace. Older epoch: a stale command, ignored.
        let actual = [observed("a", 2, ObservedState::Running)];
        assert_eq!(
            plan(&[assignment("a", 3, true)], &actual),
            vec![stop("a", 2), Action::Start(assignment("a", 3, true))]
        );
        assert_eq!(plan(&[assignment("a", 1, true)], &actual), vec![]);
        assert_eq!(plan(&[assignment("a", 1, false)], &actual), vec![]);
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
                    Action::Stop { reservation_id, epoch } => {
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
    }
}
