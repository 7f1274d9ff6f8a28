//! The key index's filters: blocked Bloom filters, one per run or per group of runs.

/// A blocked Bloom filter: each key sets `PROBES` bits of one 512-bit block, so a lookup
/// reads one cache line. Ten bits per key: about 1 % false positives.
pub(super) struct Filter {
    blocks: Vec<[u64; 8]>,
}

/// A run's filter: about 1 % false positives.
const BITS_PER_KEY: usize = 10;
const PROBES: u32 = 7;

impl Filter {
    /// A run's filter.
    pub(super) fn of(entries: &[(i64, i64)]) -> Self {
        let mut filter = Self::sized(entries.len(), BITS_PER_KEY);
        entries.iter().for_each(|(h, _)| filter.insert(*h));
        filter
    }

    /// An empty filter for `keys` keys at `bits_per_key`.
    pub(super) fn sized(keys: usize, bits_per_key: usize) -> Self {
        let blocks = keys.saturating_mul(bits_per_key).div_ceil(512).max(1);
        Self { blocks: vec![[0; 8]; blocks] }
    }

    pub(super) fn insert(&mut self, h: i64) {
        let (block, bits) = self.place(h);
        for (word, bit) in bits {
            self.blocks[block][word] |= bit;
        }
    }

    pub(super) fn may_hold(&self, h: i64) -> bool {
        let (block, bits) = self.place(h);
        let block = &self.blocks[block];
        bits.into_iter().all(|(word, bit)| block[word] & bit != 0)
    }

    /// The block of `h` (from its high half) and its bits there (from a mix of the rest).
    fn place(&self, h: i64) -> (usize, [(usize, u64); PROBES as usize]) {
        let h = h as u64;
        let block = (((h >> 32) * self.blocks.len() as u64) >> 32) as usize;
        let mut x = h;
        let bits = std::array::from_fn(|_| {
            x = x.wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(29) ^ (h >> 17);
            let bit = (x >> 55) as usize; // 0..512
            (bit / 64, 1u64 << (bit % 64))
        });
        (block, bits)
    }

    pub(super) fn to_bytes(&self) -> Vec<u8> {
        self.blocks.iter().flatten().flat_map(|w| w.to_le_bytes()).collect()
    }

    pub(super) fn from_bytes(bytes: &[u8]) -> Self {
        let words: Vec<u64> =
            bytes.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().expect("eight bytes"))).collect();
        let mut blocks: Vec<[u64; 8]> = words.chunks_exact(8).map(|c| c.try_into().expect("eight words")).collect();
        if blocks.is_empty() {
            blocks.push([!0; 8]); // damaged: holds everything, so nothing is missed
        }
        Self { blocks }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::sqlite::keys::{GROUP_BITS_PER_KEY, hash};

    fn entries(n: i64, salt: &str) -> Vec<(i64, i64)> {
        let mut e: Vec<_> = (0..n).map(|i| (hash(salt, &i.to_string()), i)).collect();
        e.sort();
        e
    }

    #[test]
    fn a_filter_holds_every_key_put_in_and_few_others_and_reads_back_from_its_bytes() {
        let put = entries(50_000, "in");
        let filter = Filter::from_bytes(&Filter::of(&put).to_bytes());
        assert!(put.iter().all(|(h, _)| filter.may_hold(*h)), "no false negatives");
        let others = entries(100_000, "out");
        let false_positives = others.iter().filter(|(h, _)| filter.may_hold(*h)).count();
        assert!(false_positives < 2_000, "{false_positives} of 100,000 keys not put in were held");
        assert!(false_positives > 0, "a filter that holds nothing else at 10 bits per key is not one");
    }

    #[test]
    fn a_group_filter_holds_every_key_put_in_and_fewer_others_than_a_run_filter() {
        let put = entries(50_000, "in");
        let mut filter = Filter::sized(put.len(), GROUP_BITS_PER_KEY);
        put.iter().for_each(|(h, _)| filter.insert(*h));
        let filter = Filter::from_bytes(&filter.to_bytes());
        assert!(put.iter().all(|(h, _)| filter.may_hold(*h)), "no false negatives");
        let false_positives = entries(100_000, "out").iter().filter(|(h, _)| filter.may_hold(*h)).count();
        assert!((1..400).contains(&false_positives), "{false_positives} of 100,000 keys not put in were held");
    }

    #[test]
    fn a_damaged_filter_holds_everything() {
        let filter = Filter::from_bytes(&[1, 2, 3]);
        assert!(entries(100, "x").iter().all(|(h, _)| filter.may_hold(*h)));
    }
}
