//! Reading a token shard set: the shards are memory-mapped (`memmap2`), so
//! a run holds only the pages it touches, whatever the corpus size, and
//! the set is one [`TokenSource`] over all of them.

use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use serde::{Deserialize, Serialize};

use super::shard_check::{check_shard, shard_location};
use super::shard_format::{parse_header, TokenWidth, HEADER_BYTES};
use super::shard_index::{sha256_hex, ShardEntry, ShardIndex, TOKENIZER_FILE};
use super::{DataError, TokenSource, Tokenizer};

/// What identifies a shard set: the hashes of its tokenizer and its index
/// (which lists every shard's size). A run records it, and a resumed run
/// refuses a set that differs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShardSetId {
    /// SHA-256 of `tokenizer.json`, lowercase hex.
    pub tokenizer_sha256: String,
    /// SHA-256 of `index.json`, lowercase hex.
    pub index_sha256: String,
}

/// A shard set opened for reading: every shard checked against the index
/// and mapped.
pub struct ShardSet {
    dir: PathBuf,
    index: ShardIndex,
    id: ShardSetId,
    width: TokenWidth,
    maps: Vec<Mmap>,
    /// Stream position of each shard's first token.
    starts: Vec<usize>,
    len: usize,
}

impl ShardSet {
    /// Opens the shard set in `dir`: reads `index.json`, checks the hash of
    /// `tokenizer.json`, and checks and maps every shard: its header and
    /// size against the index, then its whole content (each shard is read
    /// once: its XXH3-64 against the index's, every id below the
    /// tokenizer's vocabulary).
    ///
    /// Shards must not change while the set is open (the data is read
    /// through the mapping).
    ///
    /// # Errors
    ///
    /// [`DataError::Io`] for a missing or unreadable file;
    /// [`DataError::BadShardSet`] naming the file for an index that is not
    /// one (or has no checksums), a tokenizer whose hash differs from the
    /// index's, or a shard that is truncated, foreign, damaged or
    /// disagrees with the index; [`DataError::OutOfVocab`] naming the
    /// shard and the offset of an id outside the vocabulary.
    pub fn open(dir: &Path) -> Result<Self, DataError> {
        Self::open_with_progress(dir, &mut |_, _| {})
    }

