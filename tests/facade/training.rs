//! The library used from another crate: build each family's mini model from a
//! config through the facade and train it with the library's training loop.

use burn::backend::{Autodiff, Flex};
use ferrotron::engine::data::BatchSampler;
use ferrotron::engine::optim::{AdamWConfig, LrSchedule};
use ferrotron::models::presets::preset;
use ferrotron::parallel::train::{self, Silent, TokenWindows};
use ferrotron::{Decoder, DecoderConfig, LoopConfig, StepConfig, Trainer};

type B = Autodiff<Flex>;

/// A mini preset shrunk further so the test runs in seconds.
fn tiny(name: &str) -> DecoderConfig {
    DecoderConfig {
        vocab_size: 64,
        hidden_size: 48,
        n_layers: 2,
        ffn_size: 96,
        max_seq_len: 64,
        ..preset(name).unwrap()
    }
}

/// A token stream with structure to learn: a repeating pattern of period 23.
fn stream() -> Vec<u32> {
    (0..20_000u32).map(|i| (i * 7 + i / 23) % 64).collect()
}

fn train(config: &DecoderConfig, steps: usize) -> Vec<f64> {
    let device = Default::default();
    let model = Decoder::<B>::new(config, 7, &device).unwrap();
    let step = StepConfig {
        adamw: AdamWConfig::default(),
        schedule: LrSchedule {
            max_lr: 3e-3,
            min_lr: 3e-4,
            warmup_steps: 5,
            total_steps: steps,
        },
        grad_clip: 1.0,
    };
    let mut trainer = Trainer::new(model, step, device);
    let tokens = stream();
    let sampler = BatchSampler::new(tokens.len(), 32, 1).unwrap();
    let mut batches = TokenWindows {
        sampler,
        tokens: &tokens,
        vocab_size: config.vocab_size,
    };
    let val = [BatchSampler::new(tokens.len(), 32, 2)
        .unwrap()
        .next_batch(&tokens, 4)];
    let plan = LoopConfig {
        steps,
        micro_batch: 4,
        grad_accum: 2,
        eval_every: steps,
        ..LoopConfig::default()
    };
    let summary = train::run(&mut trainer, &mut batches, &val, &plan, &mut Silent).unwrap();
    assert_eq!(summary.validations.len(), 2);
    summary.steps.iter().map(|r| r.loss).collect()
}

#[test]
fn one_training_step_through_the_facade() {
    let losses = train(&tiny("gpt-mini"), 1);
    // A fresh model predicts close to uniformly over 64 tokens.
    assert!((losses[0] - (64f64).ln()).abs() < 0.3, "{losses:?}");
}

#[test]
fn every_family_mini_preset_learns() {
    for name in ["gpt-mini", "llama-mini", "bloom-mini"] {
        let losses = train(&tiny(name), 30);
        let first: f64 = losses[..3].iter().sum::<f64>() / 3.0;
        let last: f64 = losses[losses.len() - 3..].iter().sum::<f64>() / 3.0;
        assert!(last < 0.8 * first, "{name}: loss {first:.3} -> {last:.3}");
    }
}

/// A whole job through the library, as `ferrotron train` runs it: the run
/// directory holds the resolved configuration (which reads back as the
/// same job), the run record, the metrics and a checkpoint.
#[test]
fn a_job_runs_through_the_library() {
    use ferrotron::job::{run_files, PrintReport, World};
    use ferrotron::JobConfig;
    use ferrotron_test_support::corpus::{write_words, WORDS};
    let dir = std::env::temp_dir().join(format!("ferrotron-facade-job-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let corpus = dir.join("corpus.txt");
    write_words(&corpus, &WORDS, 20_000);
    let mut config = JobConfig::default();
    config.model.vocab_size = Some(300);
    config.data.corpus = Some(corpus);
    config.schedule.steps = 3;
    config.schedule.seq_len = 32;
    config.schedule.micro_batch = 2;
    config.schedule.eval_every = 3;
    config.metrics.sample_tokens = 0;
    let out = dir.join("run");
    config.checkpoint.out = Some(out.clone());
    let valid = config.validate(&World::SINGLE).unwrap();
    let resolved = valid.config().clone();
    let summary = ferrotron::Job::new(valid)
        .unwrap()
        .run(&mut PrintReport)
        .unwrap()
        .unwrap();
    assert_eq!(summary.steps.len(), 3);
    let (written, record) = run_files::read_run_files(&out).unwrap();
    assert_eq!(written, resolved);
    assert_eq!(record.global_batch, 2);
    assert_eq!(record.model.vocab_size, 300);
    for file in ["metrics.jsonl", "tokenizer.json", "checkpoints/latest"] {
        assert!(out.join(file).is_file(), "missing {file}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
