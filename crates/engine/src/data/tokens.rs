//! Token streams addressed by position: an in-memory `Vec<u32>`, a
//! memory-mapped shard set, or a contiguous part of either. The sampler and
//! the evaluation batches read windows through [`TokenSource`], so the
//! in-memory path and the shard path cut identical windows from identical
//! tokens.

use super::DataError;

/// A read-only stream of token ids.
pub trait TokenSource: Sync {
    /// Number of tokens in the stream.
    fn len(&self) -> usize;

    /// Whether the stream holds no token.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Copies the tokens at positions `start .. start + out.len()` into `out`.
    ///
    /// # Panics
    ///
    /// If the range goes past [`TokenSource::len`] (a programming error).
    fn read(&self, start: usize, out: &mut [u32]);

    /// Where position `pos` of the stream is, for error messages: `token
    /// POS of the stream`; a shard set names the shard and the offset in it.
    fn locate(&self, pos: usize) -> String {
        format!("token {pos} of the stream")
    }
}

impl TokenSource for [u32] {
    fn len(&self) -> usize {
        <[u32]>::len(self)
    }

    fn read(&self, start: usize, out: &mut [u32]) {
        out.copy_from_slice(&self[start..start + out.len()]);
    }
}

impl TokenSource for Vec<u32> {
    fn len(&self) -> usize {
        self.as_slice().len()
    }

    fn read(&self, start: usize, out: &mut [u32]) {
        self.as_slice().read(start, out);
    }
}

/// Checks that the `len` ids of `tokens` from position `start` are below
/// `vocab_size`, the model's vocabulary (the host's check before a batch
/// reaches the embedding and the head, whose kernels do not check).
///
/// # Errors
///
/// [`DataError::OutOfVocab`] naming where the first id outside it is
/// ([`TokenSource::locate`]).
///
/// # Panics
///
/// If the range goes past the end of `tokens`.
pub fn check_ids<T: TokenSource + ?Sized>(
    tokens: &T,
    start: usize,
    len: usize,
    vocab_size: usize,
) -> Result<(), DataError> {
    let mut window = vec![0u32; len];
    tokens.read(start, &mut window);
    match window.iter().position(|&id| id as usize >= vocab_size) {
        Some(i) => Err(DataError::OutOfVocab {
            id: window[i],
            vocab_size,
            whose: "the model's",
            at: tokens.locate(start + i),
        }),
        None => Ok(()),
    }
}

/// The tokens at positions `start .. start + len` of another source (the
/// training or the validation part of a shard set), renumbered from 0.
#[derive(Clone, Copy)]
pub struct TokenRange<'a> {
    source: &'a dyn TokenSource,
    start: usize,
    len: usize,
}

impl<'a> TokenRange<'a> {
    /// The part `start .. start + len` of `source`.
    ///
    /// # Panics
    ///
    /// If the part goes past the end of `source`.
    pub fn new(source: &'a dyn TokenSource, start: usize, len: usize) -> Self {
        assert!(
            start
                .checked_add(len)
                .is_some_and(|end| end <= source.len()),
            "token range {start}..{start}+{len} is outside a stream of {} tokens",
            source.len()
        );
        Self { source, start, len }
    }
}

impl TokenSource for TokenRange<'_> {
    fn len(&self) -> usize {
        self.len
    }

    fn read(&self, start: usize, out: &mut [u32]) {
        assert!(
            start + out.len() <= self.len,
            "reading {start}..{} of a range of {} tokens",
            start + out.len(),
            self.len
        );
        self.source.read(self.start + start, out);
    }

    fn locate(&self, pos: usize) -> String {
        self.source.locate(self.start + pos)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_read_the_part_of_their_source() {
        let all: Vec<u32> = (0..100).collect();
        let part = TokenRange::new(&all, 90, 10);
        assert_eq!(part.len(), 10);
        let mut out = [0; 4];
        part.read(3, &mut out);
        assert_eq!(out, [93, 94, 95, 96]);
        let inner = TokenRange::new(&part, 5, 5);
        inner.read(0, &mut out);
        assert_eq!(out, [95, 96, 97, 98]);
    }

    #[test]
    #[should_panic(expected = "outside a stream of 100 tokens")]
    fn ranges_past_the_end_panic() {
        let all: Vec<u32> = (0..100).collect();
        TokenRange::new(&all, 95, 6);
    }
}
