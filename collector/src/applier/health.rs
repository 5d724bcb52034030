//! GPU health readings' write path: readings the ingest edge validated are added to the node health book and
//! stored (sled tree `node_health`, flushed) before the edge answers; at start the stored ones are loaded back.
//! Independent of the committer: readings are not lifecycle events and take no part in group commits.

use crate::index::nodes::HealthBook;
use crate::job::nodes::Reading;
use crate::store::{Store, StoreError};

/// Readings are kept this long.
pub const KEEP_MS: i64 = 30 * 86_400_000;

/// Writes readings to the book and the store.
#[derive(Clone)]
pub struct HealthWriter {
    /// Where readings are stored.
    pub store: Store,
    /// Where readings are kept in memory.
    pub book: HealthBook,
}

impl HealthWriter {
    /// Adds readings (a reading equal to its node's previous one within ten minutes is not kept) and stores the
    /// kept ones durably, deleting readings older than [`KEEP_MS`]; returns how many were kept. Blocking.
    pub fn write(&self, readings: Vec<(String, Reading)>, now: i64) -> Result<u32, StoreError> {
        let kept: Vec<(String, i64, Vec<u8>)> = readings
            .into_iter()
            .filter(|(node, r)| self.book.record(node, *r))
            .map(|(node, r)| (node, r.at_ms, postcard::to_stdvec(&r).unwrap_or_default()))
            .collect();
        if let Err(e) = self.store.save_health(&kept, now - KEEP_MS) {
            self.store.halt_after(&e);
            return Err(e);
        }
        Ok(kept.len() as u32)
    }

    /// Loads stored readings into the book, skipping damaged ones; returns how many were damaged. Blocking.
    pub fn load(&self, now: i64) -> Result<usize, StoreError> {
        let mut damaged = 0;
        for item in self.store.load_health()? {
            match item.and_then(|(node, body)| {
                postcard::from_bytes::<Reading>(&body).map(|r| (node, r)).map_err(|e| e.to_string())
            }) {
                Ok((node, r)) if r.at_ms >= now - KEEP_MS => {
                    self.book.record(&node, r);
                }
                Ok(_) => {}
                Err(e) => {
                    damaged += 1;
                    tracing::warn!(error = %e, "skipping a damaged node health reading");
                }
            }
        }
        Ok(damaged)
    }
}
