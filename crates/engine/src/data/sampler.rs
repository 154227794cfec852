//! Batches of token windows: seeded random windows for training, contiguous
//! windows for evaluation.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use super::{check_ids, DataError, Goldfish, TokenSource};

/// A batch of next-token-prediction examples.
///
/// Row `b` holds a window of `seq_len` consecutive tokens in `inputs` and the
/// same window shifted one token to the right in `targets`, so
/// `targets[b * seq_len + t]` is the token that follows
/// `inputs[b * seq_len + t]` in the stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batch {
    /// Token ids, row-major with shape `[batch, seq_len]`.
    pub inputs: Vec<i64>,
    /// Next-token ids, row-major with shape `[batch, seq_len]`; a negative
    /// id ([`super::IGNORED_TARGET`], set by [`super::Goldfish`]) is left
    /// out of the loss.
    pub targets: Vec<i64>,
    /// Number of rows (windows).
    pub batch: usize,
    /// Tokens per row.
    pub seq_len: usize,
}

impl Batch {
    /// Builds a batch from the windows starting at `starts` (token offsets);
    /// each needs `seq_len + 1` tokens inside `tokens`.
    fn from_starts<T: TokenSource + ?Sized>(
        tokens: &T,
        seq_len: usize,
        starts: impl ExactSizeIterator<Item = usize>,
    ) -> Self {
        let batch = starts.len();
        let mut inputs = Vec::with_capacity(batch * seq_len);
        let mut targets = Vec::with_capacity(batch * seq_len);
        let mut window = vec![0u32; seq_len + 1];
        for start in starts {
            tokens.read(start, &mut window);
            inputs.extend(window[..seq_len].iter().map(|&t| i64::from(t)));
            targets.extend(window[1..].iter().map(|&t| i64::from(t)));
        }
        Batch {
            inputs,
            targets,
            batch,
            seq_len,
        }
    }
}

/// Everything needed to recreate a [`BatchSampler`] at the same point of its
/// random sequence (serialisable into a checkpoint).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SamplerState {
    /// Seed the random generator was created with.
    pub seed: u64,
    /// Windows (batch rows) drawn so far.
    pub windows_drawn: u64,
    /// Length of the token stream sampled from, in tokens.
    pub tokens_len: usize,
    /// Tokens per window (row).
    pub seq_len: usize,
}

/// Draws training batches of random windows, reproducibly.
///
/// The windows are read through [`TokenSource`], so a stream in memory and
/// the same tokens in memory-mapped shards give the same batches.
///
/// Each row is a window of `seq_len + 1` consecutive tokens whose start is
/// drawn uniformly from `0..=tokens_len - seq_len - 1` by a
/// [`StdRng`] seeded with `seed` (rows are independent, windows may overlap).
/// The same `(tokens_len, seq_len, seed)` always gives the same batches, and
/// [`BatchSampler::state`] / [`BatchSampler::from_state`] resume the sequence
/// exactly. `StdRng` is only reproducible for a fixed `rand` version (0.9 here).
#[derive(Debug, Clone)]
pub struct BatchSampler {
    rng: StdRng,
    seed: u64,
    windows_drawn: u64,
    tokens_len: usize,
    seq_len: usize,
}

impl BatchSampler {
    /// Creates a sampler over a stream of `tokens_len` tokens cutting windows
    /// of `seq_len` tokens (plus one for the target), seeded with `seed`.
    ///
    /// # Errors
    ///
    /// [`DataError::InvalidArgument`] if `seq_len == 0`;
    /// [`DataError::TooFewTokens`] if `tokens_len < seq_len + 1`.
    pub fn new(tokens_len: usize, seq_len: usize, seed: u64) -> Result<Self, DataError> {
        check_window(tokens_len, seq_len, "token stream")?;
        Ok(BatchSampler {
            rng: StdRng::seed_from_u64(seed),
            seed,
            windows_drawn: 0,
            tokens_len,
            seq_len,
        })
    }

    /// Recreates a sampler from a saved [`SamplerState`]: it continues with
    /// exactly the windows the saved sampler would have drawn next (the
    /// generator is replayed, O(`windows_drawn`)).
    ///
    /// # Errors
    ///
    /// As [`BatchSampler::new`], for the state's `tokens_len` and `seq_len`.
    pub fn from_state(state: SamplerState) -> Result<Self, DataError> {
        check_window(state.tokens_len, state.seq_len, "sampler state")?;
        let mut sampler = BatchSampler::new(state.tokens_len, state.seq_len, state.seed)?;
        for _ in 0..state.windows_drawn {
            sampler.next_start();
        }
        Ok(sampler)
    }

