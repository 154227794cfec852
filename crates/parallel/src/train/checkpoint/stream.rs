//! A safetensors file of f32 tensors written one tensor at a time: the
//! names and shapes are known first, so the header is written at once and
//! each tensor's bytes are appended as they are produced (the caller holds
//! one tensor's values, the writer 64 KiB of bytes), hashed with XXH3-64 on
//! the way. The bytes are exactly those `safetensors::serialize` gives for
//! the same tensors (sorted by name, the header padded with spaces to 8
//! bytes), so any safetensors reader reads the file. The file is written
//! as `write_atomic` writes one: a temporary file beside it, synced, then
//! renamed.
//!
//! A write that fails (a full disk) is remembered and the rest of the
//! tensors are still accepted and hashed but not written: the caller learns
//! the error at [`StreamWriter::finish`], with every block's checksum and
//! the file's size known, so the error can say how many bytes were needed.

use std::fs;
use std::io::{BufWriter, ErrorKind, Write};
use std::path::{Path, PathBuf};

use ferrotron_engine::checkpoint::CheckpointError;
use serde::Serialize;
use xxhash_rust::xxh3::Xxh3;

/// Values converted to bytes at a time.
const CHUNK: usize = 16 * 1024;

/// A tensor's header entry, in the field order `safetensors` writes.
#[derive(Serialize)]
struct Info<'a> {
    dtype: &'static str,
    shape: &'a [usize],
    data_offsets: [usize; 2],
}

/// The header of a safetensors file holding `tensors` `(name, shape)` as
/// f32, sorted by name: the 8-byte length and the padded JSON; and the
/// bytes of tensor data after it.
fn header(tensors: &[(String, Vec<usize>)]) -> (Vec<u8>, u64) {
    let mut json = String::from("{");
    let mut offset = 0;
    for (i, (name, shape)) in tensors.iter().enumerate() {
        let n = 4 * shape.iter().product::<usize>();
        let info = Info {
            dtype: "F32",
            shape,
            data_offsets: [offset, offset + n],
        };
        offset += n;
        if i > 0 {
            json.push(',');
        }
        json += &serde_json::to_string(name).expect("a name serialises");
        json.push(':');
        json += &serde_json::to_string(&info).expect("a header entry serialises");
    }
    json.push('}');
    let mut bytes = json.into_bytes();
    bytes.resize(bytes.len().next_multiple_of(8), b' ');
    let mut out = (bytes.len() as u64).to_le_bytes().to_vec();
    out.extend(bytes);
    (out, offset as u64)
}

/// `tensors` sorted by name, the order [`StreamWriter`] takes them in.
pub fn file_order(mut tensors: Vec<(String, Vec<usize>)>) -> Vec<(String, Vec<usize>)> {
    tensors.sort_by(|a, b| a.0.cmp(&b.0));
    tensors
}

/// Bytes of the safetensors file of f32 `tensors` `(name, shape)`.
pub fn file_size(tensors: &[(String, Vec<usize>)]) -> u64 {
    let (head, data) = header(&file_order(tensors.to_vec()));
    head.len() as u64 + data
}

/// An f32 safetensors file being written tensor by tensor, in name order.
pub struct StreamWriter {
    path: PathBuf,
    tmp: PathBuf,
    out: Option<BufWriter<fs::File>>,
    /// The tensors still to come, in order (reversed: the next is last).
    pending: Vec<(String, Vec<usize>)>,
    /// The first error, after which nothing more is written.
    error: Option<CheckpointError>,
    bytes: Vec<u8>,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> CheckpointError + '_ {
    move |source| CheckpointError::Io {
        path: path.display().to_string(),
        source,
    }
}

impl StreamWriter {
    /// Starts the file `path` of `tensors` `(name, shape)` (any order:
    /// they are taken in name order) and writes its header. With `fail`
    /// set nothing is written and [`StreamWriter::finish`] reports a full
    /// disk (the test hook of sharded checkpoints).
    pub fn create(path: &Path, tensors: Vec<(String, Vec<usize>)>, fail: Option<String>) -> Self {
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
        let tmp = path.with_file_name(format!(
            ".{}.tmp-{}",
            name.unwrap_or_default(),
            std::process::id()
        ));
        let tensors = file_order(tensors);
        let mut writer = Self {
            path: path.to_path_buf(),
            tmp,
            out: None,
            pending: tensors.iter().rev().cloned().collect(),
            error: None,
            bytes: Vec::with_capacity(4 * CHUNK),
        };
        if let Some(why) = fail {
            writer.error = Some(io(path)(std::io::Error::new(ErrorKind::StorageFull, why)));
            return writer;
        }
        let (head, _) = header(&tensors);
        match fs::File::create(&writer.tmp).map_err(io(&writer.tmp)) {
            Ok(f) => {
                writer.out = Some(BufWriter::new(f));
                writer.write(&head);
            }
            Err(e) => writer.error = Some(e),
        }
        writer
    }

