//! `index.json` of a token shard set: what the shards hold and which
//! tokenizer made them.

use std::path::Path;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::shard_format::{TokenWidth, HEADER_BYTES};
use super::DataError;

/// Name of the index file in a shard set directory.
pub const INDEX_FILE: &str = "index.json";

/// Name of the tokenizer file in a shard set directory.
pub const TOKENIZER_FILE: &str = "tokenizer.json";

/// The `format` field of every index.
pub const FORMAT: &str = "ferrotron-token-shards";

/// The index of a shard set. The token stream is the shards' tokens in
/// the order listed; documents are separated by `eos_id` when the
/// tokenizer has one (between documents, not after the last).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShardIndex {
    /// Always [`FORMAT`].
    pub format: String,
    /// Shard format version ([`super::shard_format::VERSION`]).
    pub version: u32,
    /// How ids are stored in the shards.
    pub dtype: TokenWidth,
    /// The tokenizer's vocabulary, special tokens included (tokens).
    pub vocab_size: usize,
    /// The id put between two documents (`None`: the tokenizer has no
    /// end-of-text token and documents follow each other directly).
    pub eos_id: Option<u32>,
    /// SHA-256 of `tokenizer.json`, lowercase hex.
    pub tokenizer_sha256: String,
    /// Documents in the set (empty documents are left out).
    pub documents: u64,
    /// Tokens in the set, separators included.
    pub tokens: u64,
    /// UTF-8 bytes of the text the tokens encode.
    pub text_bytes: u64,
    /// The shards, in stream order.
    pub shards: Vec<ShardEntry>,
}

/// One shard of the index.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShardEntry {
    /// File name inside the set directory.
    pub file: String,
    /// Tokens in the shard.
    pub tokens: u64,
    /// Documents that start in the shard.
    pub documents: u64,
    /// XXH3-64 (seed 0) of the whole shard file, 16 lowercase hex digits
    /// (`None` only in an index written before checksums, which
    /// [`ShardIndex::read`] refuses).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub xxh3_64: Option<String>,
}

impl ShardEntry {
    /// Bytes of the shard file: the header and `tokens` ids of `width`.
    pub fn file_bytes(&self, width: TokenWidth) -> u64 {
        HEADER_BYTES as u64 + self.tokens * width.bytes() as u64
    }
}

impl ShardIndex {
    /// Reads `dir/index.json`; returns the index and the SHA-256 of its bytes.
    ///
    /// # Errors
    ///
    /// [`DataError::Io`] if it cannot be read, [`DataError::BadShardSet`]
    /// naming it if it is not an index of this format or lacks a shard's
    /// checksum.
    pub fn read(dir: &Path) -> Result<(Self, String), DataError> {
        let path = dir.join(INDEX_FILE);
        let bytes = std::fs::read(&path).map_err(|source| DataError::Io {
            action: "reading shard index",
            path: path.clone(),
            source,
        })?;
        let bad = |reason: String| DataError::BadShardSet {
            path: path.clone(),
            reason,
        };
        let index: Self = serde_json::from_slice(&bytes)
            .map_err(|e| bad(format!("not a token shard index: {e}")))?;
        if index.format != FORMAT {
            return Err(bad(format!(
                "format `{}`, expected `{FORMAT}`",
                index.format
            )));
        }
        if index.version != super::shard_format::VERSION {
            return Err(bad(format!(
                "version {}, this build reads {}",
                index.version,
                super::shard_format::VERSION
            )));
        }
        // A damaged index may hold counts whose sum or file size overflows.
        let width = index.dtype.bytes() as u64;
        let fits = |s: &ShardEntry| {
            s.tokens
                .checked_mul(width)
                .and_then(|b| b.checked_add(HEADER_BYTES as u64))
                .is_some()
        };
        let sum = index
            .shards
            .iter()
            .try_fold(0u64, |a, s| a.checked_add(s.tokens).filter(|_| fits(s)));
        if sum != Some(index.tokens) || index.tokens == 0 {
            return Err(bad(format!(
                "lists shards of {} tokens in all but a total of {}",
                sum.map_or("too many".into(), |n| n.to_string()),
                index.tokens
            )));
        }
        if let Some(old) = index.shards.iter().find(|s| s.xxh3_64.is_none()) {
            return Err(bad(format!(
                "lists no checksum for {} (an index written before shards had checksums); make the set again with `ferrotron data prepare`",
                old.file
            )));
        }
        Ok((index, sha256_hex(&bytes)))
    }

    /// Bytes of all the shard files.
    pub fn shard_bytes(&self) -> u64 {
        self.shards.iter().map(|s| s.file_bytes(self.dtype)).sum()
    }
}

/// SHA-256 of `bytes` as 64 lowercase hex digits.
pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Counts that overflow are refused, not summed (a damaged index).
    #[test]
    fn an_index_whose_counts_overflow_is_refused() {
        let dir = std::env::temp_dir().join(format!("ferrotron-index-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let shard = |tokens: u64| serde_json::json!({"file": "shard-00000.bin", "tokens": tokens, "documents": 1, "xxh3_64": "0000000000000000"});
        for (total, shards) in [
            (1u64 << 63, vec![shard(1 << 63)]),
            (u64::MAX, vec![shard(u64::MAX), shard(1)]),
        ] {
            let index = serde_json::json!({
                "format": FORMAT, "version": 1, "dtype": "u16", "vocab_size": 300,
                "eos_id": null, "tokenizer_sha256": "", "documents": 1,
                "tokens": total, "text_bytes": 1, "shards": shards,
            });
            std::fs::write(dir.join(INDEX_FILE), index.to_string()).unwrap();
            let e = ShardIndex::read(&dir).unwrap_err().to_string();
            assert!(e.contains("too many"), "{e}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn sha256_matches_the_published_test_vector() {
        // FIPS 180-2, appendix B.1.
        assert_eq!(
            sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
