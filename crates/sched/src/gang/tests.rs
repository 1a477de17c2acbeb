use proptest::prelude::*;

use super::*;

fn fleet() -> impl Strategy<Value = Vec<GangNode>> {
    prop::collection::vec((0u32..=8, prop::option::of(0u8..3)), 1..7).prop_map(|nodes| {
        nodes
            .into_iter()
            .zip(0u32..)
            .map(|((free, label), node)| GangNode {
                node,
                free,
                label: label.map(|l| format!("fabric-{l}")),
            })
            .collect()
    })
}

fn ask() -> impl Strategy<Value = GangAsk> {
    (
        1u32..=24,
        prop::option::of(1u32..=4),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(|(count, nodes, uneven, same_label)| GangAsk {
            count,
            nodes,
            uneven,
            same_label,
        })
}

/// Whether `members` is a valid placement of `ask` on `nodes`.
fn valid(nodes: &[GangNode], ask: &GangAsk, members: &Members) -> bool {
    let mut seen = std::collections::HashSet::new();
    let all_fit = members.iter().all(|(node, gpus)| {
        seen.insert(*node)
            && *gpus > 0
            && nodes
                .iter()
                .find(|n| n.node == *node)
                .is_some_and(|n| n.free >= *gpus)
    });
    let sum: u32 = members.iter().map(|(_, g)| g).sum();
    let even = ask.uneven || members.iter().all(|(_, g)| *g == members[0].1);
    let count_ok = ask.nodes.is_none_or(|k| members.len() == k as usize);
    let labels: std::collections::HashSet<Option<&String>> = members
        .iter()
        .map(|(node, _)| {
            nodes
                .iter()
                .find(|n| n.node == *node)
                .and_then(|n| n.label.as_ref())
        })
        .collect();
    let label_ok = !ask.same_label || (labels.len() == 1 && !labels.contains(&None));
    all_fit && sum == ask.count && even && count_ok && label_ok
}

/// The fewest nodes any valid placement takes, by trying every subset (small fleets only).
fn fewest(nodes: &[GangNode], ask: &GangAsk) -> Option<usize> {
    let n = nodes.len();
    let mut best: Option<usize> = None;
    for mask in 1u32..(1 << n) {
        let chosen: Vec<&GangNode> = (0..n)
            .filter(|i| mask & (1 << i) != 0)
            .map(|i| &nodes[i])
            .collect();
        let k = u32::try_from(chosen.len()).unwrap();
        if ask.nodes.is_some_and(|want| want != k) {
            continue;
        }
        if ask.same_label {
            let first = &chosen[0].label;
            if first.is_none() || chosen.iter().any(|c| &c.label != first) {
                continue;
            }
        }
        let fits = if ask.uneven {
            ask.count >= k
                && chosen.iter().all(|c| c.free > 0)
                && chosen.iter().map(|c| c.free).sum::<u32>() >= ask.count
        } else {
            ask.count.is_multiple_of(k) && chosen.iter().all(|c| c.free >= ask.count / k)
        };
        if fits {
            best = Some(best.map_or(k as usize, |b| b.min(k as usize)));
        }
    }
    best
}

proptest! {
    /// A gang is placed exactly when some placement exists, on the fewest nodes any takes,
    /// each member within its node's free GPUs, all of them or nothing.
    #[test]
    fn gangs_are_whole_and_as_tight_as_can_be(nodes in fleet(), ask in ask()) {
        if ask.nodes.is_some_and(|k| !ask.uneven && !ask.count.is_multiple_of(k)) {
            let refused = matches!(place_gang(&nodes, &ask), Err(GangError::Uneven { .. }));
            prop_assert!(refused, "an uneven split is refused");
            return Ok(());
        }
        match (place_gang(&nodes, &ask), fewest(&nodes, &ask)) {
            (Ok(members), Some(k)) => {
                prop_assert!(valid(&nodes, &ask, &members), "{members:?}");
                prop_assert_eq!(members.len(), k, "{:?}", members);
            }
            (Err(GangError::NoRoom { .. }), None) => {}
            (got, want) => prop_assert!(false, "placed {:?}, fewest {:?}", got, want),
        }
    }

    /// What a gang too large is told fits, on the fleet empty; nothing larger does.
    #[test]
    fn the_largest_said_is_the_largest(nodes in fleet(), ask in ask()) {
        let top = largest(&nodes, &ask);
        if top > 0 {
            let fits = GangAsk { count: top, ..ask };
            prop_assert!(place_gang(&nodes, &fits).is_ok(), "{top}");
        }
        for more in top + 1..top + 4 {
            let too_big = GangAsk { count: more, ..ask };
            prop_assert!(place_gang(&nodes, &too_big).is_err(), "{more} > {top}");
        }
    }
}

#[test]
fn sixteen_on_eight_gpu_servers_is_two_of_them() {
    let node = |node, free, label: &str| GangNode {
        node,
        free,
        label: Some(label.to_owned()),
    };
    let fleet = [
        node(0, 8, "a"),
        node(1, 4, "a"),
        node(2, 8, "b"),
        node(3, 8, "b"),
    ];
    let ask = GangAsk {
        count: 16,
        nodes: None,
        uneven: false,
        same_label: false,
    };
    assert_eq!(place_gang(&fleet, &ask), Ok(vec![(0, 8), (2, 8)]));
    // Under one label, only fabric b has two free 8-GPU nodes.
    let same = GangAsk {
        same_label: true,
        ..ask
    };
    assert_eq!(place_gang(&fleet, &same), Ok(vec![(2, 8), (3, 8)]));
    // Four members of four.
    let four = GangAsk {
        nodes: Some(4),
        ..ask
    };
    assert_eq!(
        place_gang(&fleet, &four),
        Ok(vec![(0, 4), (1, 4), (2, 4), (3, 4)])
    );
    assert_eq!(
        place_gang(
            &fleet,
            &GangAsk {
                nodes: Some(3),
                ..ask
            }
        ),
        Err(GangError::Uneven {
            count: 16,
            nodes: 3
        })
    );
    // 20 unevenly: 8 + 8 + 4 beats anything on two nodes (which cannot hold it).
    let twenty = GangAsk {
        count: 20,
        uneven: true,
        ..ask
    };
    let placed = place_gang(&fleet, &twenty).unwrap();
    assert_eq!(placed.len(), 3, "{placed:?}");
    assert_eq!(largest(&fleet, &ask), 24);
    assert_eq!(largest(&fleet, &same), 16);
}
