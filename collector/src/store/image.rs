//! The shutdown image: a file the collector writes at a clean stop holding what a restart would otherwise
//! rebuild from every folded job's summary (the index's rows, in the index's own format), so that the next start
//! reads one file instead of decoding every summary pack (like Prometheus's snapshot on shutdown).
//!
//! # Validity
//! The image is valid only for the store exactly as it was at the stop. The file is written first (a temporary
//! file, synced, renamed, the directory synced), then sled records its token (tree `jobs`, key
//! `[0u8] ++ "shutdown_image"`: sealed `token u64 ++ marker u64`, big-endian), flushed. Every open of the store
//! takes the record away (removed and flushed before anything else can write), so an image is used at most once,
//! and never after any other opening of the store (a tool's) or a start without a clean stop before it (a
//! crash): those starts read the summaries. (A stop after a failed write writes no image: writes are halted.)
//!
//! # Format
//! `"SLRI" ++ version u8 (1) ++ token u64 LE ++ marker u64 LE ++ body ++ crc32(everything before) u32 LE`. The
//! body is the index's (see `index::cold`); this module only frames, checksums and places it. A file that fails
//! any check is reported and ignored: the summaries are read instead.

use super::files::file_err;
use super::StoreError;
use std::fs::{File, OpenOptions};
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

const MAGIC: &[u8; 4] = b"SLRI";
const VERSION: u8 = 1;
/// The file's name in the store's directory.
pub(super) const FILE: &str = "shutdown.img";

/// A writer that checksums what passes through it.
pub struct Checksummed<W> {
    inner: W,
    crc: crc32fast::Hasher,
}

impl<W: Write> Write for Checksummed<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.crc.update(&buf[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// A reader that checksums what passes through it.
pub struct Verified<R> {
    inner: R,
    crc: crc32fast::Hasher,
}

impl<R: Read> Read for Verified<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.crc.update(&buf[..n]);
        Ok(n)
    }
}

fn path(dir: &Path) -> PathBuf {
    dir.join(FILE)
}

/// Writes the image file (token and marker in its head, `body` after), synced and renamed into place, the
/// directory synced. On `Ok` the file is durable; the caller then records the token in sled.
pub(super) fn write(
    dir: &Path,
    token: u64,
    marker: u64,
    body: impl FnOnce(&mut dyn Write) -> std::io::Result<()>,
) -> Result<(), StoreError> {
    let target = path(dir);
    let tmp = target.with_extension("tmp");
    let result = (|| -> std::io::Result<()> {
        let file = OpenOptions::new().write(true).create(true).truncate(true).open(&tmp)?;
        let mut w = Checksummed { inner: BufWriter::with_capacity(1 << 20, file), crc: crc32fast::Hasher::new() };
        w.write_all(MAGIC)?;
        w.write_all(&[VERSION])?;
        w.write_all(&token.to_le_bytes())?;
        w.write_all(&marker.to_le_bytes())?;
        body(&mut w)?;
        let crc = w.crc.clone().finalize();
        let mut inner = w.inner;
        inner.write_all(&crc.to_le_bytes())?;
        let file = inner.into_inner().map_err(|e| e.into_error())?;
        file.sync_all()?;
        std::fs::rename(&tmp, &target)?;
        File::open(dir)?.sync_all()
    })();
    result.map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        file_err(&target, e)
    })
}

/// Reads the image with `token` and `marker`: `Ok(None)` when there is no such file; an error naming the file
/// when it is another image, damaged, or `body` refuses it. `body` reads exactly the body.
pub(super) fn read<T>(
    dir: &Path,
    token: u64,
    marker: u64,
    body: impl FnOnce(&mut dyn Read) -> Result<T, String>,
) -> Result<Option<T>, String> {
    let target = path(dir);
    let file = match File::open(&target) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.to_string()),
    };
    let mut r = Verified { inner: BufReader::with_capacity(1 << 20, file), crc: crc32fast::Hasher::new() };
    let mut head = [0u8; 21];
    r.read_exact(&mut head).map_err(|e| format!("head: {e}"))?;
    if &head[..4] != MAGIC {
        return Err("not a shutdown image".to_string());
    }
    if head[4] != VERSION {
        return Err(format!("version {} (this collector reads {VERSION})", head[4]));
    }
    let u64_at = |i: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&head[i..i + 8]);
        u64::from_le_bytes(b)
    };
    if u64_at(5) != token || u64_at(13) != marker {
        return Err(format!(
            "written for another stop (token {:x}, marker {}; the store's: {token:x}, {marker})",
            u64_at(5),
            u64_at(13)
        ));
    }
    let value = body(&mut r)?;
    let computed = r.crc.clone().finalize();
    let mut stored = [0u8; 4];
    r.inner.read_exact(&mut stored).map_err(|e| format!("checksum: {e}"))?;
    if u32::from_le_bytes(stored) != computed {
        return Err(format!("checksum mismatch (stored {:08x}, computed {computed:08x})", u32::from_le_bytes(stored)));
    }
    let mut rest = [0u8; 1];
    if r.inner.read(&mut rest).map_err(|e| e.to_string())? != 0 {
        return Err("bytes after the checksum".to_string());
    }
    Ok(Some(value))
}

/// Removes the image file (after it was read, or when it cannot be used), and any write of one a crash cut short.
pub(super) fn remove(dir: &Path) {
    let _ = std::fs::remove_file(path(dir));
    let _ = std::fs::remove_file(path(dir).with_extension("tmp"));
}
