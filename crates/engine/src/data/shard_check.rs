//! The check of a token shard's contents. `index.json` holds each shard's
//! XXH3-64 (seed 0, of the whole file, header included: what `xxhsum -H3
//! FILE` prints); a check reads the shard once, in pieces, hashing it and
//! finding the first id that is not below the vocabulary.
//!
//! XXH3 runs at memory bandwidth, so checking a set costs about what
//! reading it once costs. It detects damage (a flipped bit, a block of
//! zeros, a partial copy), not tampering: it is not a cryptographic hash.

use std::fs::File;
use std::io::Read;
use std::path::Path;

use xxhash_rust::xxh3::{xxh3_64, Xxh3};

use super::shard_format::{TokenWidth, HEADER_BYTES};
use super::DataError;

/// Bytes hashed and scanned between two progress reports (a multiple of
/// every token width).
const PIECE_BYTES: usize = 1 << 24;

/// XXH3-64 (seed 0) of `bytes` as 16 lowercase hex digits.
pub fn xxh3_64_hex(bytes: &[u8]) -> String {
    format!("{:016x}", xxh3_64(bytes))
}

/// XXH3-64 (seed 0) of the file at `path`, read in pieces, as 16
/// lowercase hex digits.
///
/// # Errors
///
/// [`DataError::Io`] naming the file if it cannot be read.
pub fn xxh3_64_file(path: &Path) -> Result<String, DataError> {
    let io = |source| DataError::Io {
        action: "reading token shard",
        path: path.to_path_buf(),
        source,
    };
    let mut file = File::open(path).map_err(io)?;
    let mut hasher = Xxh3::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf).map_err(io)?;
        if n == 0 {
            return Ok(format!("{:016x}", hasher.digest()));
        }
        hasher.update(&buf[..n]);
    }
}

/// Where token `offset` (counted from 0) of the shard at `path` is, for
/// error messages: the token and its byte in the file.
pub(super) fn shard_location(path: &Path, offset: u64, width: TokenWidth) -> String {
    format!(
        "{}, token {offset} of the shard (byte {})",
        path.display(),
        HEADER_BYTES as u64 + offset * width.bytes() as u64
    )
}

/// The first id of `ids` (`width`-byte little-endian ids) that is not
/// below `vocab_size`: its index among `ids` and its value.
fn first_outside(ids: &[u8], width: TokenWidth, vocab_size: usize) -> Option<(usize, u32)> {
    let mut id = [0u32; 1];
    ids.chunks_exact(width.bytes())
        .enumerate()
        .find_map(|(i, bytes)| {
            width.decode(bytes, &mut id);
            (id[0] as usize >= vocab_size).then_some((i, id[0]))
        })
}

/// Checks the shard at `path`, whose bytes (header and ids) are `bytes`:
/// its XXH3-64 must be `expected` and every id below `vocab_size` (the
/// set's tokenizer's). `progress` is called with the bytes checked so far.
///
/// # Errors
///
/// [`DataError::BadShardSet`] naming the shard when the checksum differs
/// (reported first: damage explains a wrong id); else
/// [`DataError::OutOfVocab`] naming the shard and the token's offset.
pub(super) fn check_shard(
    path: &Path,
    bytes: &[u8],
    width: TokenWidth,
    expected: &str,
    vocab_size: usize,
    progress: &mut dyn FnMut(u64),
) -> Result<(), DataError> {
    let mut hasher = Xxh3::new();
    let header = HEADER_BYTES.min(bytes.len());
    hasher.update(&bytes[..header]);
    let mut outside = None;
    let mut done = header;
    for (p, piece) in bytes[header..].chunks(PIECE_BYTES).enumerate() {
        hasher.update(piece);
        if outside.is_none() {
            outside = first_outside(piece, width, vocab_size)
                .map(|(i, id)| ((p * PIECE_BYTES / width.bytes() + i) as u64, id));
        }
        done += piece.len();
        progress(done as u64);
    }
    let got = format!("{:016x}", hasher.digest());
    if got != expected {
        return Err(DataError::BadShardSet {
            path: path.to_path_buf(),
            reason: format!(
                "XXH3-64 {got}, but index.json says {expected}: the shard is damaged or changed since the set was made"
            ),
        });
    }
    match outside {
        Some((offset, id)) => Err(DataError::OutOfVocab {
            id,
            vocab_size,
            whose: "the shard set's tokenizer's",
            at: shard_location(path, offset, width),
        }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::super::shard_format::header;
    use super::*;

    #[test]
    fn xxh3_64_matches_the_reference_test_vectors() {
        // XXH3_64bits(seed 0) as the C library computes it (Python's
        // `xxhash.xxh3_64_hexdigest`, 4.1.0): the empty input, one byte,
        // and 300 bytes (the long-input path, over 240 bytes).
        assert_eq!(xxh3_64_hex(b""), "2d06800538d394c2");
        assert_eq!(xxh3_64_hex(b"a"), "e6c632b61e964e1f");
        let long: Vec<u8> = (0..300u32).map(|i| (i * 7 % 251) as u8).collect();
        assert_eq!(xxh3_64_hex(&long), "21869f12772ec1b4");
        // Pieces and the whole give the same digest.
        let dir = std::env::temp_dir().join(format!("ferrotron-xxh3-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("f");
        let bytes: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7 % 251) as u8).collect();
        std::fs::write(&path, &bytes).unwrap();
        assert_eq!(xxh3_64_file(&path).unwrap(), xxh3_64_hex(&bytes));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A shard of `ids` in `width`.
    fn shard(width: TokenWidth, ids: &[u32]) -> Vec<u8> {
        let mut bytes = header(width, ids.len() as u64).to_vec();
        for &id in ids {
            width.put(id, &mut bytes);
        }
        bytes
    }

    #[test]
    fn a_shard_is_checked_for_its_checksum_then_its_ids() {
        let path = Path::new("set/shard-00003.bin");
        let ids: Vec<u32> = (0..10_000).map(|i| i % 300).collect();
        for width in [TokenWidth::U16, TokenWidth::U32] {
            let good = shard(width, &ids);
            let sum = xxh3_64_hex(&good);
            let mut reports = Vec::new();
            check_shard(path, &good, width, &sum, 300, &mut |d| reports.push(d)).unwrap();
            assert_eq!(reports.last(), Some(&(good.len() as u64)));

            // One flipped bit: the checksum names the shard.
            let mut flipped = good.clone();
            flipped[5000] ^= 4;
            let e = check_shard(path, &flipped, width, &sum, 300, &mut |_| {})
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("shard-00003.bin") && e.contains("damaged") && e.contains(&sum),
                "{e}"
            );

            // An id of 300 at token 7777 with a matching checksum (a set
            // written by another tool): named with its offset.
            let mut bad_ids = ids.clone();
            bad_ids[7777] = 300;
            let bad = shard(width, &bad_ids);
            let e = check_shard(path, &bad, width, &xxh3_64_hex(&bad), 300, &mut |_| {})
                .unwrap_err()
                .to_string();
            let byte = 32 + 7777 * width.bytes();
            assert!(
                e.contains("token id 300")
                    && e.contains(&format!(
                        "shard-00003.bin, token 7777 of the shard (byte {byte})"
                    ))
                    && e.contains("300 tokens (the shard set's tokenizer's)"),
                "{e}"
            );
        }
    }
}
