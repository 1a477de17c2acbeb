//! Which GPUs of a node share a PCIe switch, from what NVML says of each pair of them.

/// Numbers the groups of GPUs `0..n` joined by `near` (two GPUs under one PCIe switch, or
/// closer), in the order of each group's lowest index. `near` answers `None` where the topology
/// cannot be read; then nothing is known and every GPU's group is `None`.
pub(crate) fn switch_groups(
    n: usize,
    mut near: impl FnMut(usize, usize) -> Option<bool>,
) -> Vec<Option<u32>> {
    // Union-find with each set named by its lowest member.
    let mut root: Vec<usize> = (0..n).collect();
    fn find(root: &mut [usize], mut i: usize) -> usize {
        while root[i] != i {
            root[i] = root[root[i]];
            i = root[i];
        }
        i
    }
    for i in 0..n {
        for j in i + 1..n {
            match near(i, j) {
                None => return vec![None; n],
                Some(false) => {}
                Some(true) => {
                    let (a, b) = (find(&mut root, i), find(&mut root, j));
                    root[a.max(b)] = a.min(b);
                }
            }
        }
    }
    let mut number: Vec<Option<u32>> = vec![None; n];
    let mut next = 0u32;
    (0..n)
        .map(|i| {
            let r = find(&mut root, i);
            Some(*number[r].get_or_insert_with(|| {
                next += 1;
                next - 1
            }))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Eight GPUs, two switches of four: 0-3 and 4-7 (NVML answers per pair).
    #[test]
    fn two_switches_of_four() {
        let groups = switch_groups(8, |i, j| Some(i / 4 == j / 4));
        let (a, b) = (Some(0), Some(1));
        assert_eq!(groups, [a, a, a, a, b, b, b, b]);
    }

    #[test]
    fn interleaved_groups_are_numbered_by_their_lowest_gpu() {
        let groups = switch_groups(4, |i, j| Some(i % 2 == j % 2));
        assert_eq!(groups, [Some(0), Some(1), Some(0), Some(1)]);
    }

    #[test]
    fn one_unreadable_pair_means_unknown() {
        let groups = switch_groups(3, |i, j| if (i, j) == (1, 2) { None } else { Some(true) });
        assert_eq!(groups, [None, None, None]);
        assert_eq!(switch_groups(1, |_, _| None), [Some(0)]);
        assert!(switch_groups(0, |_, _| Some(true)).is_empty());
    }
}
