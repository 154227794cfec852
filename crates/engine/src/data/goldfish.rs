//! Goldfish loss (Hans et al. 2024, "Be like a Goldfish, Don't Memorize!
//! Mitigating Memorization in Generative LLMs", arXiv:2406.10209): a
//! deterministic mask drops about one target in `k` from the training loss,
//! so the model never sees the whole of any passage as a supervised target
//! and cannot reproduce it verbatim.
//!
//! **Which targets are dropped** (the paper's hashed mask, §3.1). Let the
//! target at row position `t` be the stream token `x[i]` (its input is
//! `x[i - 1]`). It is dropped when
//!
//! ```text
//! i >= h   and   hash(x[i - h .. i]) % k == 0
//! ```
//!
//! that is, when the hash of the `h` tokens immediately preceding the
//! predicted token (the last `h` inputs up to and including its own) is
//! divisible by `k`. The decision depends on the token ids alone, so the
//! same text drops the same tokens in every row, batch, rank, run and
//! machine.
//!
//! **Context before a row.** The `h` preceding tokens are read from the
//! token stream, also where they lie before the row's first input:
//! [`BatchSampler::next_goldfish_batch`](super::BatchSampler::next_goldfish_batch)
//! reads up to `h - 1` tokens before each window. Training windows start
//! anywhere, so a mask that never dropped the first `h - 1` targets of a row
//! (as the paper's reference code does for its fixed sequences) would
//! still supervise every dropped token in about `(h - 1) / seq_len` of its
//! occurrences, which is enough to memorise it over many epochs. Only the
//! first `h - 1` tokens of the stream itself, which have no `h` predecessors,
//! are never dropped; so are the first `h - 1` targets of a batch masked
//! with [`Goldfish::apply`], which knows nothing before its rows. The
//! stream crosses document boundaries (the end-of-text token between two
//! documents is hashed like any other), as packed sequences do.
//!
//! The paper's reference implementation (`apply_goldfish`, strategy
//! `hash-table`) looks the product of a window of ids up in a table of
//! seeded random floats; its window is the `h` labels ending at the
//! target, so it includes the predicted token itself. Ferrotron follows the
//! paper's text instead (the `h` preceding tokens, the predicted token
//! excluded, so the mask is a function of the inputs) and uses a fixed
//! hash that depends on the order of the ids, needs no table and has no
//! product collapse (a window containing id 0 has product 0 there):
//! [`context_hash`], FNV-1a (64-bit) over the ids as little-endian u32
//! bytes, then SplitMix64's finaliser so every bit (and hence `% k`) is
//! well mixed.
//!
//! A dropped target becomes [`IGNORED_TARGET`]; every loss (the reference
//! and fused cross-entropy, the vocabulary-parallel one under TP) leaves
//! such rows out of its mean and gives them no gradient, so the loss of a
//! micro-batch is the mean over its kept targets.

use super::{Batch, DataError};

/// The target value a loss leaves out (PyTorch's `ignore_index` default).
/// Every negative target is ignored the same way.
pub const IGNORED_TARGET: i64 = -100;

/// The paper's context width `h` (its released configs use 13).
pub const DEFAULT_GOLDFISH_CONTEXT: usize = 13;

/// The hashed goldfish mask: drop about one target in `k`, chosen by the
/// hash of the `context` tokens preceding it (see the module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Goldfish {
    k: usize,
    context: usize,
}

impl Goldfish {
    /// A mask dropping about one target in `k`, hashing `context` tokens.
    ///
    /// # Errors
    ///
    /// [`DataError::InvalidArgument`] naming `goldfish_k` when `k < 2`, or
    /// `goldfish_context` when `context == 0`.
    pub fn new(k: usize, context: usize) -> Result<Self, DataError> {
        if k < 2 {
            return Err(DataError::InvalidArgument {
                name: "goldfish_k",
                value: k.to_string(),
                reason: "must be at least 2 (one token in k is dropped from the loss)",
            });
        }
        if context == 0 {
            return Err(DataError::InvalidArgument {
                name: "goldfish_context",
                value: "0".to_owned(),
                reason: "must be at least 1 token",
            });
        }
        Ok(Self { k, context })
    }

    /// One target in about `k` is dropped (`k >= 2`).
    pub fn k(&self) -> usize {
        self.k
    }

    /// Tokens hashed before each target, `h` (`>= 1`).
    pub fn context(&self) -> usize {
        self.context
    }

    /// Whether the target that follows `preceding` (the `context` tokens
    /// just before it, oldest first) is dropped.
    ///
    /// # Panics
    ///
    /// If `preceding.len() != self.context` (a programming error).
    pub fn drops(&self, preceding: &[i64]) -> bool {
        assert_eq!(
            preceding.len(),
            self.context,
            "the goldfish mask hashes exactly {} preceding tokens",
            self.context
        );
        context_hash(preceding).is_multiple_of(self.k as u64)
    }

