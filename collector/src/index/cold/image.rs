//! The shutdown image's body: the folded rows, node names and stale summaries written at a clean stop and read
//! at the next start instead of every summary.

use super::*;

/// What a shutdown image holds of the index (the store frames, checksums and places it: `store::image`): the
/// folded rows with the node names their placements number, and the hot jobs' stale summaries. Written by
/// [`ColdJobs::write_image`] at a clean stop, read by [`ColdJobs::read_image`] at the next start instead of every
/// summary. Body: chunks of `len u32 LE ++ len bytes` (so the reader checksums whole chunks), the last one empty;
/// inside them varints: the node names (`n`, then `len ++ bytes` each), the rows sorted by job id (`n`, then `id
/// len ++ id ++ attrs ++ submitted (zigzag) ++ done (zigzag) ++ first step (zigzag) ++ summary ++ packed len ++
/// packed` each), then the stale summaries (`n`, then `id len ++ id ++ k ++ k numbers` each).
#[derive(Debug, Default)]
pub struct Image {
    pub(super) nodes: Vec<Arc<str>>,
    pub(super) rows: Vec<(Box<str>, Row)>,
    /// The stale summaries of the jobs that were hot (see `JobIndex::stale_summaries`).
    pub stale: HashMap<String, Vec<u64>>,
}

impl Image {
    /// Whether `job_id` was folded at the stop.
    pub fn is_folded(&self, job_id: &str) -> bool {
        self.rows.binary_search_by(|(k, _)| (**k).cmp(job_id)).is_ok()
    }

    /// Folded jobs in the image.
    pub fn rows(&self) -> usize {
        self.rows.len()
    }
}

/// Writes varints into chunks of about [`IMAGE_CHUNK`] bytes.
pub(super) struct ChunkWriter<'a> {
    pub(super) w: &'a mut dyn std::io::Write,
    pub(super) buf: Vec<u8>,
}

pub(super) const IMAGE_CHUNK: usize = 1 << 20;

impl ChunkWriter<'_> {
    pub(super) fn bytes(&mut self, b: &[u8]) {
        put_u(&mut self.buf, b.len() as u64);
        self.buf.extend_from_slice(b);
    }

    /// Ends a record: the chunk goes out once it is full.
    pub(super) fn end_record(&mut self) -> std::io::Result<()> {
        if self.buf.len() >= IMAGE_CHUNK {
            self.flush_chunk()?;
        }
        Ok(())
    }

    pub(super) fn flush_chunk(&mut self) -> std::io::Result<()> {
        if !self.buf.is_empty() {
            self.w.write_all(&(self.buf.len() as u32).to_le_bytes())?;
            self.w.write_all(&self.buf)?;
            self.buf.clear();
        }
        Ok(())
    }

    pub(super) fn finish(mut self) -> std::io::Result<()> {
        self.flush_chunk()?;
        self.w.write_all(&0u32.to_le_bytes())
    }
}

/// Reads what [`ChunkWriter`] wrote; every short read is an error.
pub(super) struct ChunkReader<'a> {
    pub(super) r: &'a mut dyn std::io::Read,
    pub(super) chunk: Vec<u8>,
    pub(super) at: usize,
}

impl ChunkReader<'_> {
    pub(super) fn refill(&mut self) -> Result<(), String> {
        if self.at < self.chunk.len() {
            return Ok(());
        }
        let mut len = [0u8; 4];
        self.r.read_exact(&mut len).map_err(|e| format!("chunk length: {e}"))?;
        let len = u32::from_le_bytes(len) as usize;
        if len == 0 || len > 64 * IMAGE_CHUNK {
            return Err(format!("a chunk of {len} bytes where a record should be"));
        }
        self.chunk.resize(len, 0);
        self.r.read_exact(&mut self.chunk).map_err(|e| format!("chunk of {len} bytes: {e}"))?;
        self.at = 0;
        Ok(())
    }

    pub(super) fn u(&mut self) -> Result<u64, String> {
        self.refill()?;
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = *self.chunk.get(self.at).ok_or("a number cut short")?;
            self.at += 1;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err("a number over 64 bits".to_string())
    }

    pub(super) fn i(&mut self) -> Result<i64, String> {
        let z = self.u()?;
        Ok(((z >> 1) as i64) ^ -((z & 1) as i64))
    }

    pub(super) fn len(&mut self) -> Result<usize, String> {
        usize::try_from(self.u()?).map_err(|_| "a length past memory".to_string())
    }

    pub(super) fn bytes(&mut self) -> Result<&[u8], String> {
        let n = self.len()?;
        let end = self.at.checked_add(n).ok_or("a length past memory")?;
        let b = self.chunk.get(self.at..end).ok_or("bytes cut short")?;
        self.at = end;
        Ok(b)
    }

    pub(super) fn text(&mut self) -> Result<&str, String> {
        std::str::from_utf8(self.bytes()?).map_err(|_| "text that is not UTF-8".to_string())
    }

    /// The end: the chunk read is used up and an empty one follows.
    pub(super) fn finish(self) -> Result<(), String> {
        if self.at < self.chunk.len() {
            return Err(format!("{} bytes past the last record", self.chunk.len() - self.at));
        }
        let mut len = [0u8; 4];
        self.r.read_exact(&mut len).map_err(|e| format!("end: {e}"))?;
        if len != [0; 4] {
            return Err("records past the end".to_string());
        }
        Ok(())
    }
}

