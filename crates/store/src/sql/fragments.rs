//! SQL fragments that mean one thing, named once. Each is a macro that expands to a string
//! literal, so that the statements using it stay `&'static str` (`concat!`); a const gives the
//! same text to statements built with `format!`.

/// A reservation that is live: queued or placed, and not ended (stopping still holds its GPUs
/// until its agent confirms).
macro_rules! live_statuses {
    () => {
        "('pending', 'starting', 'running', 'stopping')"
    };
}

/// A live reservation that no stop has reached yet: what a stop, a drain or a preemption can
/// still end.
macro_rules! unstopped_statuses {
    () => {
        "('pending', 'starting', 'running')"
    };
}

// Not used in these files yet: reservations.rs and queue.rs (placement's) state it by hand.
#[allow(unused_macros)]
/// A node placement may use, as the row `$n` (`"n"`), heard from at or after the parameter
/// `$live` (`"$3"`): verified, healthy and ready (not draining, not lost).
macro_rules! placeable_node {
    ($n:literal, $live:literal) => {
        concat!(
            $n,
            ".last_seen_at >= ",
            $live,
            " AND ",
            $n,
            ".verified <> 0 AND ",
            $n,
            ".healthy <> 0 AND ",
            $n,
            ".status = 'ready'"
        )
    };
}

/// When a reservation's (or its meter's) hours are up, in unix microseconds: its effective
/// start plus its duration.
macro_rules! ends_at {
    () => {
        "started_at + duration_s * 1000000"
    };
}

#[allow(unused_imports)] // placeable_node, until placement's files use it
pub(crate) use {live_statuses, placeable_node, unstopped_statuses};

pub(crate) const ENDS_AT: &str = ends_at!();

#[cfg(test)]
mod tests {
    #[test]
    fn a_placeable_node_reads_as_the_placement_wrote_it() {
        assert_eq!(
            placeable_node!("n", "$3"),
            "n.last_seen_at >= $3 AND n.verified <> 0 AND n.healthy <> 0 AND n.status = 'ready'"
        );
    }
}
