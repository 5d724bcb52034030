//! The attribute dictionary: job attribute sets interned by number, pinned while a row or a summary names
//! them, and their stored entries.

use super::*;

/// Job attributes by number, shared by folded rows: one entry per distinct attribute set, which fleets repeat
/// (same pool, team, project); chain ids and per-job labels make one per chain or job. Numbers are persisted in
/// summaries and never handed out twice. [`ColdJobs`] counts the rows that point to each entry: one no row points
/// to any more is *freed* (dropped from memory; its number waits in [`Dictionary::take_freed`] for the store to
/// delete it once the deletions that freed it are durable), so the dictionary never outgrows the rows. A summary
/// that still names a freed number is a hot job's stale one: restore rebuilds such a job from its events.
#[derive(Debug, Default)]
pub struct Dictionary {
    /// Entries by number; `None`: freed (or a gap in the store's numbers).
    pub(super) list: Vec<Option<Arc<JobAttrs>>>,
    /// Rows pointing to each entry.
    pub(super) refs: Vec<u32>,
    pub(super) ids: HashMap<Arc<JobAttrs>, u32>,
    /// Entries below this number are in the store.
    pub(super) persisted: u32,
    /// Estimated bytes of the entries (see [`attrs_bytes`]).
    pub(super) bytes: usize,
    /// Live entries.
    pub(super) live: usize,
    /// Stored entries freed since the last [`Dictionary::take_freed`].
    pub(super) freed: Vec<u32>,
    /// Sets the store held under more than one number (see [`Dictionary::load_with_next`]), with the live
    /// numbers: when the one `ids` maps to is freed, it maps to another.
    pub(super) dups: HashMap<Arc<JobAttrs>, Vec<u32>>,
}

/// Estimated bytes of one dictionary entry: the attributes behind their `Arc`, their strings and labels, and the
/// entry's share of the list and the map.
pub(super) fn attrs_bytes(a: &JobAttrs) -> usize {
    const STRING: usize = 16;
    let strings = [&a.provider, &a.pool, &a.gpu_class, &a.region, &a.team, &a.project, &a.chain_id, &a.chain_stage];
    let labels: usize = a.labels.iter().map(|(k, v)| 48 + k.len() + v.len() + 2 * STRING).sum();
    std::mem::size_of::<JobAttrs>() + 16 + 8 + 32 + strings.iter().map(|s| s.len()).sum::<usize>() + labels
}

impl Dictionary {
    /// The number of an attribute set, adding it if new.
    pub fn intern(&mut self, a: &Arc<JobAttrs>) -> u32 {
        if let Some(id) = self.ids.get(a) {
            return *id;
        }
        let id = self.list.len() as u32;
        self.bytes += attrs_bytes(a);
        self.live += 1;
        self.list.push(Some(a.clone()));
        self.refs.push(0);
        self.ids.insert(a.clone(), id);
        id
    }

    /// Holds entry `id` for a row about to be made from it (a fold writes the summary naming it first): it
    /// cannot be freed meanwhile. [`ColdJobs::insert_pinned`] hands the hold to the row; [`Dictionary::unpin`]
    /// gives it back if no row is made.
    pub fn pin(&mut self, id: u32) {
        self.add_ref(id);
    }

    /// Gives back a [`Dictionary::pin`] (which may free the entry).
    pub fn unpin(&mut self, id: u32) {
        self.drop_ref(id);
    }

    /// One more row points to entry `id`.
    pub(super) fn add_ref(&mut self, id: u32) {
        if let Some(r) = self.refs.get_mut(id as usize) {
            *r += 1;
        }
    }

    /// One row fewer points to entry `id`; the last one gone frees it.
    pub(super) fn drop_ref(&mut self, id: u32) {
        let Some(r) = self.refs.get_mut(id as usize) else { return };
        *r = r.saturating_sub(1);
        if *r == 0 {
            self.free(id);
        }
    }

    /// Drops entry `id` from memory (a stored one is listed for the store to delete).
    pub(super) fn free(&mut self, id: u32) {
        let Some(a) = self.list.get_mut(id as usize).and_then(Option::take) else { return };
        // (A set stored under two numbers maps to one of them: another live one takes its place.)
        let other = match self.dups.get_mut(&a) {
            Some(numbers) => {
                numbers.retain(|n| *n != id);
                numbers.first().copied()
            }
            None => None,
        };
        if self.ids.get(&a) == Some(&id) {
            match other {
                Some(n) => {
                    self.ids.insert(a.clone(), n);
                }
                None => {
                    self.ids.remove(&a);
                }
            }
        }
        self.bytes -= attrs_bytes(&a);
        self.live -= 1;
        if id < self.persisted {
            self.freed.push(id);
        }
    }

