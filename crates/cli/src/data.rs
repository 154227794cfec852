//! `ferrotron data prepare`: check the inputs, then tokenize them into a
//! shard set with a progress bar, and report the throughput. `data
//! verify` is in [`crate::data_verify`].

use std::time::Instant;

use ferrotron_engine::data::{
    expand_inputs, prepare, DataError, PrepareConfig, PrepareProgress, TokenizerSource,
    MIN_VOCAB_SIZE,
};
use indicatif::{ProgressBar, ProgressStyle};

use crate::args::{DataArgs, DataCommand, PrepareArgs};
use crate::error::usage;

/// Runs `ferrotron data ...`.
pub fn data(args: DataArgs) -> anyhow::Result<()> {
    match args.command {
        DataCommand::Prepare(a) => prepare_shards(a),
        DataCommand::Verify(a) => crate::data_verify::verify(&a.dir),
    }
}

/// `data prepare`: every input is checked before anything is written.
fn prepare_shards(a: PrepareArgs) -> anyhow::Result<()> {
    let tokenizer = match (&a.tokenizer, a.vocab_size) {
        (Some(path), None) => {
            if !path.is_file() {
                return Err(usage(format!("--tokenizer {}: not a file", path.display())));
            }
            TokenizerSource::File(path.clone())
        }
        (None, Some(v)) if v < MIN_VOCAB_SIZE => {
            return Err(usage(format!(
            "--vocab-size must be at least {MIN_VOCAB_SIZE} (256 bytes + <|endoftext|>), got {v}"
        )))
        }
        (None, Some(vocab_size)) => TokenizerSource::Train { vocab_size },
        _ => {
            return Err(usage(
                "give exactly one of --tokenizer FILE or --vocab-size N",
            ))
        }
    };
    if a.shard_tokens == 0 {
        return Err(usage("--shard-tokens must be positive, got 0"));
    }
    let inputs = expand_inputs(&a.input).map_err(|e| usage(format!("--input: {e}")))?;
    for path in &inputs {
        if !std::fs::metadata(path).is_ok_and(|m| m.is_file()) {
            return Err(usage(format!(
                "--input {}: not a regular file",
                path.display()
            )));
        }
    }
    if std::fs::read_dir(&a.out).is_ok_and(|mut d| d.next().is_some()) || a.out.is_file() {
        return Err(usage(format!(
            "--out {}: exists and is not an empty directory; choose a new one",
            a.out.display()
        )));
    }
    // The nearest existing directory above it must be one.
    if let Some(file) = a
        .out
        .ancestors()
        .skip(1)
        .find(|p| p.exists() && !p.is_dir())
    {
        return Err(usage(format!(
            "--out {}: {} is not a directory",
            a.out.display(),
            file.display()
        )));
    }
    let config = PrepareConfig {
        inputs,
        text_field: a.text_field,
        tokenizer,
        out: a.out.clone(),
        shard_tokens: a.shard_tokens,
    };
    let bar = ProgressBar::new(0);
    bar.set_style(
        ProgressStyle::with_template(
            "{msg:>8} {bar:30} {bytes}/{total_bytes} ({bytes_per_sec}, ETA {eta})",
        )
        .expect("the progress template is valid"),
    );
    let t0 = Instant::now();
    let result = prepare(&config, &mut Bar(&bar));
    bar.finish_and_clear();
    let index = result.map_err(|e| match e {
        // An input that cannot be read as what it says it is (a damaged
        // gzip stream, text that is not UTF-8) is bad input; another I/O
        // error is the machine's (a full disk).
        DataError::Io {
            ref path,
            ref source,
            ..
        } if !config.inputs.contains(path)
            || !matches!(
                source.kind(),
                std::io::ErrorKind::InvalidData
                    | std::io::ErrorKind::InvalidInput
                    | std::io::ErrorKind::UnexpectedEof
            ) =>
        {
            anyhow::Error::new(e)
        }
        other => usage(other.to_string()),
    })?;
    let secs = t0.elapsed().as_secs_f64();
    let mb = index.text_bytes as f64 / 1e6;
    println!(
        "{}: {} documents, {} tokens in {} shard(s) of {} ids (vocab {}, documents separated by {}); {mb:.1} MB of text in {secs:.1} s = {:.1} MB/s",
        a.out.display(),
        index.documents,
        index.tokens,
        index.shards.len(),
        match index.dtype {
            ferrotron_engine::data::shard_format::TokenWidth::U16 => "u16",
            ferrotron_engine::data::shard_format::TokenWidth::U32 => "u32",
        },
        index.vocab_size,
        index
            .eos_id
            .map(|id| format!("end-of-text id {id}"))
            .unwrap_or_else(|| "nothing (the tokenizer has no end-of-text token)".into()),
        mb / secs.max(1e-9)
    );
    Ok(())
}

/// The progress bar over the bytes of each phase.
struct Bar<'a>(&'a ProgressBar);

impl PrepareProgress for Bar<'_> {
    fn phase(&mut self, name: &str, total: u64) {
        self.0.reset();
        self.0.set_length(total);
        self.0.set_message(name.to_string());
    }

    fn advance(&mut self, done: u64) {
        self.0.set_position(done);
    }
}