impl ColdJobs {
    /// Writes the image body (see [`Image`]): these rows and node names, and the hot jobs' `stale` summaries.
    pub fn write_image(&self, stale: &HashMap<String, Vec<u64>>, w: &mut dyn std::io::Write) -> std::io::Result<()> {
        let mut c = ChunkWriter { w, buf: Vec::with_capacity(IMAGE_CHUNK + 4096) };
        put_u(&mut c.buf, self.nodes.names.len() as u64);
        for name in &self.nodes.names {
            c.bytes(name.as_bytes());
            c.end_record()?;
        }
        put_u(&mut c.buf, self.rows.len() as u64);
        for (id, row) in &self.rows {
            c.bytes(id.as_bytes());
            put_u(&mut c.buf, u64::from(row.attrs));
            put_i(&mut c.buf, row.submitted_at);
            put_i(&mut c.buf, row.done_at);
            put_i(&mut c.buf, row.first_step_at);
            put_u(&mut c.buf, row.summary);
            c.bytes(&row.packed);
            c.end_record()?;
        }
        put_u(&mut c.buf, stale.len() as u64);
        for (id, numbers) in stale {
            c.bytes(id.as_bytes());
            put_u(&mut c.buf, numbers.len() as u64);
            for n in numbers {
                put_u(&mut c.buf, *n);
            }
            c.end_record()?;
        }
        c.finish()
    }

    /// Reads an image body [`ColdJobs::write_image`] wrote; refuses anything else (rows out of order included).
    pub fn read_image(r: &mut dyn std::io::Read) -> Result<Image, String> {
        let mut c = ChunkReader { r, chunk: Vec::new(), at: 0 };
        let mut image = Image::default();
        let n = c.len()?;
        for _ in 0..n {
            image.nodes.push(Arc::from(c.text()?));
        }
        let n = c.len()?;
        for _ in 0..n {
            let id: Box<str> = Box::from(c.text()?);
            let attrs = u32::try_from(c.u()?).map_err(|_| "an attribute number past 32 bits".to_string())?;
            let (submitted_at, done_at, first_step_at) = (c.i()?, c.i()?, c.i()?);
            let summary = c.u()?;
            let packed: Box<[u8]> = Box::from(c.bytes()?);
            if image.rows.last().is_some_and(|(last, _)| *last >= id) {
                return Err(format!("rows out of order at {id:?}"));
            }
            image.rows.push((id, Row { attrs, submitted_at, done_at, first_step_at, summary, packed }));
        }
        let n = c.len()?;
        for _ in 0..n {
            let id = c.text()?.to_string();
            let k = c.len()?;
            let mut numbers = Vec::with_capacity(k.min(1024));
            for _ in 0..k {
                numbers.push(c.u()?);
            }
            if image.stale.insert(id, numbers).is_some() {
                return Err("a job's stale summaries twice".to_string());
            }
        }
        c.finish()?;
        Ok(image)
    }

    /// Loads an image's rows and node names into an empty set over its dictionary; refuses (and keeps nothing)
    /// a row naming an attribute set the dictionary does not hold.
    pub fn load_image(&mut self, image: Image) -> Result<HashMap<String, Vec<u64>>, String> {
        if let Some((id, row)) = image.rows.iter().find(|(_, r)| self.dict.get(r.attrs).is_none()) {
            return Err(format!("job {id:?} names attribute set {}, which the dictionary does not hold", row.attrs));
        }
        let distinct: std::collections::HashSet<&Arc<str>> = image.nodes.iter().collect();
        if distinct.len() != image.nodes.len() || !self.nodes.names.is_empty() || !self.rows.is_empty() {
            return Err("a node name twice, or rows already loaded".to_string());
        }
        let mut bytes = 0;
        for name in &image.nodes {
            self.nodes.id(name, &mut bytes);
        }
        self.node_bytes += bytes;
        self.bytes += bytes;
        self.load(image.rows);
        Ok(image.stale)
    }
}
