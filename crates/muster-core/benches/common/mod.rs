//! What the benchmarks share.

/// A fixed pseudo-random sequence (xorshift), so every run measures the same cluster.
pub struct Sequence(pub u64);

impl Sequence {
    /// The next number below `n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}