    /// The mask of one row: `true` where the target at that position is
    /// dropped. `inputs` `[seq_len]` are the row's inputs and `lead` the
    /// stream tokens just before `inputs[0]` (at most the last `context -
    /// 1` are used; fewer at the start of the stream, none when unknown).
    pub fn row_mask(&self, lead: &[i64], inputs: &[i64]) -> Vec<bool> {
        let lead = &lead[lead.len().saturating_sub(self.context - 1)..];
        let ids: Vec<i64> = lead.iter().chain(inputs).copied().collect();
        (lead.len()..ids.len())
            .map(|end| end + 1 >= self.context && self.drops(&ids[end + 1 - self.context..=end]))
            .collect()
    }

    /// Replaces the dropped targets of one row by [`IGNORED_TARGET`]
    /// (`inputs`, `lead` as in [`Goldfish::row_mask`]; `targets` the
    /// row's `[seq_len]` targets); returns how many were dropped.
    pub fn mask_row(&self, lead: &[i64], inputs: &[i64], targets: &mut [i64]) -> usize {
        let mut dropped = 0;
        for (target, drop) in targets.iter_mut().zip(self.row_mask(lead, inputs)) {
            if drop {
                *target = IGNORED_TARGET;
                dropped += 1;
            }
        }
        dropped
    }

    /// Replaces every dropped target of `batch` by [`IGNORED_TARGET`],
    /// knowing nothing before each row (its first `context - 1` targets are
    /// kept); returns how many were dropped. Training batches drawn from a
    /// stream are masked with their context by
    /// [`BatchSampler::next_goldfish_batch`](super::BatchSampler::next_goldfish_batch).
    pub fn apply(&self, batch: &mut Batch) -> usize {
        let n = batch.seq_len;
        (0..batch.batch)
            .map(|row| {
                let span = row * n..(row + 1) * n;
                self.mask_row(&[], &batch.inputs[span.clone()], &mut batch.targets[span])
            })
            .sum()
    }
}

