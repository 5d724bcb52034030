//! After store writes halted (`crate::health::WriteHalt`): the watch that restarts the process once the store's
//! file system is writable again.
//!
//! A halted process never touches sled again (sled may wait for ever on an I/O buffer whose write failed: in a
//! flush, a later write, or the drop of the database), so it cannot recover in place. It keeps answering: ingest
//! gets `UNAVAILABLE` with the cause at once, `/healthz` says why, reads are served. This thread looks at the
//! store's directory every [`Watch::every`]: once it has [`Watch::min_free`] bytes free and a probe file can be
//! created, written, synced and removed there, continuously for [`Watch::settle`], it hands over to the
//! configured restart ([`AfterWriteFailure`]): the process runs again in place (`exec`: same process id,
//! arguments and listening addresses, every thread and file of the halted one gone) or exits with
//! [`EXIT_RESTART`] for its supervisor. Nothing acknowledged is lost either way: acknowledged events are in the
//! log's synced files, and the next start reads them back like after a crash.
//!
//! The watch is a plain thread, independent of the runtime, whose workers a stuck store call may hold.

use crate::store::Store;
use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// The exit code after a halt when `store.after_write_failure = "exit"` (sysexits' `EX_TEMPFAIL`: try again).
pub const EXIT_RESTART: i32 = 75;

/// The probe file written in the store's directory to tell that it is writable.
const PROBE_FILE: &str = "write-probe.tmp";
/// Bytes the probe writes (enough for a write to need a fresh block on any file system).
const PROBE_BYTES: usize = 64 << 10;

/// What the process does once the store is writable again after writes halted (`store.after_write_failure`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AfterWriteFailure {
    /// Runs again in place (`exec`): same process id, arguments, environment and listening addresses.
    #[default]
    Restart,
    /// Exits with [`EXIT_RESTART`], for a supervisor (systemd's `Restart=on-failure`, Kubernetes) to restart.
    Exit,
}

impl AfterWriteFailure {
    /// The configuration's word for it.
    pub fn as_str(self) -> &'static str {
        match self {
            AfterWriteFailure::Restart => "restart",
            AfterWriteFailure::Exit => "exit",
        }
    }
}

/// How the watch looks at the store's file system.
#[derive(Debug, Clone, Copy)]
pub struct Watch {
    /// How often.
    pub every: Duration,
    /// Free bytes the file system must have (sled torn by a write that hits `ENOSPC` right after a start on a
    /// nearly full disk could refuse its own log at the next open).
    pub min_free: u64,
    /// How long the file system must stay writable before the restart (a disk that flaps restarts once).
    pub settle: Duration,
}

impl Default for Watch {
    fn default() -> Self {
        Watch { every: Duration::from_millis(250), min_free: 4 << 20, settle: Duration::from_secs(1) }
    }
}

/// Starts the watch: once writes halted and the store is writable again (see the module doc), `restart` is
/// called with the halt's cause, once, unless `stop` was cancelled first (a stop under way is not turned into a
/// restart).
pub fn spawn(
    store: Store,
    watch: Watch,
    stop: CancellationToken,
    restart: Box<dyn FnOnce(&'static str) + Send>,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new().name("startline-halt-watch".into()).spawn(move || {
        let mut writable_since: Option<Instant> = None;
        let mut said: Option<String> = None;
        while !stop.is_cancelled() {
            std::thread::sleep(watch.every);
            let Some(cause) = store.halted() else { continue };
            match writable(store.path(), watch.min_free) {
                Ok(()) => {
                    let since = *writable_since.get_or_insert_with(Instant::now);
                    if since.elapsed() >= watch.settle && !stop.is_cancelled() {
                        tracing::warn!(cause, "the store is writable again; restarting to resume ingest");
                        restart(cause);
                        return;
                    }
                }
                Err(why) => {
                    writable_since = None;
                    if said.as_deref() != Some(why.as_str()) {
                        tracing::warn!(cause, %why, "store writes halted; waiting for the store to be writable");
                        said = Some(why);
                    }
                }
            }
        }
    })
}

/// Whether `dir`'s file system has `min_free` bytes free and takes a synced write; why not, in words.
pub fn writable(dir: &Path, min_free: u64) -> Result<(), String> {
    let free = fs2::available_space(dir).map_err(|e| format!("cannot read free space: {e}"))?;
    if free < min_free {
        return Err(format!("{free} bytes free, at least {min_free} needed"));
    }
    let probe = dir.join(PROBE_FILE);
    let written = std::fs::File::create(&probe)
        .and_then(|mut f| f.write_all(&[0u8; PROBE_BYTES]).and_then(|()| f.sync_all()))
        .map_err(|e| format!("probe write failed: {e}"));
    let removed = std::fs::remove_file(&probe).map_err(|e| format!("probe removal failed: {e}"));
    written.and(removed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::StoreError;
    use std::sync::mpsc;

    fn halt(store: &Store, errno: i32) {
        assert!(store.halt_after(&StoreError::Sled(sled::Error::Io(std::io::Error::from_raw_os_error(errno)))));
    }

    fn fast() -> Watch {
        Watch { every: Duration::from_millis(5), min_free: 0, settle: Duration::from_millis(50) }
    }

    /// Without a halt nothing happens; after one, the restart comes once the directory is writable for the
    /// settle time, with the halt's cause.
    #[test]
    fn the_restart_comes_after_a_halt_once_the_store_is_writable() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::open(dir.path()).expect("open");
        let (tx, rx) = mpsc::channel();
        let stop = CancellationToken::new();
        let h = spawn(store.clone(), fast(), stop.clone(), Box::new(move |cause| tx.send(cause).expect("send")))
            .expect("spawn");
        assert!(rx.recv_timeout(Duration::from_millis(300)).is_err(), "no restart without a halt");
        let halted_at = Instant::now();
        halt(&store, 28);
        assert_eq!(rx.recv_timeout(Duration::from_secs(10)), Ok("no space left on device"));
        assert!(halted_at.elapsed() >= Duration::from_millis(50), "not before the settle time");
        h.join().expect("the watch ends after the restart");
        assert!(!dir.path().join(PROBE_FILE).exists(), "the probe is removed");
    }

    /// A directory that cannot be written (gone, or without room) holds the restart back; a stop ends the
    /// watch without a restart.
    #[test]
    fn an_unwritable_store_holds_the_restart_back_and_a_stop_ends_the_watch() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = Store::open(&dir.path().join("db")).expect("open");
        assert!(writable(store.path(), 0).is_ok());
        let full = writable(store.path(), u64::MAX).expect_err("no file system has that much room");
        assert!(full.contains("bytes free"), "{full}");
        let (tx, rx) = mpsc::channel();
        let stop = CancellationToken::new();
        let watch = Watch { min_free: u64::MAX, ..fast() };
        let h = spawn(store.clone(), watch, stop.clone(), Box::new(move |cause| tx.send(cause).expect("send")))
            .expect("spawn");
        halt(&store, 24);
        assert!(rx.recv_timeout(Duration::from_millis(300)).is_err(), "no restart while the disk has no room");
        stop.cancel();
        h.join().expect("the watch ends at a stop");
        assert!(rx.try_recv().is_err(), "and never restarts after it");
    }
}
