//! Before the backend starts: the tokenizer and the tokens (read and split
//! before anything is written), the initial weights, and the run directory
//! (written by rank 0).

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use ferrotron_engine::checkpoint::write_atomic;
use ferrotron_engine::data::{self, ShardSet, TokenSource, Tokenizer};
use ferrotron_models::hf::{read_hf_dir, SpecialTokens};
use ferrotron_parallel::comm::Communicator;
use ferrotron_parallel::train::checkpoint::CheckpointState;

use super::Report;
use crate::error::usage;
use crate::run_files::{RunRecord, CONFIG_FILE, RECORD_FILE};
use crate::tokens::TrainTokens;
use crate::validate::ValidJob;

/// A resumed run's state: the checkpoint's `state.json` and directory
/// (each rank reads its share of the weights and moments from there once
/// its trainer is built).
pub(super) type Restore = (CheckpointState, PathBuf);

/// The Hugging Face directory whose weights a run starts from (checked by
/// [`read_hf_dir`]; each rank reads only its part of them when it builds
/// its model).
pub(super) type Initial = PathBuf;

/// What the backend-generic part of a job starts from.
pub(super) struct Prepared {
    /// The run's tokenizer (its `tokenizer.json` is in the run directory).
    pub tokenizer: Tokenizer,
    /// The training and validation tokens (taken when training starts).
    pub tokens: Option<TrainTokens>,
    /// Initial weights (from `model.hf_dir`) instead of a seeded
    /// initialisation, and the directory they came from.
    pub initial: Option<Initial>,
    /// A resumed run's state.
    pub restore: Option<Restore>,
    /// Begin/end-of-sequence ids of `model.hf_dir` (or of the resumed run's
    /// record), written with the export (`None`: those of the run's
    /// tokenizer).
    pub special: Option<SpecialTokens>,
    /// `config.toml` and `run.toml` as written, for every checkpoint.
    pub run_files: Vec<(String, Vec<u8>)>,
}

