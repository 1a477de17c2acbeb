//! Gangs across nodes (issue 36, part 1): which nodes a reservation of whole GPUs over several
//! nodes takes, all or nothing. Pure: the caller gives each candidate node's free whole GPUs
//! (and the value of the label the gang must share, if any). Not yet used by placement.

/// A candidate node as a gang sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GangNode {
    /// The caller's number for the node.
    pub node: u32,
    /// Whole GPUs free on it (or, to ask what could ever fit, whole GPUs it has).
    pub free: u32,
    /// Its value of the label the gang must share (`--same-label KEY`); `None`: it has none.
    pub label: Option<String>,
}

/// What a gang asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GangAsk {
    /// Whole GPUs in all.
    pub count: u32,
    /// Exactly this many nodes; `None`: as few as can hold it.
    pub nodes: Option<u32>,
    /// Members may hold different numbers of GPUs (else `count / nodes` each).
    pub uneven: bool,
    /// All its nodes share one value of the label.
    pub same_label: bool,
}

/// Why a gang cannot be placed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GangError {
    #[error(
        "{nodes} nodes cannot hold {count} GPUs evenly; give a count they divide, or --uneven"
    )]
    Uneven { count: u32, nodes: u32 },
    #[error("a gang needs at least one GPU and one node")]
    Empty,
    #[error("no set of nodes has {count} GPUs free{}", if *same_label { " under one label value" } else { "" })]
    NoRoom { count: u32, same_label: bool },
}

/// The members of a placed gang, in rank order: each node and the GPUs it gives.
pub type Members = Vec<(u32, u32)>;

/// Places `ask` on `nodes`: as few nodes as hold it (or exactly `ask.nodes`), an equal share
/// each unless `uneven`, all under one label value when asked; among equal choices the nodes
/// with the least room to spare (best fit), so that big holes stay whole. Rank 0 is the
/// member with the most GPUs, then by node number.
pub fn place_gang(nodes: &[GangNode], ask: &GangAsk) -> Result<Members, GangError> {
    if ask.count == 0 || ask.nodes == Some(0) {
        return Err(GangError::Empty);
    }
    if let Some(n) = ask.nodes {
        if !ask.uneven && !ask.count.is_multiple_of(n) {
            return Err(GangError::Uneven {
                count: ask.count,
                nodes: n,
            });
        }
    }
    let mut best: Option<Members> = None;
    for group in groups(nodes, ask.same_label) {
        if let Some(m) = in_group(&group, ask) {
            let better = best
                .as_ref()
                .is_none_or(|b| (m.len(), spare(&group, &m)) < (b.len(), spare_of(nodes, b)));
            if better {
                best = Some(m);
            }
        }
    }
    best.ok_or(GangError::NoRoom {
        count: ask.count,
        same_label: ask.same_label,
    })
}

/// The largest count `ask`'s shape could ever have on nodes of this many GPUs each (their
/// `free` the GPUs they have): what a gang too large for the fleet is told.
pub fn largest(nodes: &[GangNode], ask: &GangAsk) -> u32 {
    let mut top = 0;
    for group in groups(nodes, ask.same_label) {
        let mut sizes: Vec<u32> = group.iter().map(|n| n.free).collect();
        sizes.sort_unstable_by(|a, b| b.cmp(a));
        let fits = match (ask.nodes, ask.uneven) {
            (Some(0), _) => 0,
            // Each member holds at least one GPU.
            (Some(k), true) if sizes.get(k as usize - 1).is_some_and(|s| *s > 0) => {
                sizes.iter().take(k as usize).sum()
            }
            (Some(_), true) => 0,
            (Some(k), false) => sizes.get(k as usize - 1).map_or(0, |smallest| smallest * k),
            (None, true) => sizes.iter().sum(),
            (None, false) => (1u32..)
                .zip(&sizes)
                .map(|(k, kth)| kth * k)
                .max()
                .unwrap_or(0),
        };
        top = top.max(fits);
    }
    top
}

/// The candidate nodes in the groups a gang may span: all of them, or each label value's.
fn groups(nodes: &[GangNode], same_label: bool) -> Vec<Vec<&GangNode>> {
    if !same_label {
        return vec![nodes.iter().collect()];
    }
    let mut by: std::collections::BTreeMap<&str, Vec<&GangNode>> = Default::default();
    for n in nodes {
        if let Some(l) = &n.label {
            by.entry(l.as_str()).or_default().push(n);
        }
    }
    by.into_values().collect()
}

/// The fewest nodes of one group that hold `ask` (exactly `ask.nodes` when given).
fn in_group(group: &[&GangNode], ask: &GangAsk) -> Option<Members> {
    let most = u32::try_from(group.len()).unwrap_or(u32::MAX);
    let sizes = match ask.nodes {
        Some(k) => k..=k,
        None => 1..=most,
    };
    for k in sizes {
        if k > most {
            return None;
        }
        let placed = if ask.uneven {
            uneven(group, ask.count, k)
        } else if ask.count.is_multiple_of(k) {
            even(group, ask.count / k, k)
        } else {
            None
        };
        if placed.is_some() {
            return placed;
        }
    }
    None
}

/// `k` nodes with `each` free, the tightest fits.
fn even(group: &[&GangNode], each: u32, k: u32) -> Option<Members> {
    let mut fit: Vec<&&GangNode> = group.iter().filter(|n| n.free >= each).collect();
    if fit.len() < k as usize {
        return None;
    }
    fit.sort_by_key(|n| (n.free, n.node));
    let mut members: Members = fit[..k as usize].iter().map(|n| (n.node, each)).collect();
    members.sort_by_key(|&(node, _)| node);
    Some(members)
}

/// `k` nodes holding `count` between them, each at least one: the roomiest `k` (fewest holes
/// left open), each filled in turn.
fn uneven(group: &[&GangNode], count: u32, k: u32) -> Option<Members> {
    let mut by_room: Vec<&&GangNode> = group.iter().filter(|n| n.free > 0).collect();
    by_room.sort_by_key(|n| (std::cmp::Reverse(n.free), n.node));
    let chosen = by_room.get(..k as usize)?;
    if chosen.iter().map(|n| n.free).sum::<u32>() < count {
        return None;
    }
    // Each gets one; the rest fills the roomiest first.
    let mut left = count.checked_sub(k)?;
    let mut members: Members = chosen
        .iter()
        .map(|n| {
            let more = (n.free - 1).min(left);
            left -= more;
            (n.node, 1 + more)
        })
        .collect();
    members.sort_by_key(|&(node, gpus)| (std::cmp::Reverse(gpus), node));
    Some(members)
}

/// GPUs the chosen nodes keep free after the gang.
fn spare(group: &[&GangNode], members: &Members) -> u32 {
    members
        .iter()
        .map(|(node, gpus)| {
            group
                .iter()
                .find(|n| n.node == *node)
                .map_or(0, |n| n.free - gpus)
        })
        .sum()
}

fn spare_of(nodes: &[GangNode], members: &Members) -> u32 {
    let all: Vec<&GangNode> = nodes.iter().collect();
    spare(&all, members)
}

#[cfg(test)]
mod tests;
