//! A small seeded random generator (SplitMix64) for the simulator: the same seed gives the same
//! experiment on every platform and every version of the dependencies.

#[derive(Debug, Clone)]
pub struct SimRng {
    state: u64,
}

impl SimRng {
    pub fn new(seed: u64) -> Self {
        SimRng { state: seed }
    }

    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    #[allow(clippy::cast_possible_truncation)] // taking the halves of a u128 is the intent
    /// A uniform number in `0..n` (`n > 0`; 0 for `n == 0`), by Lemire's multiply-shift with
    /// rejection, so there is no modulo bias.
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            return 0;
        }
        let threshold = n.wrapping_neg() % n;
        loop {
            let m = u128::from(self.next_u64()) * u128::from(n);
            // The low half decides rejection; the high half is the result (< n, fits in u64).
            let (low, high) = (m as u64, (m >> 64) as u64);
            if low >= threshold {
                return high;
            }
        }
    }

    pub fn below_usize(&mut self, n: usize) -> usize {
        // usize fits in u64 on every supported target, and the result is below n.
        usize::try_from(self.below(n as u64)).unwrap_or(0)
    }

    /// Fisher-Yates shuffle.
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.below_usize(i + 1);
            items.swap(i, j);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_sequence_and_bounded() {
        let (mut a, mut b) = (SimRng::new(42), SimRng::new(42));
        for n in 1..1000u64 {
            let x = a.below(n);
            assert_eq!(x, b.below(n));
            assert!(x < n);
        }
        assert_ne!(SimRng::new(1).next_u64(), SimRng::new(2).next_u64());
    }

    #[test]
    fn shuffle_is_a_permutation() {
        let mut v: Vec<u32> = (0..100).collect();
        SimRng::new(7).shuffle(&mut v);
        let mut s = v.clone();
        s.sort_unstable();
        assert_eq!(s, (0..100).collect::<Vec<_>>());
        assert_ne!(v, s);
    }
}
