//! The chaos run's seeded generator: SplitMix64, written out so that a seed means the same
//! sequence whatever version of a random-number crate the workspace ends up with.

use std::time::Duration;

/// SplitMix64 over one `u64` of state.
#[derive(Debug, Clone)]
pub(super) struct Rng {
    state: u64,
}

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng { state: seed }
    }

    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (the modulo bias is irrelevant at these sizes).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next_u64() % n }
    }

    /// A duration between `lo` and `hi` milliseconds, both included.
    pub fn millis(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(lo + self.below(hi.saturating_sub(lo) + 1))
    }

    pub fn coin(&mut self) -> bool {
        self.next_u64() & 1 == 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_fixes_the_sequence() {
        let run = |seed| {
            let mut r = Rng::new(seed);
            (0..5).map(|_| r.next_u64()).collect::<Vec<_>>()
        };
        assert_eq!(run(9), run(9));
        assert_ne!(run(9), run(10));
        let mut r = Rng::new(1);
        for _ in 0..1000 {
            let d = r.millis(1000, 4000);
            assert!((1000..=4000).contains(&d.as_millis()));
        }
    }
}