/// Reads the data and the initial weights, then (rank 0) writes the run
/// directory; the other ranks read the tokenizer rank 0 trained.
pub(super) fn prepare(
    job: &mut ValidJob,
    comm: &Arc<dyn Communicator>,
    report: &mut dyn Report,
) -> anyhow::Result<Prepared> {
    let c = &job.config;
    let lead = comm.rank() == 0;
    let hf = match (&c.model.hf_dir, &job.resume) {
        (Some(dir), None) => {
            Some(read_hf_dir(dir).map_err(|e| usage(format!("--hf-dir {}: {e}", dir.display())))?)
        }
        _ => None,
    };
    let text = match (&c.data.corpus, &job.shards) {
        (_, Some(_)) => String::new(),
        (Some(path), None) => {
            data::read_corpus(path).map_err(|e| usage(format!("--corpus: {e}")))?
        }
        (None, None) => data::embedded_corpus(),
    };
    // The run's tokenizer.json: the resumed run's, the shard set's, the
    // Hugging Face model's, or (None) one trained here on the corpus.
    let tokenizer_file = match (&job.resume, &job.shards, &hf) {
        (Some(r), _, _) => Some(r.run.join("tokenizer.json")),
        (None, Some(set), _) => Some(set.tokenizer_path()),
        (None, None, Some(h)) => h.tokenizer.clone(),
        (None, None, None) => None,
    };
    let t0 = Instant::now();
    let (val_fraction, seq_len) = (c.data.val_fraction, c.schedule.seq_len);
    let shard_id = job.shards.as_ref().map(|set| set.id().clone());
    let mut shards = job.shards.take();
    let split = |tokenizer: &Tokenizer, shards: Option<ShardSet>| -> anyhow::Result<TrainTokens> {
        match shards {
            Some(set) => TrainTokens::shards(set, val_fraction, seq_len),
            None => TrainTokens::encode(tokenizer, &text, val_fraction, seq_len),
        }
    };
    let tokenizer = match &tokenizer_file {
        Some(path) => Some(load_tokenizer(path)?),
        None if lead => Some(
            data::train_bpe(&text, job.model.vocab_size)
                .map_err(|e| usage(format!("--corpus: {e}")))?,
        ),
        None => None,
    };
    let tokens = tokenizer
        .as_ref()
        .map(|t| split(t, shards.take()))
        .transpose()?;
    if let (true, Some(tok), Some(tokens)) = (lead, &tokenizer, &tokens) {
        report.line(&format!(
            "data: {} train / {} validation tokens (vocab {}), {} in {:.1} s",
            tokens.train().len(),
            tokens.val().len(),
            tok.get_vocab_size(true),
            tokens.describe(),
            t0.elapsed().as_secs_f64()
        ));
    }
    let record = RunRecord {
        global_batch: job.mesh.dp * c.schedule.micro_batch * c.schedule.grad_accum,
        shards: shard_id,
        corpus_sha256: c
            .data
            .corpus
            .as_ref()
            .map(|_| data::sha256_hex(text.as_bytes())),
        special: match (&job.resume, &hf) {
            (Some(r), _) => r.record.special.clone(),
            (None, hf) => hf.as_ref().map(|h| h.special.clone()),
        },
        model: job.model.clone(),
    };
    let run_files = vec![
        (CONFIG_FILE.to_string(), c.to_toml().into_bytes()),
        (RECORD_FILE.to_string(), record.to_toml().into_bytes()),
    ];
    let run_tokenizer = job.out.join("tokenizer.json");
    if lead {
        write_run_dir(
            job,
            &run_files,
            tokenizer_file.as_deref(),
            tokenizer.as_ref(),
            &run_tokenizer,
        )?;
    }
    if tokenizer_file.is_none() {
        // The other ranks read the tokenizer rank 0 trained once it is written.
        comm.barrier()?;
    }
    let (tokenizer, tokens) = match (tokenizer, tokens) {
        (Some(t), Some(tokens)) => (t, tokens),
        _ => {
            let t = load_tokenizer(&run_tokenizer)?;
            let tokens = split(&t, shards.take())?;
            (t, tokens)
        }
    };
    let (initial, restore) = initial_weights(job);
    Ok(Prepared {
        tokenizer,
        tokens: Some(tokens),
        initial,
        restore,
        special: record.special,
        run_files,
    })
}

fn load_tokenizer(path: &Path) -> anyhow::Result<Tokenizer> {
    Tokenizer::from_file(path).map_err(|e| usage(format!("{}: {e}", path.display())))
}

/// Rank 0 creates the run directory and writes its tokenizer and the run
/// files (a resumed run's directory is kept as it is).
fn write_run_dir(
    job: &ValidJob,
    run_files: &[(String, Vec<u8>)],
    tokenizer_file: Option<&Path>,
    trained: Option<&Tokenizer>,
    run_tokenizer: &Path,
) -> anyhow::Result<()> {
    let out = &job.out;
    fs::create_dir_all(out).with_context(|| format!("creating run directory {}", out.display()))?;
    if job.resume.is_some() {
        return Ok(());
    }
    match (tokenizer_file, trained) {
        (Some(tok), _) => {
            fs::copy(tok, run_tokenizer)
                .with_context(|| format!("copying {} into the run directory", tok.display()))?;
        }
        (None, Some(tokenizer)) => data::save_tokenizer(tokenizer, run_tokenizer)?,
        (None, None) => unreachable!("rank 0 always has the tokenizer"),
    }
    for (name, bytes) in run_files {
        write_atomic(&out.join(name), bytes)?;
    }
    Ok(())
}

/// The weights to start from, and a resumed run's state.
fn initial_weights(job: &ValidJob) -> (Option<Initial>, Option<Restore>) {
    match &job.resume {
        Some(r) => (None, Some((r.state.clone(), r.dir.clone()))),
        None => (job.config.model.hf_dir.clone(), None),
    }
}
