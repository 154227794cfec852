//! The tokens of a training run, read and split before anything is
//! written: the corpus encoded in memory, or a memory-mapped shard set.
//! Both are cut at the same place (`split_lengths`) and read through the
//! same `TokenSource`, so the same tokens give the same batches.

use ferrotron_engine::data::{self, split_lengths, ShardSet, TokenRange, TokenSource, Tokenizer};

use crate::error::usage;

/// Where the tokens are.
enum Source {
    /// The corpus, encoded.
    Memory(Vec<u32>),
    /// A shard set (`--data`).
    Shards(Box<ShardSet>),
}

/// The token stream of a run and its split: training is the first
/// `train_len` tokens, validation the rest.
pub struct TrainTokens {
    source: Source,
    train_len: usize,
}

impl TrainTokens {
    /// Encodes `text` with `tokenizer` and splits it (`--corpus`, or the
    /// embedded corpus); errors name `--corpus`.
    pub fn encode(
        tokenizer: &Tokenizer,
        text: &str,
        val_fraction: f64,
        seq_len: usize,
    ) -> anyhow::Result<Self> {
        let tokens = data::encode(tokenizer, text)?;
        Self::new(Source::Memory(tokens), val_fraction, seq_len, "--corpus")
    }

    /// The shard set, split; errors name `--data`.
    pub fn shards(set: ShardSet, val_fraction: f64, seq_len: usize) -> anyhow::Result<Self> {
        Self::new(
            Source::Shards(Box::new(set)),
            val_fraction,
            seq_len,
            "--data",
        )
    }

    fn new(source: Source, val_fraction: f64, seq_len: usize, flag: &str) -> anyhow::Result<Self> {
        let all: &dyn TokenSource = match &source {
            Source::Memory(tokens) => tokens,
            Source::Shards(set) => set.as_ref(),
        };
        // Each part must hold at least one window of seq_len + 1 tokens.
        let (train_len, _) = split_lengths(all.len(), val_fraction, seq_len + 1)
            .map_err(|e| usage(format!("{flag}: {e}")))?;
        Ok(Self { source, train_len })
    }

    fn all(&self) -> &dyn TokenSource {
        match &self.source {
            Source::Memory(tokens) => tokens,
            Source::Shards(set) => set.as_ref(),
        }
    }

    /// The training tokens.
    pub fn train(&self) -> TokenRange<'_> {
        TokenRange::new(self.all(), 0, self.train_len)
    }

    /// The validation tokens (the last `val_fraction` of the stream).
    pub fn val(&self) -> TokenRange<'_> {
        let all = self.all();
        TokenRange::new(all, self.train_len, all.len() - self.train_len)
    }

    /// Where the tokens come from, for the start-up line.
    pub fn describe(&self) -> String {
        match &self.source {
            Source::Memory(_) => "tokenized in memory".into(),
            Source::Shards(set) => format!(
                "memory-mapped from {} ({} shards)",
                set.dir().display(),
                set.index().shards.len()
            ),
        }
    }
}
