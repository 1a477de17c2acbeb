//! Which of the desired instances run as their assignments say, and the watchdog's own stops
//! masked in the desired state.

use std::collections::BTreeMap;

use gpurent_types::agent::Assignment;

use crate::reconcile::{Observed, ObservedState};
use crate::stops::Stops;

/// The instances that run as their assignments say and are not being stopped.
pub(super) fn running_assignments(
    desired: &[Assignment],
    actual: &[Observed],
    stops: &Stops,
) -> Vec<Assignment> {
    desired
        .iter()
        .filter(|a| a.run && !stops.contains(&a.reservation_id) && runs(a, actual))
        .cloned()
        .collect()
}

/// Whether the assignment's instance runs, of its epoch.
fn runs(a: &Assignment, actual: &[Observed]) -> bool {
    actual.iter().any(|o| {
        o.reservation_id == a.reservation_id
            && o.epoch == a.epoch
            && o.state == ObservedState::Running
    })
}

/// An instance the watchdog stopped is, to the agent, one the control plane asked to stop:
/// not started again, its output shipped, its stop reported once it is gone.
pub(super) fn mask_own_stops(
    desired: &mut [Assignment],
    own_stops: &BTreeMap<String, (i64, String)>,
) {
    for a in desired.iter_mut() {
        if own_stops
            .get(&a.reservation_id)
            .is_some_and(|(epoch, _)| *epoch == a.epoch)
        {
            a.run = false;
        }
    }
}

/// The GPUs of each instance that runs as its assignment says.
pub(super) fn running_gpus(
    desired: &[Assignment],
    actual: &[Observed],
) -> Vec<(String, Vec<String>)> {
    desired
        .iter()
        .filter(|a| runs(a, actual))
        .map(|a| (a.reservation_id.clone(), a.gpus.clone()))
        .collect()
}