    /// Frees every entry no row points to (after a restore loaded the rows: entries only stale summaries or
    /// deleted jobs named). Returns how many.
    pub fn free_unreferenced(&mut self) -> usize {
        let unused: Vec<u32> = (0..self.list.len() as u32)
            .filter(|&id| self.list[id as usize].is_some() && self.refs[id as usize] == 0)
            .collect();
        for &id in &unused {
            self.free(id);
        }
        unused.len()
    }

    /// The stored entries freed since the last call, for the store to delete.
    pub fn take_freed(&mut self) -> Vec<u32> {
        std::mem::take(&mut self.freed)
    }

    /// Gives back numbers [`Dictionary::take_freed`] returned that the store could not delete (tried again later).
    pub fn return_freed(&mut self, ids: Vec<u32>) {
        self.freed.extend(ids);
    }

    /// Rows pointing to entry `id`.
    pub fn refs(&self, id: u32) -> u32 {
        self.refs.get(id as usize).copied().unwrap_or(0)
    }

    /// Estimated bytes of entry `id` (0 if freed).
    pub fn entry_bytes(&self, id: u32) -> usize {
        self.get(id).map_or(0, |a| attrs_bytes(a))
    }

    /// Estimated bytes of the entries, and of the slot every number handed out keeps (12 bytes, at the vectors'
    /// room): numbers are never reused, so a freed entry's slot stays, a fixed cost no deletion gives back.
    pub fn bytes(&self) -> usize {
        self.bytes + self.slot_bytes()
    }

    /// Estimated bytes of the live entries alone (without the slots).
    pub fn entry_total(&self) -> usize {
        self.bytes
    }

    /// Bytes of the per-number slots (see [`Dictionary::bytes`]): memory no deletion gives back.
    pub fn slot_bytes(&self) -> usize {
        self.list.capacity() * std::mem::size_of::<Option<Arc<JobAttrs>>>() + self.refs.capacity() * 4
    }

    /// The attributes of a number (`None`: never handed out, or freed).
    pub fn get(&self, id: u32) -> Option<&Arc<JobAttrs>> {
        self.list.get(id as usize)?.as_ref()
    }

    /// Numbers handed out, freed ones included (the next entry's number).
    pub fn len(&self) -> usize {
        self.list.len()
    }

    /// Whether no number was handed out.
    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// Entries in memory (not freed).
    pub fn live(&self) -> usize {
        self.live
    }

    /// Entries not yet stored: `(number, encoded)`.
    pub fn unpersisted(&self) -> Vec<(u32, Vec<u8>)> {
        (self.persisted..self.list.len() as u32)
            .filter_map(|id| Some((id, encode_attrs(self.list.get(id as usize)?.as_ref()?))))
            .collect()
    }

    /// Records that every entry below `upto` is stored.
    pub fn mark_persisted(&mut self, upto: u32) {
        self.persisted = self.persisted.max(upto);
    }

    /// Loads stored entries, in ascending numbers (freed numbers are gaps). No row points to them yet: rows
    /// loaded by [`ColdJobs::load`] count themselves, then [`Dictionary::free_unreferenced`] drops the rest.
    pub fn load(entries: Vec<(u32, Vec<u8>)>) -> Result<Dictionary, String> {
        Self::load_with_next(entries, 0)
    }

    /// [`Dictionary::load`], with the next number the store recorded (see [`Dictionary::len`]): numbers up to it
    /// may be named by summaries although their entries were deleted, so new entries take numbers from it on,
    /// never one a summary could name with another set.
    pub fn load_with_next(entries: Vec<(u32, Vec<u8>)>, next: u32) -> Result<Dictionary, String> {
        let mut d = Dictionary::default();
        for (id, body) in entries {
            if (id as usize) < d.list.len() {
                return Err(format!("dictionary entry {id} after {}", d.list.len() - 1));
            }
            let a: JobAttrs = postcard::from_bytes(&body).map_err(|e| format!("dictionary entry {id}: {e}"))?;
            let a = Arc::new(a);
            d.list.resize(id as usize, None);
            d.refs.resize(id as usize, 0);
            d.bytes += attrs_bytes(&a);
            d.live += 1;
            if let Some(first) = d.ids.insert(a.clone(), id) {
                // Two numbers of one set (freed, interned again, and the store stopped before it deleted the old
                // number): rows keep whichever they name; new rows take the first that lives.
                d.ids.insert(a.clone(), first);
                d.dups.entry(a.clone()).or_insert_with(|| vec![first]).push(id);
            }
            d.list.push(Some(a));
            d.refs.push(0);
        }
        if (next as usize) > d.list.len() {
            d.list.resize(next as usize, None);
            d.refs.resize(next as usize, 0);
        }
        d.persisted = d.list.len() as u32;
        Ok(d)
    }
}

pub(super) fn encode_attrs(a: &JobAttrs) -> Vec<u8> {
    postcard::to_stdvec(a).unwrap_or_default()
}