    /// [`ShardSet::open`], calling `progress(done, total)` with the shard
    /// bytes checked so far and in all as it reads them.
    ///
    /// # Errors
    ///
    /// As [`ShardSet::open`].
    pub fn open_with_progress(
        dir: &Path,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<Self, DataError> {
        let (index, index_sha256) = ShardIndex::read(dir)?;
        let tok_path = dir.join(TOKENIZER_FILE);
        let tok_bytes = std::fs::read(&tok_path).map_err(|source| DataError::Io {
            action: "reading the shard set's tokenizer",
            path: tok_path.clone(),
            source,
        })?;
        let tokenizer_sha256 = sha256_hex(&tok_bytes);
        if tokenizer_sha256 != index.tokenizer_sha256 {
            return Err(DataError::BadShardSet {
                path: tok_path,
                reason: format!(
                    "SHA-256 {tokenizer_sha256}, but the index says the shards were made with {}; this is not the shards' tokenizer",
                    index.tokenizer_sha256
                ),
            });
        }
        let width = index.dtype;
        let mut maps = Vec::with_capacity(index.shards.len());
        let mut starts = Vec::with_capacity(index.shards.len());
        let mut len = 0usize;
        for entry in &index.shards {
            maps.push(map_shard(&dir.join(&entry.file), entry, width)?);
            starts.push(len);
            len += entry.tokens as usize;
        }
        let total = index.shard_bytes();
        let mut before = 0;
        for (entry, map) in index.shards.iter().zip(&maps) {
            let expected = entry.xxh3_64.as_deref().expect("ShardIndex::read checks");
            let path = dir.join(&entry.file);
            check_shard(&path, map, width, expected, index.vocab_size, &mut |done| {
                progress(before + done, total)
            })?;
            before += map.len() as u64;
        }
        Ok(Self {
            dir: dir.to_path_buf(),
            index,
            id: ShardSetId {
                tokenizer_sha256,
                index_sha256,
            },
            width,
            maps,
            starts,
            len,
        })
    }

    /// The set's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The index.
    pub fn index(&self) -> &ShardIndex {
        &self.index
    }

    /// The hashes that identify the set.
    pub fn id(&self) -> &ShardSetId {
        &self.id
    }

    /// Path of the set's `tokenizer.json`.
    pub fn tokenizer_path(&self) -> PathBuf {
        self.dir.join(TOKENIZER_FILE)
    }

    /// Loads the set's tokenizer.
    ///
    /// # Errors
    ///
    /// [`DataError::TokenizerLoad`] naming the file if it does not parse.
    pub fn tokenizer(&self) -> Result<Tokenizer, DataError> {
        let path = self.tokenizer_path();
        Tokenizer::from_file(&path).map_err(|source| DataError::TokenizerLoad { path, source })
    }
}

/// Opens and maps the shard at `path`, checking its header and size
/// against `entry` (nothing is read beyond the header).
fn map_shard(path: &Path, entry: &ShardEntry, width: TokenWidth) -> Result<Mmap, DataError> {
    let bad = |reason: String| DataError::BadShardSet {
        path: path.to_path_buf(),
        reason,
    };
    let io = |action| {
        move |source| DataError::Io {
            action,
            path: path.to_path_buf(),
            source,
        }
    };
    let file = File::open(path).map_err(io("opening token shard"))?;
    let expected = entry.file_bytes(width);
    let actual = file
        .metadata()
        .map_err(io("reading the size of token shard"))?
        .len();
    // Checked before mapping, so the header read below is in bounds.
    if actual < HEADER_BYTES as u64 {
        return Err(bad(format!(
            "{actual} bytes, shorter than the {HEADER_BYTES}-byte shard header (truncated?)"
        )));
    }
    // SAFETY: the mapping is read-only and the file is not changed while
    // the set is open (documented on `ShardSet::open`); a file changed
    // underneath would give wrong tokens, not undefined reads past the
    // length checked here.
    let map = unsafe { Mmap::map(&file) }.map_err(io("memory-mapping token shard"))?;
    let (w, n) = parse_header(&map).map_err(&bad)?;
    if w != width || n != entry.tokens {
        return Err(bad(format!(
            "header says {n} tokens of {} bytes, the index says {} tokens of {} bytes (a shard of another set?)",
            w.bytes(),
            entry.tokens,
            width.bytes()
        )));
    }
    if actual != expected {
        return Err(bad(format!(
            "{actual} bytes, but {} tokens of {} bytes need {expected} (truncated or damaged)",
            entry.tokens,
            width.bytes()
        )));
    }
    Ok(map)
}

impl TokenSource for ShardSet {
    fn len(&self) -> usize {
        self.len
    }

    fn read(&self, start: usize, out: &mut [u32]) {
        assert!(
            start + out.len() <= self.len,
            "reading tokens {start}..{} of a shard set of {}",
            start + out.len(),
            self.len
        );
        let w = self.width.bytes();
        let (mut pos, mut done) = (start, 0);
        while done < out.len() {
            let shard = self.starts.partition_point(|&s| s <= pos) - 1;
            let offset = pos - self.starts[shard];
            let in_shard = self.index.shards[shard].tokens as usize - offset;
            let n = in_shard.min(out.len() - done);
            let bytes =
                &self.maps[shard][HEADER_BYTES + offset * w..HEADER_BYTES + (offset + n) * w];
            self.width.decode(bytes, &mut out[done..done + n]);
            done += n;
            pos += n;
        }
    }