/// The goldfish hash of a window of token ids: FNV-1a (64-bit; offset
/// basis `0xcbf29ce484222325`, prime `0x100000001b3`) over each id as 4
/// little-endian bytes (ids are below 2^32), then SplitMix64's finaliser
/// (Steele et al. 2014). Fixed forever: changing it changes which tokens
/// every run drops.
pub fn context_hash(ids: &[i64]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &id in ids {
        for byte in (id as u32).to_le_bytes() {
            h ^= u64::from(byte);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h ^= h >> 30;
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= h >> 27;
    h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::BatchSampler;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    fn random_stream(n: usize, vocab: u32, seed: u64) -> Vec<u32> {
        let mut rng = StdRng::seed_from_u64(seed);
        (0..n).map(|_| rng.random_range(0..vocab)).collect()
    }

    #[test]
    fn hash_is_the_documented_fnv1a_then_splitmix() {
        // FNV-1a 64 of the empty input is the offset basis; of the bytes
        // "a" it is 0xaf63dc4c8601ec8c (the published test vector).
        let fnv = |bytes: &[u8]| {
            let mut h: u64 = 0xcbf2_9ce4_8422_2325;
            for &b in bytes {
                h ^= u64::from(b);
                h = h.wrapping_mul(0x0000_0100_0000_01b3);
            }
            h
        };
        assert_eq!(fnv(b"a"), 0xaf63_dc4c_8601_ec8c);
        let mix = |mut z: u64| {
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        };
        assert_eq!(context_hash(&[]), mix(0xcbf2_9ce4_8422_2325));
        assert_eq!(
            context_hash(&[0x64636261, 7]),
            mix(fnv(&[b'a', b'b', b'c', b'd', 7, 0, 0, 0]))
        );
        // Order matters; id 0 does not collapse the key.
        assert_ne!(context_hash(&[1, 2]), context_hash(&[2, 1]));
        assert_ne!(context_hash(&[0, 5]), context_hash(&[0, 6]));
    }

    #[test]
    fn bad_parameters_are_refused_by_name() {
        let e = Goldfish::new(1, 13).unwrap_err().to_string();
        assert!(e.contains("goldfish_k"), "{e}");
        let e = Goldfish::new(4, 0).unwrap_err().to_string();
        assert!(e.contains("goldfish_context"), "{e}");
        assert!(Goldfish::new(2, 1).is_ok());
    }

    #[test]
    fn about_one_target_in_k_is_dropped() {
        let stream: Vec<i64> = random_stream(200_000, 50_000, 1)
            .into_iter()
            .map(i64::from)
            .collect();
        for (k, h) in [(2, 1), (4, 13), (7, 3), (100, 13)] {
            let g = Goldfish::new(k, h).unwrap();
            let mask = g.row_mask(&[], &stream);
            assert!(mask[..h - 1].iter().all(|d| !d), "k {k} h {h}");
            let n = (mask.len() - (h - 1)) as f64;
            let dropped = mask.iter().filter(|&&d| d).count() as f64;
            // Binomial(n, 1/k): the count stays within 5 standard
            // deviations of n/k (a false failure has odds below 1e-6).
            let p = 1.0 / k as f64;
            let sd = (n * p * (1.0 - p)).sqrt();
            assert!(
                (dropped - n * p).abs() <= 5.0 * sd,
                "k {k} h {h}: {dropped} of {n} dropped, expected {} +- {}",
                n * p,
                5.0 * sd
            );
        }
    }

    /// Windows drawn anywhere in the stream, by samplers with different
    /// seeds (other rows and batches, as on other ranks), drop exactly the
    /// targets the mask of the whole stream drops at those positions, the
    /// first ones of each window included; the sampler draws the windows
    /// of a plain run.
    #[test]
    fn the_same_text_drops_the_same_targets_in_any_row_or_batch() {
        let stream = random_stream(5_000, 300, 2);
        let g = Goldfish::new(4, 13).unwrap();
        let whole: Vec<i64> = stream.iter().map(|&t| i64::from(t)).collect();
        let reference = g.row_mask(&[], &whole);
        let mut total_dropped = 0;
        for seed in [0, 1, 2] {
            let mut plain = BatchSampler::new(stream.len(), 64, seed).unwrap();
            let mut sampler = BatchSampler::new(stream.len(), 64, seed).unwrap();
            for _ in 0..10 {
                let unmasked = plain.next_batch(&stream, 4);
                let batch = sampler.next_goldfish_batch(&stream, 4, &g);
                assert_eq!(batch.inputs, unmasked.inputs, "the same windows");
                for row in 0..4 {
                    let span = row * 64..(row + 1) * 64;
                    let inputs = &unmasked.inputs[span.clone()];
                    let start = whole
                        .windows(64)
                        .position(|w| w == inputs)
                        .expect("the row is a window of the stream");
                    for t in 0..64 {
                        let (got, was) = (
                            batch.targets[span.start + t],
                            unmasked.targets[span.start + t],
                        );
                        // The target at row position t is stream token start + t + 1.
                        let dropped = reference[start + t];
                        assert_eq!(got == IGNORED_TARGET, dropped, "row {row} position {t}");
                        if dropped {
                            total_dropped += 1;
                        } else {
                            assert_eq!(got, was);
                        }
                    }
                }
            }
            assert_eq!(plain.state(), sampler.state());
        }
        assert!(total_dropped > 0);
    }

    /// Without context before the rows, [`Goldfish::apply`] keeps the first
    /// `h - 1` targets of each row and otherwise agrees with the context
    /// mask; masking twice is masking once.
    #[test]
    fn a_batch_without_context_keeps_its_first_targets() {
        let stream = random_stream(3_000, 300, 3);
        let g = Goldfish::new(3, 5).unwrap();
        let mut with = BatchSampler::new(stream.len(), 32, 4).unwrap();
        let mut without = with.clone();
        let masked = with.next_goldfish_batch(&stream, 6, &g);
        let mut batch = without.next_batch(&stream, 6);
        let unmasked = batch.clone();
        let dropped = g.apply(&mut batch);
        assert_eq!(
            batch
                .targets
                .iter()
                .filter(|&&t| t == IGNORED_TARGET)
                .count(),
            dropped
        );
        for row in 0..6 {
            for t in 0..32 {
                let i = row * 32 + t;
                if t < 4 {
                    assert_eq!(batch.targets[i], unmasked.targets[i]);
                } else {
                    assert_eq!(
                        batch.targets[i], masked.targets[i],
                        "row {row} position {t}"
                    );
                }
            }
        }
        let once = batch.clone();
        g.apply(&mut batch);
        assert_eq!(batch, once);
    }

    #[test]
    fn dropping_depends_on_the_preceding_tokens_only() {
        let g = Goldfish::new(3, 4).unwrap();
        let mut inputs: Vec<i64> = (10..40).collect();
        let before = g.row_mask(&[], &inputs);
        // Changing input 20 changes only the decisions whose windows hold it:
        // positions 20..=23.
        inputs[20] = 999;
        let after = g.row_mask(&[], &inputs);
        for t in 0..inputs.len() {
            if !(20..=23).contains(&t) {
                assert_eq!(before[t], after[t], "position {t}");
            }
        }
        // A lead of context is the same as those tokens at the row's start.
        let split = g.row_mask(&inputs[..7], &inputs[7..]);
        assert_eq!(split, after[7..]);
        let mut targets: Vec<i64> = inputs.iter().map(|i| i + 1).collect();
        let dropped = g.mask_row(&[], &inputs, &mut targets);
        assert_eq!(dropped, after.iter().filter(|&&d| d).count());
    }
}
