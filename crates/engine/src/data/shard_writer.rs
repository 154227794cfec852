//! Writing a token shard set, atomically: everything goes into a hidden
//! temporary directory beside the destination, which is renamed into place
//! once every file is written and synced. A failure removes the temporary
//! directory; a crash leaves it hidden (`.NAME.tmp-PID`) and never a half
//! shard set at the destination.

use std::fs::File;
use std::io::{BufWriter, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use super::shard_check::xxh3_64_file;
use super::shard_format::{header, TokenWidth, HEADER_BYTES, VERSION};
use super::shard_index::{sha256_hex, ShardEntry, ShardIndex, FORMAT, INDEX_FILE, TOKENIZER_FILE};
use super::DataError;

/// The shard being filled.
struct OpenShard {
    file: BufWriter<File>,
    path: PathBuf,
    entry: ShardEntry,
}

/// Writes documents' token ids into shards of at most `shard_tokens`
/// tokens, then the tokenizer and the index ([`ShardWriter::finish`]).
pub struct ShardWriter {
    out: PathBuf,
    tmp: PathBuf,
    width: TokenWidth,
    index: ShardIndex,
    shard_tokens: u64,
    tokenizer_json: Vec<u8>,
    current: Option<OpenShard>,
    buffer: Vec<u8>,
    finished: bool,
}

fn io<'a>(action: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> DataError + 'a {
    move |source| DataError::Io {
        action,
        path: path.to_path_buf(),
        source,
    }
}

impl ShardWriter {
    /// Starts a shard set destined for `out` (which must not exist, or be an
    /// empty directory), made with the tokenizer whose `tokenizer.json` is
    /// `tokenizer_json`, of `vocab_size` tokens, documents separated by
    /// `eos_id`, at most `shard_tokens` tokens per shard.
    ///
    /// # Errors
    ///
    /// [`DataError::InvalidArgument`] if `shard_tokens` is 0, `eos_id` is
    /// not below `vocab_size` or `out` holds something; [`DataError::Io`] if the temporary directory cannot be made.
    pub fn create(
        out: &Path,
        tokenizer_json: Vec<u8>,
        vocab_size: usize,
        eos_id: Option<u32>,
        shard_tokens: u64,
    ) -> Result<Self, DataError> {
        if shard_tokens == 0 {
            return Err(DataError::InvalidArgument {
                name: "shard_tokens",
                value: "0".into(),
                reason: "must be at least 1 token",
            });
        }
        if let Some(eos) = eos_id.filter(|&id| id as usize >= vocab_size) {
            return Err(DataError::InvalidArgument {
                name: "end-of-text id",
                value: eos.to_string(),
                reason: "is not below the tokenizer's vocabulary size (a tokenizer whose ids leave gaps is not supported)",
            });
        }
        if std::fs::read_dir(out).is_ok_and(|mut d| d.next().is_some()) || out.is_file() {
            return Err(DataError::InvalidArgument {
                name: "out",
                value: out.display().to_string(),
                reason: "exists and is not an empty directory; choose a new one",
            });
        }
        let name = out
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "shards".into());
        let parent = match out.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        std::fs::create_dir_all(&parent).map_err(io("creating directory", &parent))?;
        let tmp = parent.join(format!(".{name}.tmp-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        std::fs::create_dir(&tmp).map_err(io("creating temporary directory", &tmp))?;
        let width = TokenWidth::for_vocab(vocab_size);
        Ok(Self {
            out: out.to_path_buf(),
            tmp,
            width,
            index: ShardIndex {
                format: FORMAT.into(),
                version: VERSION,
                dtype: width,
                vocab_size,
                eos_id,
                tokenizer_sha256: sha256_hex(&tokenizer_json),
                documents: 0,
                tokens: 0,
                text_bytes: 0,
                shards: Vec::new(),
            },
            shard_tokens,
            tokenizer_json,
            current: None,
            buffer: Vec::new(),
            finished: false,
        })
    }

    /// Appends one document: its token ids and the UTF-8 bytes of its text.
    /// The end-of-text id goes before it unless it is the first; an empty
    /// document is left out.
    ///
    /// # Errors
    ///
    /// [`DataError::InvalidArgument`] for an id outside the vocabulary;
    /// [`DataError::Io`] naming the shard if writing fails.
    pub fn push_document(&mut self, ids: &[u32], text_bytes: usize) -> Result<(), DataError> {
        if ids.is_empty() {
            return Ok(());
        }
        if let Some(&bad) = ids.iter().find(|&&id| id as usize >= self.index.vocab_size) {
            return Err(DataError::InvalidArgument {
                name: "token id",
                value: bad.to_string(),
                reason: "is outside the tokenizer's vocabulary",
            });
        }
        if let Some(eos) = self.index.eos_id.filter(|_| self.index.documents > 0) {
            self.put(eos, false)?;
        }
        for (i, &id) in ids.iter().enumerate() {
            self.put(id, i == 0)?;
        }
        self.index.documents += 1;
        self.index.text_bytes += text_bytes as u64;
        Ok(())
    }

    /// Writes one id into the open shard (opening one if needed, closing it
    /// when full); `starts_document` counts a document in that shard.
    fn put(&mut self, id: u32, starts_document: bool) -> Result<(), DataError> {
        if self.current.is_none() {
            self.open_shard()?;
        }
        let shard = self.current.as_mut().expect("a shard is open");
        self.buffer.clear();
        self.width.put(id, &mut self.buffer);
        shard
            .file
            .write_all(&self.buffer)
            .map_err(io("writing shard", &shard.path))?;
        shard.entry.tokens += 1;
        shard.entry.documents += u64::from(starts_document);
        self.index.tokens += 1;
        if shard.entry.tokens == self.shard_tokens {
            self.close_shard()?;
        }
        Ok(())
    }

    /// Opens the next shard file.
    fn open_shard(&mut self) -> Result<(), DataError> {
        let name = format!("shard-{:05}.bin", self.index.shards.len());
        let path = self.tmp.join(&name);
        let mut file = BufWriter::with_capacity(
            1 << 20,
            File::create(&path).map_err(io("creating shard", &path))?,
        );
        file.write_all(&header(self.width, 0))
            .map_err(io("writing shard", &path))?;
        self.current = Some(OpenShard {
            file,
            path,
            entry: ShardEntry {
                file: name,
                tokens: 0,
                documents: 0,
                xxh3_64: None,
            },
        });
        Ok(())
    }

    /// Writes the token count into the open shard's header, syncs it and
    /// records its checksum (of the file as read back).
    fn close_shard(&mut self) -> Result<(), DataError> {
        let Some(shard) = self.current.take() else {
            return Ok(());
        };
        let path = shard.path;
        let mut file = shard
            .file
            .into_inner()
            .map_err(|e| io("writing shard", &path)(e.into_error()))?;
        let write = |file: &mut File| -> std::io::Result<()> {
            file.seek(SeekFrom::Start(0))?;
            file.write_all(&header(self.width, shard.entry.tokens))?;
            file.sync_all()
        };
        write(&mut file).map_err(io("writing shard", &path))?;
        debug_assert_eq!(
            file.metadata().map(|m| m.len()).unwrap_or(0),
            (HEADER_BYTES + shard.entry.tokens as usize * self.width.bytes()) as u64
        );
        drop(file);
        let mut entry = shard.entry;
        entry.xxh3_64 = Some(xxh3_64_file(&path)?);
        self.index.shards.push(entry);
        Ok(())
    }

    /// Closes the last shard, writes `tokenizer.json` and `index.json`,
    /// syncs them and renames the set into place; returns the index.
    ///
    /// # Errors
    ///
    /// [`DataError::InvalidArgument`] if no token was written;
    /// [`DataError::Io`] naming the file if writing or renaming fails.
    pub fn finish(mut self) -> Result<ShardIndex, DataError> {
        self.close_shard()?;
        if self.index.tokens == 0 {
            return Err(DataError::InvalidArgument {
                name: "inputs",
                value: format!("{} documents", self.index.documents),
                reason: "hold no text to tokenize",
            });
        }
        let index_json = serde_json::to_vec_pretty(&self.index).expect("the index serialises");
        for (name, bytes) in [
            (TOKENIZER_FILE, &self.tokenizer_json),
            (INDEX_FILE, &index_json),
        ] {
            let path = self.tmp.join(name);
            let write = || -> std::io::Result<()> {
                let mut f = File::create(&path)?;
                f.write_all(bytes)?;
                f.sync_all()
            };
            write().map_err(io("writing", &path))?;
        }
        sync_dir(&self.tmp)?;
        if self.out.is_dir() {
            // Empty (checked at the start): rename(2) replaces an empty directory.
            std::fs::remove_dir(&self.out).map_err(io("replacing empty directory", &self.out))?;
        }
        std::fs::rename(&self.tmp, &self.out)
            .map_err(io("renaming the shard set into place at", &self.out))?;
        self.finished = true;
        if let Some(parent) = self.out.parent().filter(|p| !p.as_os_str().is_empty()) {
            sync_dir(parent)?;
        }
        Ok(self.index.clone())
    }
}

/// Makes a directory's entries (a rename) durable.
fn sync_dir(dir: &Path) -> Result<(), DataError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io("syncing directory", dir))
}

impl Drop for ShardWriter {
    /// A set that was not finished leaves nothing behind.
    fn drop(&mut self) {
        if !self.finished {
            let _ = std::fs::remove_dir_all(&self.tmp);
        }
    }
}
