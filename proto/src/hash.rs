//! Stable hashes: FNV-1a, 64-bit (Fowler, Noll, Vo; IETF draft-eastlake-fnv), whose output is fixed by its
//! specification and never changes between Rust releases, unlike `std`'s `DefaultHasher`. Used wherever a hash is
//! persisted or must agree across processes and versions: the collector's event-id index (stored in job
//! snapshots) and the node agent's content-derived event ids.

const OFFSET_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
const PRIME: u64 = 0x0000_0100_0000_01b3;

/// An incremental FNV-1a 64-bit hasher.
#[derive(Debug, Clone, Copy)]
pub struct Fnv1a64(u64);

impl Default for Fnv1a64 {
    fn default() -> Self {
        Fnv1a64(OFFSET_BASIS)
    }
}

impl Fnv1a64 {
    /// Feeds bytes.
    pub fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 ^= u64::from(*b);
            self.0 = self.0.wrapping_mul(PRIME);
        }
    }

    /// Feeds a length-prefixed field (u64 little-endian length, then the bytes), so that concatenated fields
    /// cannot be confused with each other (`"ab","c"` vs `"a","bc"`).
    pub fn write_field(&mut self, bytes: &[u8]) {
        self.write(&(bytes.len() as u64).to_le_bytes());
        self.write(bytes);
    }

    /// The hash of everything fed so far.
    pub fn finish(&self) -> u64 {
        self.0
    }
}

/// FNV-1a 64 of `bytes`.
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h = Fnv1a64::default();
    h.write(bytes);
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_specifications_test_vectors() {
        // From the FNV reference test suite (draft-eastlake-fnv, appendix C / isthe.com/chongo/src/fnv/test_fnv.c).
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a64(b"foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn length_prefixed_fields_do_not_alias() {
        let mut a = Fnv1a64::default();
        a.write_field(b"ab");
        a.write_field(b"c");
        let mut b = Fnv1a64::default();
        b.write_field(b"a");
        b.write_field(b"bc");
        assert_ne!(a.finish(), b.finish());
    }
}