    fn locate(&self, pos: usize) -> String {
        let shard = self.starts.partition_point(|&s| s <= pos) - 1;
        let offset = (pos - self.starts[shard]) as u64;
        let path = self.dir.join(&self.index.shards[shard].file);
        format!(
            "{} (token {pos} of the set)",
            shard_location(&path, offset, self.width)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::super::{eval_batches, BatchSampler, ShardWriter, INDEX_FILE};
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("ferrotron-shards-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// Documents of varied lengths with ids below `vocab`.
    fn documents(vocab: u32) -> Vec<Vec<u32>> {
        (0..40u32)
            .map(|d| {
                (0..(d * 7 % 23) + 1)
                    .map(|i| (d * 131 + i * 17) % vocab)
                    .collect()
            })
            .collect()
    }

    /// Writes `docs` as a set of shards of `shard_tokens` tokens.
    fn write(dir: &Path, docs: &[Vec<u32>], vocab: usize, eos: Option<u32>, shard_tokens: u64) {
        let mut w = ShardWriter::create(dir, b"{}".to_vec(), vocab, eos, shard_tokens).unwrap();
        for d in docs {
            w.push_document(d, d.len() * 3).unwrap();
        }
        w.finish().unwrap();
    }

    #[test]
    fn a_shard_set_reads_back_the_stream_across_shard_boundaries() {
        for (vocab, eos, width) in [(300, Some(0), 2), (70_000, None, 4)] {
            let dir = scratch(&format!("read-{vocab}")).join("set");
            let docs = documents(vocab as u32);
            write(&dir, &docs, vocab, eos, 37);
            // The expected stream: documents separated by the end-of-text id.
            let mut stream: Vec<u32> = Vec::new();
            for d in &docs {
                if let (Some(e), false) = (eos, stream.is_empty()) {
                    stream.push(e);
                }
                stream.extend(d);
            }
            let set = ShardSet::open(&dir).unwrap();
            assert_eq!(set.len(), stream.len());
            assert_eq!(set.index().documents, docs.len() as u64);
            assert_eq!(set.index().dtype.bytes(), width);
            assert_eq!(set.index().shards.len(), stream.len().div_ceil(37));
            assert_eq!(
                set.index().shards.iter().map(|s| s.documents).sum::<u64>(),
                docs.len() as u64
            );
            for (start, n) in [(0, stream.len()), (30, 20), (36, 1), (37, 74), (100, 5)] {
                let mut out = vec![0; n];
                set.read(start, &mut out);
                assert_eq!(out, stream[start..start + n], "{start}+{n}");
            }
            // The same sampler and evaluation windows as the stream in memory.
            let mut a = BatchSampler::new(stream.len(), 16, 3).unwrap();
            let mut b = BatchSampler::new(set.len(), 16, 3).unwrap();
            for _ in 0..5 {
                assert_eq!(a.next_batch(&stream, 4), b.next_batch(&set, 4));
            }
            assert_eq!(eval_batches(&stream, 8, 2, 3), eval_batches(&set, 8, 2, 3));
            // Nothing is left beside the set.
            let siblings = std::fs::read_dir(dir.parent().unwrap()).unwrap().count();
            assert_eq!(siblings, 1);
        }
    }

    #[test]
    fn truncated_or_foreign_files_are_errors_naming_the_file() {
        let root = scratch("bad");
        let dir = root.join("set");
        write(&dir, &documents(300), 300, Some(0), 50);
        let shard = dir.join("shard-00001.bin");
        let good = std::fs::read(&shard).unwrap();
        let open_err = || ShardSet::open(&dir).err().expect("refused").to_string();

        std::fs::write(&shard, &good[..good.len() - 1]).unwrap();
        let e = open_err();
        assert!(
            e.contains("shard-00001.bin") && e.contains("truncated"),
            "{e}"
        );
        std::fs::write(&shard, &good[..10]).unwrap();
        let e = open_err();
        assert!(e.contains("shard-00001.bin") && e.contains("header"), "{e}");
        let mut foreign = good.clone();
        foreign[..8].copy_from_slice(b"NOTASHRD");
        std::fs::write(&shard, &foreign).unwrap();
        let e = open_err();
        assert!(
            e.contains("shard-00001.bin") && e.contains("bad magic"),
            "{e}"
        );
        std::fs::write(&shard, &good).unwrap();
        assert!(ShardSet::open(&dir).is_ok());

        let tok = dir.join(TOKENIZER_FILE);
        std::fs::write(&tok, b"{ }").unwrap();
        let e = open_err();
        assert!(e.contains("tokenizer.json") && e.contains("SHA-256"), "{e}");
        std::fs::write(&tok, b"{}").unwrap();

        let index = dir.join(INDEX_FILE);
        std::fs::write(&index, b"[1, 2]").unwrap();
        let e = open_err();
        assert!(
            e.contains("index.json") && e.contains("not a token shard index"),
            "{e}"
        );
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn a_damaged_shard_or_an_index_without_checksums_is_refused() {
        let root = scratch("checksum");
        let dir = root.join("set");
        write(&dir, &documents(300), 300, Some(0), 50);
        let shard = dir.join("shard-00002.bin");
        let good = std::fs::read(&shard).unwrap();
        let open_err = || ShardSet::open(&dir).err().expect("refused").to_string();
        // The same size, one token changed (still inside the vocabulary).
        let mut damaged = good.clone();
        damaged[40] ^= 1;
        std::fs::write(&shard, &damaged).unwrap();
        let e = open_err();
        assert!(
            e.contains("shard-00002.bin") && e.contains("XXH3-64") && e.contains("damaged"),
            "{e}"
        );
        std::fs::write(&shard, &good).unwrap();
        // The index's checksum is the file's, as `xxhsum -H3` computes it.
        let (index, _) = ShardIndex::read(&dir).unwrap();
        assert_eq!(
            index.shards[2].xxh3_64.as_deref(),
            Some(super::super::xxh3_64_hex(&good).as_str())
        );
        // An index written before checksums: refused, saying how to remake it.
        let path = dir.join(INDEX_FILE);
        let mut json: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        for s in json["shards"].as_array_mut().unwrap() {
            s.as_object_mut().unwrap().remove("xxh3_64");
        }
        std::fs::write(&path, serde_json::to_vec(&json).unwrap()).unwrap();
        let e = open_err();
        assert!(
            e.contains("index.json")
                && e.contains("no checksum for shard-00000.bin")
                && e.contains("ferrotron data prepare"),
            "{e}"
        );
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn a_drawn_id_outside_the_model_vocabulary_names_its_shard_and_offset() {
        let root = scratch("vocab");
        let dir = root.join("set");
        // Ids below 300 but one: 299 + 1000 at stream position 333, in a
        // set whose tokenizer has 2000 tokens (so the set itself is valid).
        let mut stream: Vec<u32> = (0..600).map(|i| i % 299).collect();
        stream[333] = 1299;
        let mut w = ShardWriter::create(&dir, b"{}".to_vec(), 2000, None, 100).unwrap();
        w.push_document(&stream, 600).unwrap();
        w.finish().unwrap();
        let set = ShardSet::open(&dir).unwrap();
        let mut sampler = BatchSampler::new(set.len(), 16, 5).unwrap();
        let mut plain = sampler.clone();
        let mut drawn = 0;
        let e = loop {
            drawn += 1;
            assert!(drawn < 10_000, "no window ever held token 333");
            match sampler.next_checked_batch(&set, 4, 300, None) {
                // Windows without it are the unchecked sampler's.
                Ok(b) => assert_eq!(b, plain.next_batch(&set, 4)),
                Err(e) => break e.to_string(),
            }
        };
        let shard = dir.join("shard-00003.bin");
        let at = format!(
            "token id 1299 at {}, token 33 of the shard (byte {}) (token 333 of the set) is outside the vocabulary of 300 tokens (the model's)",
            shard.display(),
            32 + 33 * 2
        );
        assert_eq!(e, at);
        // A part of the set (the validation tokens) names the same place.
        let part = crate::data::TokenRange::new(&set, 300, 300);
        let e = crate::data::check_ids(&part, 0, 300, 300).unwrap_err();
        assert_eq!(e.to_string(), at);
        // In memory: the position in the stream.
        let e = crate::data::check_ids(&stream, 320, 20, 300).unwrap_err();
        assert!(e.to_string().contains("at token 333 of the stream"), "{e}");
        assert!(crate::data::check_ids(&stream, 0, 333, 300).is_ok());
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn a_failed_or_refused_write_leaves_nothing() {
        let root = scratch("atomic");
        let dir = root.join("set");
        let mut w = ShardWriter::create(&dir, b"{}".to_vec(), 300, Some(0), 10).unwrap();
        w.push_document(&[1, 2, 3], 3).unwrap();
        let e = w.push_document(&[1, 300], 2).unwrap_err().to_string();
        assert!(e.contains("300") && e.contains("vocabulary"), "{e}");
        drop(w);
        assert_eq!(
            std::fs::read_dir(&root).unwrap().count(),
            0,
            "temp dir removed"
        );
        let w = ShardWriter::create(&dir, b"{}".to_vec(), 300, Some(0), 10).unwrap();
        assert!(w.finish().unwrap_err().to_string().contains("no text"));
        assert_eq!(std::fs::read_dir(&root).unwrap().count(), 0);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("x"), "x").unwrap();
        let e = ShardWriter::create(&dir, b"{}".to_vec(), 300, None, 10)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("not an empty directory"), "{e}");
        // An end-of-text id outside the vocabulary would make a set that
        // `data verify` refuses.
        let e = ShardWriter::create(&root.join("eos"), b"{}".to_vec(), 4, Some(100), 10)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("end-of-text id") && e.contains("100"), "{e}");
        std::fs::remove_dir_all(&root).unwrap();
    }
}
