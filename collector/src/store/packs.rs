//! Summaries packed many to a sled value (tree `summaries`): the pack codec and the reads and rewrites the store
//! makes of packs.
//!
//! A fold writes its chunk's summaries, which have consecutive summary numbers, as one or more *packs* (at most
//! [`PACK_MAX_ENTRIES`] summaries or about [`PACK_MAX_RAW`] bytes each): key `[0xFE] ++ first number` (u64
//! big-endian), value a block in the log's format (see [`super::log`]; sealed as version [`PACK_VERSION`]) whose
//! entries are, per summary in number order, `varint(job id length) ++ job id ++ summary` (the summary being
//! `varint(n) ++ n varint sequence deltas ++ body`, unsealed: the pack's checksum covers it). Packs never overlap: a pack holds numbers from its key up to its last entry, and
//! numbers are never handed out twice. One value per ~25 summaries instead of one each: a restart reads a few
//! thousand compressed values per 100k folded jobs, not 100k small ones scattered over sled's file.
//!
//! Removing summaries (a job folded again replaces its old summary; retention deletes a job) rewrites each pack
//! touched without them, under the same key, or deletes it once empty, in the caller's batch; the caller holds
//! the store's pack lock from the read to the apply, so two removals never rewrite a pack from the same read.
//!
//! A pack that fails its checksum cannot say which jobs it held: restore then reads the whole log and brings back
//! hot every job found in it that has neither a record nor a usable summary (see `Store::restore_with`). The
//! damaged pack stays (deleting it before those jobs are durable elsewhere would lose them at the next crash),
//! and every restart repeats that scan while it exists.

use super::log::{self, Kind};
use super::StoreError;
use prost::encoding::{decode_varint, encode_varint};
use std::ops::RangeInclusive;

/// Seal version of a pack value.
pub(super) const PACK_VERSION: u8 = 4;
/// Packs, as blocks of the log's format.
pub(super) const PACKS: Kind = Kind { what: "summaries", version: PACK_VERSION };
/// First byte of a pack key (the tree holds packs only).
pub(super) const PACK_PREFIX: u8 = 0xFE;
/// At most this many summaries per pack.
pub(super) const PACK_MAX_ENTRIES: usize = 256;
/// A pack is closed once its entries reach this many bytes (before compression): the size the log's blocks
/// proved safe on a full disk (see `log::BLOCK_MAX_RAW`).
pub(super) const PACK_MAX_RAW: usize = 4 * 1024;

/// Key of the pack starting at summary number `first`.
pub(super) fn pack_key(first: u64) -> [u8; 9] {
    let mut k = [PACK_PREFIX; 9];
    k[1..].copy_from_slice(&first.to_be_bytes());
    k
}

/// The key range of every pack.
pub(super) fn all_packs() -> RangeInclusive<[u8; 9]> {
    pack_key(0)..=pack_key(u64::MAX)
}

/// The first summary number of a pack key.
pub(super) fn pack_first(key: &[u8]) -> Result<u64, StoreError> {
    match key {
        [PACK_PREFIX, rest @ ..] if rest.len() == 8 => {
            let mut a = [0u8; 8];
            a.copy_from_slice(rest);
            Ok(u64::from_be_bytes(a))
        }
        _ => Err(super::corrupt("summaries", key, "not a pack key")),
    }
}

/// One summary to pack: its number, job id and summary (`varint(n) ++ sequence deltas ++ body`).
pub(super) struct Entry<'a> {
    pub number: u64,
    pub job_id: &'a str,
    pub summary: &'a [u8],
}

fn entry_bytes(e: &Entry<'_>) -> Vec<u8> {
    let mut out = Vec::with_capacity(e.job_id.len() + e.summary.len() + 2);
    encode_varint(e.job_id.len() as u64, &mut out);
    out.extend_from_slice(e.job_id.as_bytes());
    out.extend_from_slice(e.summary);
    out
}

