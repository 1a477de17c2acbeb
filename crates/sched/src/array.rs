//! Job arrays (`--array 0-999%50`): the spec, how many of an array's tasks are started now, and
//! the array's state from its tasks'. Pure: the server's array pass asks and the store applies.

use std::fmt;
use std::str::FromStr;

/// The most tasks one array may have.
pub const MAX_TASKS: u64 = 1_000_000;
/// The highest index a task may have.
pub const MAX_INDEX: u64 = 9_999_999;
/// Tasks of an array in the queue or running at once when its spec gives no `%` limit: the
/// rest wait in the array, not in the queue, so that a huge array costs the queue's pass no more
/// than this.
pub const DEFAULT_WINDOW: u32 = 1000;
/// The highest `%` limit.
pub const MAX_LIMIT: u32 = 10_000;

/// An array's indexes `first..=last` and how many of its tasks may run at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArraySpec {
    pub first: u64,
    pub last: u64,
    /// The `%` limit: at most this many tasks queued or running at once.
    pub max_running: Option<u32>,
}

/// Why an `--array` spec is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ArraySpecError {
    #[error("give the indexes as FIRST-LAST or N, with an optional %LIMIT: for example 0-999%50")]
    Form,
    #[error("{0:?} is not an index (a whole number from 0 to {MAX_INDEX})")]
    Index(String),
    #[error("{0:?} is not a limit (a whole number from 1 to {MAX_LIMIT})")]
    Limit(String),
    #[error("the first index {first} is after the last {last}")]
    Reversed { first: u64, last: u64 },
    #[error("{tasks} tasks is more than an array may have ({MAX_TASKS})")]
    TooMany { tasks: u64 },
}

impl ArraySpec {
    /// How many tasks the array has.
    pub fn len(&self) -> u64 {
        self.last - self.first + 1
    }

    /// An array always has at least one task.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Tasks queued or running at once: the `%` limit, or [`DEFAULT_WINDOW`].
    pub fn window(&self) -> u32 {
        self.max_running.unwrap_or(DEFAULT_WINDOW)
    }
}

impl FromStr for ArraySpec {
    type Err = ArraySpecError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        let (range, limit) = match s.split_once('%') {
            Some((range, limit)) => (range, Some(limit)),
            None => (s, None),
        };
        if range.is_empty() {
            return Err(ArraySpecError::Form);
        }
        let index = |t: &str| -> Result<u64, ArraySpecError> {
            let t = t.trim();
            if t.is_empty() {
                return Err(ArraySpecError::Form);
            }
            t.parse::<u64>()
                .ok()
                .filter(|&i| i <= MAX_INDEX && t.bytes().all(|b| b.is_ascii_digit()))
                .ok_or_else(|| ArraySpecError::Index(t.to_owned()))
        };
        let (first, last) = match range.split_once('-') {
            Some((a, b)) => (index(a)?, index(b)?),
            None => {
                let i = index(range)?;
                (i, i)
            }
        };
        if first > last {
            return Err(ArraySpecError::Reversed { first, last });
        }
        let max_running = limit
            .map(|l| {
                let l = l.trim();
                l.parse::<u32>()
                    .ok()
                    .filter(|&n| {
                        (1..=MAX_LIMIT).contains(&n) && l.bytes().all(|b| b.is_ascii_digit())
                    })
                    .ok_or_else(|| ArraySpecError::Limit(l.to_owned()))
            })
            .transpose()?;
        let spec = ArraySpec {
            first,
            last,
            max_running,
        };
        if spec.len() > MAX_TASKS {
            return Err(ArraySpecError::TooMany { tasks: spec.len() });
        }
        Ok(spec)
    }
}

impl fmt::Display for ArraySpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.first, self.last)?;
        if let Some(limit) = self.max_running {
            write!(f, "%{limit}")?;
        }
        Ok(())
    }
}

/// How many more tasks to start now: up to the window, counting the `live` ones (queued or
/// running), and no further than the array's last index (`next` is the next index not started).
pub fn to_start(spec: &ArraySpec, live: u64, next: u64) -> u64 {
    if next > spec.last {
        return 0;
    }
    let room = u64::from(spec.window()).saturating_sub(live);
    room.min(spec.last - next + 1)
}

/// An array's tasks, by where each is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tally {
    /// Exited 0.
    pub done: u64,
    /// Ended any other way but a stop: exited non-zero, could not start, preempted, lost.
    pub failed: u64,
    /// Stopped: by its tenant, its credit, its hours.
    pub stopped: u64,
    /// Placed on a node: starting, running or stopping.
    pub running: u64,
    /// Waiting for GPUs in the queue.
    pub queued: u64,
}

impl Tally {
    /// Tasks started and not ended.
    pub fn live(&self) -> u64 {
        self.running + self.queued
    }
}

/// What an array as a whole is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArrayState {
    /// Nothing runs yet.
    Queued,
    /// A task runs.
    Running,
    /// Every task ended and each exited 0.
    Done,
    /// Every task ended, one at least not well.
    Failed,
    /// Stopped by its tenant before all its tasks ran.
    Stopped,
}

/// The array's state: `tally` of its started tasks, `unstarted` the ones not yet started, and
/// whether it was stopped (no task starts after).
pub fn state(tally: &Tally, unstarted: u64, stopped: bool) -> ArrayState {
    if tally.running > 0 {
        ArrayState::Running
    } else if tally.queued > 0 || (unstarted > 0 && !stopped) {
        ArrayState::Queued
    } else if stopped && (unstarted > 0 || tally.stopped > 0) {
        ArrayState::Stopped
    } else if tally.failed > 0 || tally.stopped > 0 {
        ArrayState::Failed
    } else {
        ArrayState::Done
    }
}

#[cfg(test)]
mod tests;