    /// The current state, to be stored in a checkpoint.
    pub fn state(&self) -> SamplerState {
        SamplerState {
            seed: self.seed,
            windows_drawn: self.windows_drawn,
            tokens_len: self.tokens_len,
            seq_len: self.seq_len,
        }
    }

    /// Tokens per window (row) of the batches drawn.
    pub fn seq_len(&self) -> usize {
        self.seq_len
    }

    /// Length, in tokens, of the stream this sampler draws from.
    pub fn tokens_len(&self) -> usize {
        self.tokens_len
    }

    /// Draws the next `batch` random windows from `tokens` as a [`Batch`] of
    /// shape `[batch, seq_len]`; `batch == 0` gives an empty batch and draws
    /// nothing.
    ///
    /// # Panics
    ///
    /// If `tokens.len()` differs from the `tokens_len` the sampler was made
    /// for (a programming error: pass the same stream every time).
    pub fn next_batch<T: TokenSource + ?Sized>(&mut self, tokens: &T, batch: usize) -> Batch {
        let starts: Vec<usize> = (0..batch).map(|_| self.next_start()).collect();
        self.next_batch_at(tokens, &starts)
    }

    /// Draws the same windows as [`BatchSampler::next_batch`] (the same
    /// random sequence, so a goldfish run sees the data of a plain one) and
    /// masks them with `goldfish`, reading the up to `context - 1` tokens
    /// before each window from `tokens` as its context (see
    /// [`Goldfish`](super::Goldfish)).
    ///
    /// # Panics
    ///
    /// As [`BatchSampler::next_batch`].
    pub fn next_goldfish_batch<T: TokenSource + ?Sized>(
        &mut self,
        tokens: &T,
        batch: usize,
        goldfish: &Goldfish,
    ) -> Batch {
        let starts: Vec<usize> = (0..batch).map(|_| self.next_start()).collect();
        self.goldfish_batch_at(tokens, &starts, goldfish)
    }

    /// Draws the windows [`BatchSampler::next_batch`] draws (masked as
    /// [`BatchSampler::next_goldfish_batch`] masks them when `goldfish` is
    /// given) after checking that every id they hold is below
    /// `vocab_size`, the model's vocabulary: an id outside it would index
    /// past the embedding and the head.
    ///
    /// # Errors
    ///
    /// [`DataError::OutOfVocab`] naming where the first such id is
    /// ([`TokenSource::locate`]: the shard and the offset in it for a
    /// shard set); the sampler has then drawn the windows.
    ///
    /// # Panics
    ///
    /// As [`BatchSampler::next_batch`].
    pub fn next_checked_batch<T: TokenSource + ?Sized>(
        &mut self,
        tokens: &T,
        batch: usize,
        vocab_size: usize,
        goldfish: Option<&Goldfish>,
    ) -> Result<Batch, DataError> {
        let starts: Vec<usize> = (0..batch).map(|_| self.next_start()).collect();
        for &start in &starts {
            check_ids(tokens, start, self.seq_len + 1, vocab_size)?;
        }
        Ok(match goldfish {
            Some(g) => self.goldfish_batch_at(tokens, &starts, g),
            None => self.next_batch_at(tokens, &starts),
        })
    }

    /// The windows at `starts` from `tokens`, masked by `goldfish` with the
    /// up to `context - 1` tokens before each window as its context.
    fn goldfish_batch_at<T: TokenSource + ?Sized>(
        &self,
        tokens: &T,
        starts: &[usize],
        goldfish: &Goldfish,
    ) -> Batch {
        let mut out = self.next_batch_at(tokens, starts);
        let n = self.seq_len;
        let mut lead = vec![0u32; goldfish.context() - 1];
        for (row, &start) in starts.iter().enumerate() {
            let before = start.min(goldfish.context() - 1);
            tokens.read(start - before, &mut lead[..before]);
            let lead: Vec<i64> = lead[..before].iter().map(|&t| i64::from(t)).collect();
            let span = row * n..(row + 1) * n;
            goldfish.mask_row(&lead, &out.inputs[span.clone()], &mut out.targets[span]);
        }
        out
    }

