//! One token shard file: a 32-byte header, then the token ids.
//!
//! | bytes | content |
//! |---|---|
//! | 0..8 | magic `FTTOKENS` |
//! | 8..12 | format version, u32 little-endian (1) |
//! | 12..16 | bytes per token, u32 little-endian (2 or 4) |
//! | 16..24 | number of tokens, u64 little-endian |
//! | 24..32 | zero |
//! | 32.. | the token ids, u16 or u32 little-endian |
//!
//! A shard of `n` tokens is therefore exactly `32 + n x width` bytes long,
//! which is how a truncated file is recognised.

use serde::{Deserialize, Serialize};

/// The first 8 bytes of every shard.
pub const MAGIC: [u8; 8] = *b"FTTOKENS";

/// The format version written in the header.
pub const VERSION: u32 = 1;

/// Size of the header in bytes (the tokens start here).
pub const HEADER_BYTES: usize = 32;

/// How a token id is stored: 2 bytes when every id of the vocabulary fits
/// in a u16, else 4.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TokenWidth {
    /// Little-endian u16 (vocabularies of at most 65,536 tokens).
    U16,
    /// Little-endian u32.
    U32,
}

impl TokenWidth {
    /// The narrowest width holding ids `0..vocab_size`.
    pub fn for_vocab(vocab_size: usize) -> Self {
        if vocab_size <= 1 << 16 {
            Self::U16
        } else {
            Self::U32
        }
    }

    /// Bytes per token.
    pub fn bytes(self) -> usize {
        match self {
            Self::U16 => 2,
            Self::U32 => 4,
        }
    }

    /// Appends `id` to `out` in this width (`id` must fit; see
    /// [`TokenWidth::for_vocab`]).
    pub fn put(self, id: u32, out: &mut Vec<u8>) {
        match self {
            Self::U16 => out.extend_from_slice(&(id as u16).to_le_bytes()),
            Self::U32 => out.extend_from_slice(&id.to_le_bytes()),
        }
    }

    /// Decodes `out.len()` ids from `bytes` (`out.len() x width` bytes).
    pub fn decode(self, bytes: &[u8], out: &mut [u32]) {
        match self {
            Self::U16 => {
                for (o, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                    *o = u32::from(u16::from_le_bytes([b[0], b[1]]));
                }
            }
            Self::U32 => {
                for (o, b) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                    *o = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                }
            }
        }
    }
}

/// The header of a shard holding `tokens` ids of `width`.
pub fn header(width: TokenWidth, tokens: u64) -> [u8; HEADER_BYTES] {
    let mut h = [0u8; HEADER_BYTES];
    h[..8].copy_from_slice(&MAGIC);
    h[8..12].copy_from_slice(&VERSION.to_le_bytes());
    h[12..16].copy_from_slice(&(width.bytes() as u32).to_le_bytes());
    h[16..24].copy_from_slice(&tokens.to_le_bytes());
    h
}

/// Reads a header: `(width, tokens)`, or what is wrong with it.
pub fn parse_header(bytes: &[u8]) -> Result<(TokenWidth, u64), String> {
    if bytes.len() < HEADER_BYTES {
        return Err(format!(
            "{} bytes, shorter than the {HEADER_BYTES}-byte shard header",
            bytes.len()
        ));
    }
    if bytes[..8] != MAGIC {
        return Err("not a Ferrotron token shard (bad magic)".into());
    }
    let word = |i: usize| u32::from_le_bytes([bytes[i], bytes[i + 1], bytes[i + 2], bytes[i + 3]]);
    if word(8) != VERSION {
        return Err(format!(
            "shard format version {}, this build reads {VERSION}",
            word(8)
        ));
    }
    let width = match word(12) {
        2 => TokenWidth::U16,
        4 => TokenWidth::U32,
        n => {
            return Err(format!(
                "{n} bytes per token in the header (2 or 4 expected)"
            ))
        }
    };
    let mut n = [0u8; 8];
    n.copy_from_slice(&bytes[16..24]);
    Ok((width, u64::from_le_bytes(n)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_and_ids_round_trip() {
        for (width, ids) in [
            (TokenWidth::U16, vec![0u32, 1, 65_535, 300]),
            (TokenWidth::U32, vec![0u32, 65_536, u32::MAX, 7]),
        ] {
            let mut bytes = header(width, ids.len() as u64).to_vec();
            for &id in &ids {
                width.put(id, &mut bytes);
            }
            assert_eq!(bytes.len(), HEADER_BYTES + ids.len() * width.bytes());
            assert_eq!(parse_header(&bytes).unwrap(), (width, ids.len() as u64));
            let mut back = vec![0; ids.len()];
            width.decode(&bytes[HEADER_BYTES..], &mut back);
            assert_eq!(back, ids);
        }
        assert_eq!(TokenWidth::for_vocab(65_536), TokenWidth::U16);
        assert_eq!(TokenWidth::for_vocab(65_537), TokenWidth::U32);
    }

    #[test]
    fn foreign_headers_are_refused() {
        assert!(parse_header(b"short").unwrap_err().contains("shorter"));
        let mut h = header(TokenWidth::U16, 3);
        h[0] = b'X';
        assert!(parse_header(&h).unwrap_err().contains("bad magic"));
        let mut h = header(TokenWidth::U16, 3);
        h[12] = 3;
        assert!(parse_header(&h).unwrap_err().contains("3 bytes per token"));
        let mut h = header(TokenWidth::U16, 3);
        h[8] = 9;
        assert!(parse_header(&h).unwrap_err().contains("version 9"));
    }
}