/// Splits entries (ascending numbers) into packs: `(first number, sealed value)`.
pub(super) fn encode_packs(entries: &[Entry<'_>]) -> Result<Vec<(u64, Vec<u8>)>, StoreError> {
    let framed: Vec<(u64, Vec<u8>)> = entries.iter().map(|e| (e.number, entry_bytes(e))).collect();
    let refs: Vec<(u64, &[u8])> = framed.iter().map(|(n, b)| (*n, b.as_slice())).collect();
    log::encode_blocks_of(PACKS, &refs, PACK_MAX_ENTRIES, PACK_MAX_RAW)
}

/// A decoded pack.
pub(super) struct Pack {
    block: log::Block,
}

impl Pack {
    /// Decodes a stored pack (checksum, header, every entry's framing; job ids are checked as they are read).
    pub fn decode(first: u64, v: &[u8]) -> Result<Pack, StoreError> {
        log::decode_block_of(PACKS, first, v).map(|block| Pack { block })
    }

    /// The pack's first summary number (its key).
    pub fn first(&self) -> u64 {
        self.block.first
    }

    /// The entries, in number order: `(number, job id, summary)`.
    pub fn entries(&self) -> impl Iterator<Item = Result<(u64, &str, &[u8]), StoreError>> + '_ {
        self.block.iter().map(move |(no, bytes)| split(self.block.first, no, bytes).map(|(id, s)| (no, id, s)))
    }

    /// The entry numbered `no`, if the pack holds it.
    pub fn get(&self, no: u64) -> Option<Result<(&str, &[u8]), StoreError>> {
        self.block.get(no).map(|bytes| split(self.block.first, no, bytes))
    }

    /// The sealed value of this pack without the entries at `gone` (`None`: nothing left, delete the pack).
    fn without(&self, gone: &[u64]) -> Result<Option<Vec<u8>>, StoreError> {
        let live: Vec<(u64, &[u8])> = self.block.iter().filter(|(no, _)| !gone.contains(no)).collect();
        if live.is_empty() {
            return Ok(None);
        }
        log::encode_block_of(PACKS, self.block.first, &live).map(Some)
    }
}

fn split(first: u64, no: u64, mut bytes: &[u8]) -> Result<(&str, &[u8]), StoreError> {
    let bad = |r: String| StoreError::Corrupt { what: "summaries", key: format!("pack {first} entry {no}"), reason: r };
    let len = decode_varint(&mut bytes).map_err(|e| bad(e.to_string()))?;
    let len = usize::try_from(len).ok().filter(|l| *l <= bytes.len()).ok_or_else(|| bad("job id truncated".into()))?;
    let (id, summary) = bytes.split_at(len);
    let id = std::str::from_utf8(id).map_err(|_| bad("job id is not UTF-8".into()))?;
    Ok((id, summary))
}

/// The pack whose number range starts at or below `no` (it may not hold `no`), with its key.
pub(super) fn pack_at(tree: &sled::Tree, no: u64) -> Result<Option<Pack>, StoreError> {
    match tree.range(pack_key(0)..=pack_key(no)).next_back() {
        Some(kv) => {
            let (k, v) = kv?;
            Pack::decode(pack_first(&k)?, &v).map(Some)
        }
        None => Ok(None),
    }
}

/// The highest summary number in any pack, or above it (0 without packs). A pack is written with consecutive
/// numbers (rewrites only remove some), so a damaged last pack holds none above its first plus
/// [`PACK_MAX_ENTRIES`]: that bound is returned then, and the store still opens.
pub(super) fn last_number(tree: &sled::Tree) -> Result<u64, StoreError> {
    match tree.range(all_packs()).next_back() {
        Some(kv) => {
            let (k, v) = kv?;
            let first = pack_first(&k)?;
            match log::block_meta_of(PACKS, first, &v) {
                Ok(meta) => Ok(meta.last),
                Err(e) if e.is_damage() => Ok(first.saturating_add(PACK_MAX_ENTRIES as u64)),
                Err(e) => Err(e),
            }
        }
        None => Ok(0),
    }
}