    /// The windows at `starts` from `tokens` (checked to be the stream the
    /// sampler was made for).
    fn next_batch_at<T: TokenSource + ?Sized>(&self, tokens: &T, starts: &[usize]) -> Batch {
        assert_eq!(
            tokens.len(),
            self.tokens_len,
            "BatchSampler was created for a stream of {} tokens but was given {}",
            self.tokens_len,
            tokens.len()
        );
        Batch::from_starts(tokens, self.seq_len, starts.iter().copied())
    }

    /// Draws one window start in `0..=tokens_len - seq_len - 1`.
    fn next_start(&mut self) -> usize {
        let max_start = (self.tokens_len - self.seq_len - 1) as u64;
        self.windows_drawn += 1;
        self.rng.random_range(0..=max_start) as usize
    }
}

fn check_window(tokens_len: usize, seq_len: usize, what: &'static str) -> Result<(), DataError> {
    if seq_len == 0 {
        return Err(DataError::InvalidArgument {
            name: "seq_len",
            value: "0".to_owned(),
            reason: "must be at least 1 token",
        });
    }
    if tokens_len <= seq_len {
        return Err(DataError::TooFewTokens {
            what,
            tokens_len,
            seq_len,
        });
    }
    Ok(())
}

/// Cuts evaluation batches from the start of `tokens` (in memory or a
/// shard set), deterministically.
///
/// Window `i` has inputs `tokens[i * seq_len .. (i + 1) * seq_len]` and the
/// targets shifted by one token, so windows do not overlap (each needs
/// `seq_len + 1` tokens; there are `(tokens.len() - 1) / seq_len` of them).
/// Windows are grouped in order into batches of `batch` rows and at most
/// `max_batches` batches are returned. Incomplete trailing windows are left
/// out, and so is an incomplete last batch, so every batch has shape
/// `[batch, seq_len]` — except when the windows do not fill even one batch:
/// then a single smaller batch holds all of them. Returns `[]` when
/// `seq_len`, `batch` or `max_batches` is 0 or `tokens` has at most `seq_len`
/// tokens.
pub fn eval_batches<T: TokenSource + ?Sized>(
    tokens: &T,
    seq_len: usize,
    batch: usize,
    max_batches: usize,
) -> Vec<Batch> {
    if seq_len == 0 || batch == 0 || max_batches == 0 || tokens.len() <= seq_len {
        return Vec::new();
    }
    let windows = (tokens.len() - 1) / seq_len;
    if windows < batch {
        return vec![Batch::from_starts(
            tokens,
            seq_len,
            (0..windows).map(|i| i * seq_len),
        )];
    }
    let n_batches = (windows / batch).min(max_batches);
    (0..n_batches)
        .map(|b| {
            Batch::from_starts(
                tokens,
                seq_len,
                (b * batch..(b + 1) * batch).map(|i| i * seq_len),
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stream(n: u32) -> Vec<u32> {
        (0..n).map(|i| i * 7 % 1000 + 3).collect()
    }

    fn check_windows(tokens: &[u32], b: &Batch) {
        assert_eq!(b.inputs.len(), b.batch * b.seq_len);
        assert_eq!(b.targets.len(), b.batch * b.seq_len);
        for row in 0..b.batch {
            let inp = &b.inputs[row * b.seq_len..(row + 1) * b.seq_len];
            let tgt = &b.targets[row * b.seq_len..(row + 1) * b.seq_len];
            assert_eq!(
                &inp[1..],
                &tgt[..b.seq_len - 1],
                "targets = inputs shifted by one"
            );
            // Locate the window in the stream (values are unique in `stream` over 1000 tokens).
            let start = tokens
                .windows(b.seq_len)
                .position(|w| w.iter().zip(inp).all(|(&a, &x)| i64::from(a) == x))
                .expect("window is a slice of the stream");
            assert!(start + b.seq_len < tokens.len(), "target stays in bounds");
            assert_eq!(tgt[b.seq_len - 1], i64::from(tokens[start + b.seq_len]));
        }
    }

    #[test]
    fn same_seed_same_batches_and_windows_in_bounds() {
        let tokens = stream(1000);
        let mut a = BatchSampler::new(tokens.len(), 16, 42).unwrap();
        let mut b = BatchSampler::new(tokens.len(), 16, 42).unwrap();
        let mut c = BatchSampler::new(tokens.len(), 16, 43).unwrap();
        let mut differs = false;
        for _ in 0..20 {
            let (x, y, z) = (
                a.next_batch(&tokens, 8),
                b.next_batch(&tokens, 8),
                c.next_batch(&tokens, 8),
            );
            assert_eq!(x, y);
            differs |= x != z;
            check_windows(&tokens, &x);
        }
        assert!(differs, "different seeds give different batches");
    }

    #[test]
    fn edge_windows_reachable() {
        // seq_len = len - 1: the only window is the whole stream.
        let tokens = stream(10);
        let mut s = BatchSampler::new(10, 9, 0).unwrap();
        let b = s.next_batch(&tokens, 3);
        for row in 0..3 {
            assert_eq!(b.inputs[row * 9], i64::from(tokens[0]));
            assert_eq!(b.targets[row * 9 + 8], i64::from(tokens[9]));
        }
        // Both extreme starts occur with a small range.
        let tokens = stream(12);
        let mut s = BatchSampler::new(12, 10, 1).unwrap();
        let b = s.next_batch(&tokens, 64);
        let firsts: std::collections::BTreeSet<i64> = (0..64).map(|r| b.inputs[r * 10]).collect();
        assert_eq!(firsts.len(), 2);
        assert!(s.next_batch(&tokens, 0).inputs.is_empty());
    }

    #[test]
    fn state_resumes_identically() {
        let tokens = stream(1000);
        let mut a = BatchSampler::new(tokens.len(), 32, 7).unwrap();
        for _ in 0..5 {
            a.next_batch(&tokens, 4);
        }
        let state = a.state();
        assert_eq!(state.windows_drawn, 20);
        let json = serde_json::to_string(&state).unwrap();
        let restored: SamplerState = serde_json::from_str(&json).unwrap();
        let mut b = BatchSampler::from_state(restored).unwrap();
        for _ in 0..5 {
            assert_eq!(a.next_batch(&tokens, 4), b.next_batch(&tokens, 4));
        }
        assert_eq!(a.state(), b.state());
    }

    #[test]
    fn constructor_errors() {
        assert!(matches!(
            BatchSampler::new(10, 10, 0),
            Err(DataError::TooFewTokens {
                tokens_len: 10,
                seq_len: 10,
                ..
            })
        ));
        assert!(matches!(
            BatchSampler::new(10, 0, 0),
            Err(DataError::InvalidArgument {
                name: "seq_len",
                ..
            })
        ));
        let bad = SamplerState {
            seed: 0,
            windows_drawn: 3,
            tokens_len: 4,
            seq_len: 8,
        };
        let err = BatchSampler::from_state(bad).unwrap_err();
        assert!(err.to_string().contains("sampler state"), "{err}");
    }

    #[test]
    #[should_panic(expected = "created for a stream of")]
    fn wrong_stream_length_panics() {
        let tokens = stream(100);
        let mut s = BatchSampler::new(50, 8, 0).unwrap();
        s.next_batch(&tokens, 1);
    }

    #[test]
    fn eval_batches_are_contiguous() {
        let tokens: Vec<u32> = (0..101).collect();
        let batches = eval_batches(&tokens, 10, 3, 100);
        // 10 windows -> 3 full batches of 3; the last window is dropped.
        assert_eq!(batches.len(), 3);
        for (b, batch) in batches.iter().enumerate() {
            assert_eq!((batch.batch, batch.seq_len), (3, 10));
            for row in 0..3 {
                let w = (b * 3 + row) as i64;
                let inp = &batch.inputs[row * 10..(row + 1) * 10];
                let tgt = &batch.targets[row * 10..(row + 1) * 10];
                assert_eq!(inp, (w * 10..w * 10 + 10).collect::<Vec<_>>());
                assert_eq!(tgt, (w * 10 + 1..w * 10 + 11).collect::<Vec<_>>());
            }
        }
        assert_eq!(eval_batches(&tokens, 10, 3, 2).len(), 2);
        assert_eq!(
            eval_batches(&tokens, 10, 3, 2),
            eval_batches(&tokens, 10, 3, 2)
        );
        // Fewer windows than one batch: one smaller batch.
        let small = eval_batches(&tokens[..25], 10, 8, 4);
        assert_eq!(small.len(), 1);
        assert_eq!(small[0].batch, 2);
        // Degenerate inputs.
        assert!(eval_batches(&tokens[..10], 10, 2, 4).is_empty());
        assert!(eval_batches(&tokens, 0, 2, 4).is_empty());
        assert!(eval_batches(&tokens, 10, 0, 4).is_empty());
        assert!(eval_batches(&tokens, 10, 2, 0).is_empty());
    }
}