    /// The name of the tensor [`StreamWriter::append`] takes next.
    pub fn next_name(&self) -> Option<&str> {
        self.pending.last().map(|(n, _)| n.as_str())
    }

    fn write(&mut self, bytes: &[u8]) {
        if self.error.is_some() {
            return;
        }
        if let Some(out) = self.out.as_mut() {
            if let Err(e) = out.write_all(bytes) {
                self.error = Some(io(&self.tmp)(e));
            }
        }
    }

    /// Appends the values of the next tensor (in name order) and returns
    /// their XXH3-64 (of the little-endian bytes). A failed write is kept
    /// for [`StreamWriter::finish`]; the checksum is returned regardless.
    ///
    /// # Panics
    /// If no tensor is left or `values` is not of its size (a caller bug).
    pub fn append(&mut self, values: &[f32]) -> u64 {
        let (name, shape) = self.pending.pop().expect("a tensor left to write");
        assert_eq!(
            values.len(),
            shape.iter().product::<usize>(),
            "tensor '{name}': values of another size than its shape"
        );
        let mut hash = Xxh3::new();
        let mut bytes = std::mem::take(&mut self.bytes);
        for chunk in values.chunks(CHUNK) {
            bytes.clear();
            bytes.extend(chunk.iter().flat_map(|v| v.to_le_bytes()));
            hash.update(&bytes);
            self.write(&bytes);
        }
        self.bytes = bytes;
        hash.digest()
    }

    /// Ends the file: flushed, synced and renamed over its path; or the
    /// first error (the temporary file removed).
    ///
    /// # Panics
    /// If a tensor was never appended (a caller bug).
    pub fn finish(mut self) -> Result<(), CheckpointError> {
        assert!(
            self.pending.is_empty(),
            "tensors never written: {:?}",
            self.pending
        );
        let out = self.out.take();
        let synced = match (self.error.take(), out) {
            (Some(e), _) => Err(e),
            (None, None) => unreachable!("a writer without a file has an error"),
            (None, Some(out)) => out
                .into_inner()
                .map_err(|e| e.into_error())
                .and_then(|f| f.sync_all())
                .map_err(io(&self.tmp)),
        };
        match synced {
            Ok(()) => fs::rename(&self.tmp, &self.path).map_err(io(&self.path)),
            Err(e) => {
                // Best effort: the error above is the one to report.
                let _ = fs::remove_file(&self.tmp);
                Err(e)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use burn::tensor::TensorData;
    use ferrotron_engine::checkpoint::{encode_safetensors, FloatDtype};

    #[test]
    fn the_streamed_file_is_what_safetensors_serialize_writes() {
        let dir = std::env::temp_dir().join(format!("ferrotron-stream-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let path = dir.join("t.safetensors");
        // Names out of order, one with a quote, a tensor larger than a chunk.
        let big: Vec<f32> = (0..CHUNK * 2 + 5).map(|i| i as f32 * 0.5 - 3.0).collect();
        let tensors = [
            (
                "m.w\"x".to_string(),
                vec![2, 3],
                (0..6).map(|i| i as f32).collect(),
            ),
            ("a.b".to_string(), vec![big.len()], big),
            ("v".to_string(), vec![1], vec![-0.0]),
        ];
        let shapes: Vec<_> = tensors
            .iter()
            .map(|(n, s, _)| (n.clone(), s.clone()))
            .collect();
        let mut w = StreamWriter::create(&path, shapes.clone(), None);
        let mut sums = Vec::new();
        while let Some(name) = w.next_name().map(str::to_string) {
            let (_, _, values) = tensors.iter().find(|t| t.0 == name).unwrap();
            sums.push((name, w.append(values)));
        }
        w.finish().unwrap();
        let data: Vec<(String, TensorData)> = tensors
            .iter()
            .map(|(n, s, v)| (n.clone(), TensorData::new(v.clone(), s.clone())))
            .collect();
        let want = encode_safetensors(&path, &data, FloatDtype::F32).unwrap();
        let got = fs::read(&path).unwrap();
        assert_eq!(got, want);
        assert_eq!(file_size(&shapes), got.len() as u64);
        for (name, sum) in sums {
            let (_, _, v) = tensors.iter().find(|t| t.0 == name).unwrap();
            let raw: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
            assert_eq!(sum, xxhash_rust::xxh3::xxh3_64(&raw), "{name}");
        }
        // A failing writer hashes the same, writes nothing and says why.
        let failing = dir.join("f.safetensors");
        let mut w = StreamWriter::create(&failing, shapes, Some("disk full".into()));
        while w.next_name().is_some() {
            w.append(&vec![0.0; w.pending.last().unwrap().1.iter().product()]);
        }
        let e = w.finish().unwrap_err().to_string();
        assert!(
            e.contains("f.safetensors") && e.contains("disk full"),
            "{e}"
        );
        assert_eq!(fs::read_dir(&dir).unwrap().count(), 1, "only t.safetensors");
        fs::remove_dir_all(&dir).unwrap();
    }
}