/// A summary removed from its pack: its number, job id and summary (`varint(n) ++ sequence deltas ++ body`).
pub(super) type Removed = (u64, String, Vec<u8>);

/// Plans removing the summaries `(job id, number)` held in packs (numbers in no pack, or whose entry belongs to
/// another job, are left alone): adds each touched pack's rewrite or delete to `batch` and returns what it
/// removes. The caller holds the pack lock until `batch` is applied. A pack that fails its checksum is left
/// alone (logged): nothing in it can be read or rewritten.
pub(super) fn plan_remove(
    tree: &sled::Tree,
    batch: &mut sled::Batch,
    wanted: &[(&str, u64)],
) -> Result<Vec<Removed>, StoreError> {
    let mut sorted: Vec<(u64, &str)> = wanted.iter().map(|(id, no)| (*no, *id)).collect();
    sorted.sort_unstable();
    sorted.dedup();
    let mut removed = Vec::new();
    let mut i = 0;
    while i < sorted.len() {
        let pack = match pack_at(tree, sorted[i].0) {
            Ok(Some(p)) => p,
            Ok(None) => {
                i += 1;
                continue;
            }
            Err(e) if e.is_damage() => {
                tracing::warn!(number = sorted[i].0, error = %e, "summary pack unreadable: its summaries stay");
                i += 1;
                continue;
            }
            Err(e) => return Err(e),
        };
        let last = pack.block.last();
        if sorted[i].0 > last {
            // In the gap after the pack's last summary: in no pack.
            i += 1;
            continue;
        }
        let mut gone = Vec::new();
        while i < sorted.len() && sorted[i].0 <= last {
            let (no, id) = sorted[i];
            i += 1;
            if let Some(entry) = pack.get(no) {
                let (held_by, summary) = entry?;
                if held_by == id {
                    gone.push(no);
                    removed.push((no, id.to_string(), summary.to_vec()));
                }
            }
        }
        if gone.is_empty() {
            continue;
        }
        match pack.without(&gone)? {
            Some(v) => batch.insert(&pack_key(pack.first()), v),
            None => batch.remove(&pack_key(pack.first())),
        }
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries(n: u64, from: u64) -> Vec<(u64, String, Vec<u8>)> {
        (from..from + n)
            .map(|no| (no, format!("job-{no:06}"), format!("summary {no} ").repeat(8).into_bytes()))
            .collect()
    }

    fn refs(e: &[(u64, String, Vec<u8>)]) -> Vec<Entry<'_>> {
        e.iter().map(|(no, id, s)| Entry { number: *no, job_id: id, summary: s }).collect()
    }

    #[test]
    fn packs_round_trip_split_by_size_and_never_overlap() {
        let want = entries(300, 17);
        let packs = encode_packs(&refs(&want)).expect("encode");
        assert!(packs.len() > 1, "300 summaries of ~100 bytes fill more than one pack");
        let mut got = Vec::new();
        let mut prev_last = 0;
        for (first, v) in &packs {
            assert_eq!(v[0], PACK_VERSION);
            let p = Pack::decode(*first, v).expect("decode");
            assert!(*first > prev_last, "packs do not overlap");
            prev_last = p.block.last();
            for e in p.entries() {
                let (no, id, s) = e.expect("entry");
                got.push((no, id.to_string(), s.to_vec()));
            }
        }
        assert_eq!(got, want);
        // A pack compresses: its value is well under its entries' bytes.
        let (first, v) = &packs[0];
        let p = Pack::decode(*first, v).expect("decode");
        let raw: usize = p.entries().map(|e| e.expect("entry").2.len()).sum();
        assert!(v.len() * 2 < raw, "{} bytes for {raw}", v.len());
    }

    #[test]
    fn a_damaged_pack_is_refused_naming_the_summaries_tree_and_its_first_number() {
        let want = entries(5, 40);
        let (first, v) = encode_packs(&refs(&want)).expect("encode").remove(0);
        let mut flipped = v.clone();
        let n = flipped.len();
        flipped[n - 3] ^= 0x10;
        let err = Pack::decode(first, &flipped).map(|_| ()).expect_err("checksum").to_string();
        assert!(err.contains("summaries") && err.contains("block 40"), "{err}");
        // A log block is not a pack (its seal version differs).
        let block = log::encode_block(40, &[(40, b"event".as_slice())]).expect("block");
        assert!(Pack::decode(40, &block).is_err());
        // An entry whose job id runs past its bytes is refused when read.
        let bad = log::encode_block_of(PACKS, 40, &[(40, [9u8, b'a'].as_slice())]).expect("encode");
        let p = Pack::decode(40, &bad).expect("framing is fine");
        let err = p.get(40).expect("held").map(|_| ()).expect_err("truncated").to_string();
        assert!(err.contains("pack 40 entry 40"), "{err}");
    }

    #[test]
    fn removal_rewrites_or_deletes_only_the_packs_it_touches_and_only_the_named_jobs_entries() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = sled::Config::new().path(dir.path()).open().expect("open");
        let tree = db.open_tree("summaries").expect("tree");
        let want = entries(120, 1);
        for (first, v) in encode_packs(&refs(&want)).expect("encode") {
            tree.insert(pack_key(first), v).expect("insert");
        }
        let packs_before = tree.range(all_packs()).count();
        assert_eq!(last_number(&tree).expect("last"), 120);
        // Remove 3 entries, one with the wrong job id (kept), one number in no pack (ignored).
        let mut batch = sled::Batch::default();
        let removed = plan_remove(
            &tree,
            &mut batch,
            &[("job-000005", 5), ("job-000090", 90), ("someone-else", 7), ("job-000500", 500), ("job-000005", 5)],
        )
        .expect("plan");
        tree.apply_batch(batch).expect("apply");
        assert_eq!(
            removed.iter().map(|(no, id, _)| (*no, id.as_str())).collect::<Vec<_>>(),
            [(5, "job-000005"), (90, "job-000090")]
        );
        assert_eq!(removed[0].2, want[4].2);
        let mut left = Vec::new();
        for kv in tree.range(all_packs()) {
            let (k, v) = kv.expect("read");
            let p = Pack::decode(pack_first(&k).expect("key"), &v).expect("decode");
            left.extend(p.entries().map(|e| e.expect("entry").0));
        }
        let expected: Vec<u64> = (1..=120).filter(|n| *n != 5 && *n != 90).collect();
        assert_eq!(left, expected);
        assert_eq!(tree.range(all_packs()).count(), packs_before, "rewritten in place, under the same keys");
        // Removing every entry of the first pack deletes it.
        let first_pack = Pack::decode(1, &tree.get(pack_key(1)).expect("get").expect("present")).expect("decode");
        let all: Vec<(String, u64)> =
            first_pack.entries().map(|e| e.expect("entry")).map(|(no, id, _)| (id.to_string(), no)).collect();
        let wanted: Vec<(&str, u64)> = all.iter().map(|(id, no)| (id.as_str(), *no)).collect();
        let mut batch = sled::Batch::default();
        plan_remove(&tree, &mut batch, &wanted).expect("plan");
        tree.apply_batch(batch).expect("apply");
        assert!(tree.get(pack_key(1)).expect("get").is_none());
        assert_eq!(tree.range(all_packs()).count(), packs_before - 1);
        assert_eq!(last_number(&tree).expect("last"), 120);
        assert!(pack_at(&tree, 0).expect("lookup").is_none(), "no pack starts at or below 0");
    }
}
