//! The small trees beside the jobs: the attribute dictionary folded rows name, alert records, node health
//! readings.

use super::*;

impl Store {
    /// Every dictionary entry, `(number, body)`, in number order.
    pub fn load_dictionary(&self) -> Result<Vec<(u32, Vec<u8>)>, StoreError> {
        let t = self.t()?;
        let mut out = Vec::new();
        for kv in t.dictionary.iter() {
            let (k, v) = kv?;
            if k.as_ref() == DICTIONARY_NEXT_KEY {
                continue;
            }
            let arr: [u8; 4] = k.as_ref().try_into().map_err(|_| corrupt("dictionary", &k, "key is not 4 bytes"))?;
            let body = unseal(&v).map_err(|r| corrupt("dictionary", &k, r))?;
            out.push((u32::from_be_bytes(arr), body.to_vec()));
        }
        Ok(out)
    }

    /// Records `next`, the number the dictionary hands out next (not flushed: call it before the writes that use
    /// numbers below it, which sled keeps in order). A restore never hands out a number below it again.
    pub fn note_dictionary_next(&self, next: u32) -> Result<(), StoreError> {
        let t = self.w()?;
        t.dictionary.insert(DICTIONARY_NEXT_KEY, seal(&next.to_be_bytes()))?;
        Ok(())
    }

    /// The next dictionary number last recorded (0 if none: no fold has stored an entry yet).
    pub fn dictionary_next(&self) -> Result<u32, StoreError> {
        let t = self.t()?;
        Ok(sealed_array(&t.dictionary, "dictionary", DICTIONARY_NEXT_KEY)?.map_or(0, u32::from_be_bytes))
    }

    /// Deletes dictionary entries no summary of a folded job names any more (see `index::cold::Dictionary`).
    /// Not flushed: call it after the deletions that freed them are durable; an entry a crash keeps is freed
    /// again at the next restore.
    pub fn delete_dictionary(&self, ids: &[u32]) -> Result<(), StoreError> {
        if ids.is_empty() {
            return Ok(());
        }
        let t = self.w()?;
        let mut batch = sled::Batch::default();
        for id in ids {
            batch.remove(&id.to_be_bytes());
        }
        t.dictionary.apply_batch(batch)?;
        Ok(())
    }

    /// Saves alert records (by key) and flushes, so a restart neither loses a firing alert nor re-pages a
    /// resolved one. Each value is `(key, body)`, the body encoded by the alert module; the store seals it.
    pub fn save_alerts(&self, alerts: &[(String, Vec<u8>)]) -> Result<(), StoreError> {
        let t = self.w()?;
        let mut batch = sled::Batch::default();
        for (key, body) in alerts {
            batch.insert(key.as_bytes(), seal(body));
        }
        t.alerts.apply_batch(batch)?;
        t.db.flush()?;
        Ok(())
    }

    /// Stores node health readings (`node ++ 0 ++ at_ms big-endian` -> sealed body) and flushes: an
    /// acknowledged reading survives a crash. Readings older than `keep_from_ms` are deleted in the same batch.
    pub fn save_health(&self, readings: &[(String, i64, Vec<u8>)], keep_from_ms: i64) -> Result<(), StoreError> {
        let t = self.w()?;
        let mut batch = sled::Batch::default();
        for (node, at, body) in readings {
            let mut k = node.as_bytes().to_vec();
            k.push(0);
            k.extend_from_slice(&at.to_be_bytes());
            batch.insert(k, seal(body));
            // Each node's readings are in time order after its name: drop those past retention.
            let mut prefix = node.as_bytes().to_vec();
            prefix.push(0);
            for kv in t.node_health.scan_prefix(&prefix) {
                let (k, _) = kv?;
                let at_old = k.get(prefix.len()..).and_then(|b| b.try_into().ok()).map(i64::from_be_bytes);
                match at_old {
                    Some(a) if a < keep_from_ms => batch.remove(k),
                    _ => break,
                }
            }
        }
        t.node_health.apply_batch(batch)?;
        t.db.flush()?;
        Ok(())
    }

    /// Every stored node health reading: `(node, body)` in node and time order; damaged values are reported as
    /// errors (the caller skips them).
    pub fn load_health(&self) -> Result<Vec<StoredReading>, StoreError> {
        let t = self.t()?;
        let mut out = Vec::new();
        for kv in t.node_health.iter() {
            let (k, v) = kv?;
            let node = k.split(|b| *b == 0).next().map(|n| String::from_utf8_lossy(n).into_owned()).unwrap_or_default();
            out.push(unseal(&v).map(|b| (node.clone(), b.to_vec())).map_err(|e| format!("node_health {node:?}: {e}")));
        }
        Ok(out)
    }

    /// Forgets alert records.
    pub fn delete_alerts(&self, keys: &[String]) -> Result<(), StoreError> {
        let t = self.w()?;
        let mut batch = sled::Batch::default();
        for k in keys {
            batch.remove(k.as_bytes());
        }
        t.alerts.apply_batch(batch)?;
        Ok(())
    }

    /// Every stored alert record as `(key, body)`, the body unsealed and checked (a legacy bare-JSON value is
    /// returned as stored), then turned into `T` by its owner's codec; `T = (String, Vec<u8>)` keeps the raw pairs.
    pub fn load_alerts<T>(&self) -> Result<Vec<T>, StoreError>
    where
        T: TryFrom<(String, Vec<u8>)>,
        T::Error: std::fmt::Display,
    {
        let t = self.t()?;
        let mut out = Vec::new();
        for kv in t.alerts.iter() {
            let (k, v) = kv?;
            let body = unseal(&v).map_err(|r| corrupt("alerts", &k, r))?;
            let pair = (String::from_utf8_lossy(&k).into_owned(), body.to_vec());
            out.push(T::try_from(pair).map_err(|e| corrupt("alerts", &k, e))?);
        }
        Ok(out)
    }
}
