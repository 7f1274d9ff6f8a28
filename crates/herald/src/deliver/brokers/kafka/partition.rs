//! Which partition a key goes to: murmur2 of the key's bytes, made positive, modulo the
//! partition count, as Kafka's Java client (and librdkafka's `murmur2` partitioner)
//! choose it, so Herald's records land where a Java producer's with the same key would.

/// The partition of `count` that `key` goes to.
pub fn for_key(key: &[u8], count: usize) -> i32 {
    ((murmur2(key) & 0x7fff_ffff) as usize % count.max(1)) as i32
}

/// MurmurHash2, 32-bit, with Kafka's seed.
fn murmur2(data: &[u8]) -> u32 {
    const SEED: u32 = 0x9747_b28c;
    const M: u32 = 0x5bd1_e995;
    let mut h = SEED ^ data.len() as u32;
    let mut words = data.chunks_exact(4);
    for word in &mut words {
        let mut k = u32::from_le_bytes(word.try_into().expect("chunks of four"));
        k = k.wrapping_mul(M);
        k ^= k >> 24;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M) ^ k;
    }
    let tail = words.remainder();
    if !tail.is_empty() {
        for (i, byte) in tail.iter().enumerate() {
            h ^= u32::from(*byte) << (8 * i);
        }
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^ (h >> 15)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The values Kafka's own tests pin its Java `Utils.murmur2` to.
    #[test]
    fn murmur2_matches_the_java_clients() {
        for (key, expected) in [
            ("21", -973932308),
            ("foobar", -790332482),
            ("a-little-bit-long-string", -985981536),
            ("a-little-bit-longer-string", -1486304829),
            ("lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
            ("abc", 479470107),
        ] {
            assert_eq!(murmur2(key.as_bytes()) as i32, expected, "{key}");
        }
    }

    #[test]
    fn a_key_always_picks_the_same_partition_within_the_count() {
        for count in [1, 3, 16] {
            let p = for_key(b"app_2Ld8", count);
            assert!((0..count as i32).contains(&p));
            assert_eq!(p, for_key(b"app_2Ld8", count));
        }
        assert_eq!(for_key(b"", 0), 0);
    }
}
