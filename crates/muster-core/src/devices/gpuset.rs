//! `GpuSet`: a set of GPU indices on one node, as a 64-bit mask.
//! Only set algebra lives here; what a set costs or who holds it lives elsewhere.

use std::fmt;

/// Most GPUs one node may have: one bit per GPU in a `u64`.
pub const MAX_GPUS: usize = 64;

/// A set of GPU indices (0..64) on one node; bit `i` set means GPU `i` is in the set.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct GpuSet(u64);

impl GpuSet {
    /// The empty set.
    pub const EMPTY: GpuSet = GpuSet(0);

    /// The set whose mask is `bits`.
    pub const fn from_bits(bits: u64) -> Self {
        GpuSet(bits)
    }

    /// The raw mask.
    pub const fn bits(self) -> u64 {
        self.0
    }

    /// GPUs `0..n`; `n` above 64 is clamped to 64.
    pub const fn first(n: usize) -> Self {
        if n >= MAX_GPUS { GpuSet(u64::MAX) } else { GpuSet((1u64 << n) - 1) }
    }

    /// The set holding only `index`, or `None` when `index` is 64 or more.
    pub const fn single(index: usize) -> Option<Self> {
        if index < MAX_GPUS { Some(GpuSet(1u64 << index)) } else { None }
    }

    /// The set of `indices`, or `None` when one of them is 64 or more.
    pub fn from_indices<I: IntoIterator<Item = usize>>(indices: I) -> Option<Self> {
        let mut set = GpuSet::EMPTY;
        for i in indices {
            set = set.with(i)?;
        }
        Some(set)
    }

    /// This set plus `index`, or `None` when `index` is 64 or more.
    pub const fn with(self, index: usize) -> Option<Self> {
        match GpuSet::single(index) {
            Some(s) => Some(GpuSet(self.0 | s.0)),
            None => None,
        }
    }

    /// Whether `index` is in the set (indices of 64 or more never are).
    pub const fn contains(self, index: usize) -> bool {
        index < MAX_GPUS && self.0 & (1u64 << index) != 0
    }

    /// Number of GPUs in the set.
    pub const fn len(self) -> usize {
        self.0.count_ones() as usize
    }

    /// Whether the set is empty.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// GPUs in either set.
    pub const fn union(self, other: GpuSet) -> GpuSet {
        GpuSet(self.0 | other.0)
    }

    /// GPUs in both sets.
    pub const fn intersection(self, other: GpuSet) -> GpuSet {
        GpuSet(self.0 & other.0)
    }

    /// GPUs in this set and not in `other`.
    pub const fn difference(self, other: GpuSet) -> GpuSet {
        GpuSet(self.0 & !other.0)
    }

    /// Whether every GPU of this set is in `other`.
    pub const fn is_subset(self, other: GpuSet) -> bool {
        self.0 & !other.0 == 0
    }

    /// Whether the two sets share no GPU.
    pub const fn is_disjoint(self, other: GpuSet) -> bool {
        self.0 & other.0 == 0
    }

    /// The lowest index in the set.
    pub const fn lowest(self) -> Option<usize> {
        if self.0 == 0 { None } else { Some(self.0.trailing_zeros() as usize) }
    }

    /// The `n` lowest indices of the set, or `None` when it has fewer than `n`.
    pub const fn lowest_n(self, n: usize) -> Option<GpuSet> {
        if self.len() < n {
            return None;
        }
        let (mut rest, mut out, mut taken) = (self.0, 0u64, 0);
        while taken < n {
            let lowest = rest & rest.wrapping_neg();
            out |= lowest;
            rest &= !lowest;
            taken += 1;
        }
        Some(GpuSet(out))
    }

    /// The indices in ascending order.
    pub fn iter(self) -> GpuSetIter {
        GpuSetIter(self.0)
    }
}

/// Ascending iterator over the indices of a [`GpuSet`].
#[derive(Clone, Debug)]
pub struct GpuSetIter(u64);

impl Iterator for GpuSetIter {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        if self.0 == 0 {
            return None;
        }
        let i = self.0.trailing_zeros() as usize;
        self.0 &= self.0 - 1;
        Some(i)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = self.0.count_ones() as usize;
        (n, Some(n))
    }
}

impl ExactSizeIterator for GpuSetIter {}

impl IntoIterator for GpuSet {
    type Item = usize;
    type IntoIter = GpuSetIter;

    fn into_iter(self) -> GpuSetIter {
        self.iter()
    }
}

/// Prints the indices the way the `gpu.muster.dev/indices` annotation holds them: `0,1,4,5`.
impl fmt::Display for GpuSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (n, i) in self.iter().enumerate() {
            if n > 0 {
                f.write_str(",")?;
            }
            write!(f, "{i}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for GpuSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "GpuSet{{{self}}}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_clamps_at_64() {
        assert_eq!(GpuSet::first(0), GpuSet::EMPTY);
        assert_eq!(GpuSet::first(3).bits(), 0b111);
        assert_eq!(GpuSet::first(64).len(), 64);
        assert_eq!(GpuSet::first(200).len(), 64);
    }

    #[test]
    fn indices_of_64_or_more_are_refused() {
        assert_eq!(GpuSet::single(64), None);
        assert_eq!(GpuSet::from_indices([1, 64]), None);
        assert!(!GpuSet::first(64).contains(64));
        assert_eq!(GpuSet::single(63).map(|s| s.bits()), Some(1 << 63));
    }

    #[test]
    fn iterates_ascending_and_displays_as_annotation() {
        let s = GpuSet::from_indices([5, 0, 4, 1]).unwrap_or_default();
        assert_eq!(s.iter().collect::<Vec<_>>(), vec![0, 1, 4, 5]);
        assert_eq!(s.to_string(), "0,1,4,5");
        assert_eq!(GpuSet::EMPTY.to_string(), "");
        assert_eq!(s.lowest(), Some(0));
    }

    #[test]
    fn lowest_n_takes_the_lowest_indices() {
        let s = GpuSet::from_bits(0b1011_0100);
        assert_eq!(s.lowest_n(0), Some(GpuSet::EMPTY));
        assert_eq!(s.lowest_n(2), Some(GpuSet::from_bits(0b0001_0100)));
        assert_eq!(s.lowest_n(4), Some(s));
        assert_eq!(s.lowest_n(5), None);
        assert_eq!(GpuSet::first(64).lowest_n(64), Some(GpuSet::first(64)));
    }

    #[test]
    fn set_algebra() {
        let a = GpuSet::from_bits(0b1100);
        let b = GpuSet::from_bits(0b0110);
        assert_eq!(a.union(b).bits(), 0b1110);
        assert_eq!(a.intersection(b).bits(), 0b0100);
        assert_eq!(a.difference(b).bits(), 0b1000);
        assert!(a.intersection(b).is_subset(a));
        assert!(!a.is_disjoint(b));
        assert!(a.difference(b).is_disjoint(b));
    }
}
