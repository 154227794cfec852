//! `ferrotron train`: resolve settings, prepare data, build the model and
//! the trainer, run the library's training loop with a progress bar, then
//! the end-of-run outputs.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use burn::tensor::TensorData;
use ferrotron_engine::backend::BackendKind;
use ferrotron_engine::checkpoint::write_atomic;
use ferrotron_engine::data::{self, BatchSampler, ShardSet, TokenSource, Tokenizer};
use ferrotron_engine::metrics::{self, StepRecord};
use ferrotron_engine::optim::{AdamWConfig, LrSchedule};
use ferrotron_engine::params::{load_named_tensors, named_tensors};
use ferrotron_engine::precision::Precision;
use ferrotron_models::hf::{load_hf_dir, save_hf_dir, ExportOptions, Family, SpecialTokens};
use ferrotron_models::ops::{choose_kernels, KernelBackend, TrainBackend};
use ferrotron_models::presets::{preset, PRESET_NAMES};
use ferrotron_models::tensor_parallel::{check_tp, shard_plan};
use ferrotron_models::{generate, Decoder, SamplingConfig};
use ferrotron_parallel::comm::nccl::LIBRARY_ENV;
use ferrotron_parallel::comm::Communicator;
use ferrotron_parallel::groups::ProcessGroups;
use ferrotron_parallel::launch;
use ferrotron_parallel::mesh::Mesh;
use ferrotron_parallel::recompute::Recompute;
use ferrotron_parallel::tensor::TpGroup;
use ferrotron_parallel::train::checkpoint::CheckpointState;
use ferrotron_parallel::train::loss_scale::LossScaleConfig;
use ferrotron_parallel::train::{
    self, LoopConfig, LoopError, NonFinite, ParallelConfig, Progress, StepConfig, TokenWindows,
    Trainer,
};
use indicatif::{ProgressBar, ProgressStyle};
use signal_hook::consts::{SIGINT, SIGTERM};

use crate::args::TrainArgs;
use crate::comm;
use crate::dispatch::{dispatch, parse_backend, BackendTask};
use crate::error::{usage, Interrupted, UsageError};
use crate::export::check_out_dir;
use crate::memory_check::check_memory;
use crate::pipeline_check::{check_pipeline, pipeline_config};
use crate::precision_check::resolve_precision;
use crate::resume::Resume;
use crate::run_config::RunConfig;
use crate::settings::{OnNonFinite, TrainSettings};
use crate::train_data::{open_shards, TrainTokens};

/// `println!` on rank 0 only.
macro_rules! say {
    ($lead:expr, $($arg:tt)*) => { if $lead { println!($($arg)*); } };
}

/// Runs `ferrotron train`. Every input is checked before anything is written.
///
/// In a multi-rank job (launched by `mpirun` or `srun`) every rank runs
/// this; rank 0 alone writes the run directory and prints progress, and an
/// error on any rank aborts the whole job (`MPI_Abort`) instead of leaving
/// the other ranks waiting.
pub fn train(mut args: TrainArgs) -> anyhow::Result<()> {
    let launch = launch::detect().map_err(|e| usage(format!("launcher variables: {e}")))?;
    let resume = match args.resume.take() {
        Some(_) if args.config.is_some() => {
            return Err(usage(
                "--config with --resume: a resumed run keeps its own settings (give flags to change what may change)",
            ))
        }
        Some(path) => Some(Resume::open(&path)?),
        None => None,
    };
    if args.model.is_some() && args.hf_dir.is_some() {
        return Err(usage(
            "--model with --hf-dir: the model comes from --hf-dir's config.json; give one of them",
        ));
    }
    let mut s = match (&resume, &args.config) {
        (Some(r), _) => r.config.train.clone(),
        (None, Some(path)) => TrainSettings::from_file(path)?,
        (None, None) => TrainSettings::default(),
    };
    args.apply(&mut s);
    s.validate()?;
    if let Some(r) = &resume {
        r.check(&s, launch.world_size)?;
    }
    let mesh = Mesh::new(s.dp, s.tp, s.pp, launch.world_size).map_err(|e| usage(e.to_string()))?;
    if launch.world_size > 1 && s.out.is_none() {
        return Err(usage(
            "--out is required in a multi-rank run (every rank must name the same run directory)",
        ));
    }
    let kind = parse_backend(&s.backend)?;
    let transport = comm::resolve(s.comm, kind, std::env::var_os(LIBRARY_ENV).as_deref())?;
    let stop = stop_on_signals()?;
    let comm = comm::open(&launch, transport, s.comm_timeout())?;
    let result = train_ranked(s, kind, mesh, launch.local_rank, comm.clone(), resume, stop);
    if let Err(e) = &result {
        if comm.world_size() > 1 && e.downcast_ref::<Interrupted>().is_none() {
            let code = if e.downcast_ref::<UsageError>().is_some() {
                2
            } else {
                1
            };
            // One write, so that the lines of two failing ranks do not interleave.
            let line = format!("error (rank {}): {e:#}\n", comm.rank());
            let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
            comm.abort(code);
        }
    }
    result
}

/// A flag that SIGINT and SIGTERM set (the loop then checkpoints and
/// stops after the current step); a second signal ends the process at
/// once with exit code 130, leaving the last checkpoint as it was.
fn stop_on_signals() -> anyhow::Result<Arc<AtomicBool>> {
    let stop = Arc::new(AtomicBool::new(false));
    for signal in [SIGINT, SIGTERM] {
        // The shutdown hook first: it fires only if the flag is already set.
        signal_hook::flag::register_conditional_shutdown(signal, 130, stop.clone())
            .context("installing the signal handlers")?;
        signal_hook::flag::register(signal, stop.clone())
            .context("installing the signal handlers")?;
    }
    Ok(stop)
}

/// `train` once the mesh and communicator are known; `local_rank` picks
/// this rank's GPU on its node.
fn train_ranked(
    mut s: TrainSettings,
    kind: BackendKind,
    mesh: Mesh,
    local_rank: usize,
    comm: Arc<dyn Communicator>,
    resume: Option<Resume>,
    stop: Arc<AtomicBool>,
) -> anyhow::Result<()> {
    let lead = comm.rank() == 0;
    // A resumed run's weights come from its checkpoint.
    let hf = match (&s.hf_dir, &resume) {
        (Some(dir), None) => {
            Some(load_hf_dir(dir).map_err(|e| usage(format!("--hf-dir {}: {e}", dir.display())))?)
        }
        _ => None,
    };
    let mut model = match (&hf, &resume) {
        (_, Some(r)) => r.config.model.clone(),
        (Some(hf), None) => hf.config.clone(),
        (None, None) => preset(&s.model).ok_or_else(|| {
            usage(format!(
                "--model: unknown preset '{}'; available: {}",
                s.model,
                PRESET_NAMES.join(", ")
            ))
        })?,
    };
    let shards = match &s.data {
        Some(dir) => Some(open_shards(dir, resume.as_ref())?),
        None => None,
    };
    if let Some(v) = s.vocab_size.filter(|_| resume.is_none()) {
        if hf.is_some() && v != model.vocab_size {
            return Err(usage(format!(
                "--vocab-size {v}: the --hf-dir model has vocab_size {}",
                model.vocab_size
            )));
        }
        model.vocab_size = v;
    } else if let (Some(set), None, None) = (&shards, &hf, &resume) {
        // The model's vocabulary is the shard set's tokenizer's.
        model.vocab_size = set.index().vocab_size;
    }
    if let Some(set) = &shards {
        let n = set.index().vocab_size;
        if n > model.vocab_size {
            return Err(usage(format!(
                "--data {}: its tokenizer has {n} tokens, more than the model's vocabulary of {}; give --vocab-size {n} or more",
                set.dir().display(),
                model.vocab_size
            )));
        }
    }
    if let Some(n) = s.max_seq_len.filter(|_| resume.is_none()) {
        if hf.is_some() && n != model.max_seq_len {
            return Err(usage(format!(
                "--max-seq-len {n}: the --hf-dir model has max_seq_len {}",
                model.max_seq_len
            )));
        }
        model.max_seq_len = n;
    }
    model.kernels = s.kernels;
    model.precision = resolve_precision(&s, kind, &mesh)?;
    check_tp(&model, mesh.tp).map_err(|e| usage(format!("--tp {}: {e}", mesh.tp)))?;
    check_pipeline(&model, &s, &mesh, &mut |line| {
        if lead {
            println!("{line}");
        }
    })?;
    if s.sp && mesh.tp == 1 {
        return Err(usage(
            "--sp needs --tp above 1: sequence parallelism splits the sequence over the TP group",
        ));
    }
    if s.sp && !s.seq_len.is_multiple_of(mesh.tp) {
        return Err(usage(format!(
            "--sp: --seq-len {} must be divisible by --tp {}",
            s.seq_len, mesh.tp
        )));
    }
    // The choice `Decoder::new` makes, checked before the run directory is
    // written.
    choose_kernels(&model, kind.is_cpu().then(|| kind.name()))
        .map_err(|e| usage(format!("--kernels {}", e.problem)))?;
    if let Some(dir) = &s.hf_out {
        Family::of(&model).map_err(|e| usage(format!("--hf-out: {e}")))?;
        check_out_dir(dir, "--hf-out")?;
    }
    if s.seq_len > model.max_seq_len {
        return Err(usage(format!(
            "--seq-len {} exceeds the model's max_seq_len {} (a new model from a preset takes --max-seq-len)",
            s.seq_len, model.max_seq_len
        )));
    }
    // Before the model is allocated and before the data is tokenized.
    check_memory(&model, mesh.dp, s.zero, kind, &mut |line| {
        if lead {
            println!("{line}");
        }
    })?;
    let peak = resolve_peak(&s)?;
    let text = match (&s.corpus, &shards) {
        (_, Some(_)) => String::new(),
        (Some(path), None) => {
            data::read_corpus(path).map_err(|e| usage(format!("--corpus: {e}")))?
        }
        (None, None) => data::embedded_corpus(),
    };
    let out = match &resume {
        Some(r) => {
            if s.out != r.config.train.out && s.out.as_deref() != Some(r.run.as_path()) {
                return Err(usage(format!(
                    "--out with --resume: the run's directory is {}",
                    r.run.display()
                )));
            }
            r.run.clone()
        }
        None => s.out.clone().unwrap_or_else(|| default_run_dir(&s.model)),
    };
    check_paths_apart(&s, &out)?;
    if lead
        && resume.is_none()
        && fs::read_dir(&out)
            .map(|mut d| d.next().is_some())
            .unwrap_or(false)
    {
        return Err(usage(format!(
            "--out {}: directory is not empty; choose a new run directory",
            out.display()
        )));
    }
    s.out = Some(out.clone());
    s.warmup_steps = Some(s.warmup());
    let special = hf.as_ref().map(|h| h.special.clone());
    // The run's tokenizer.json: the resumed run's, the shard set's, the
    // --hf-dir model's, or (None) one trained here on the corpus.
    let tokenizer_file = match (&resume, &shards, &hf) {
        (Some(r), _, _) => Some(r.run.join("tokenizer.json")),
        (None, Some(set), _) => Some(set.tokenizer_path()),
        (None, None, Some(h)) => h.tokenizer.clone(),
        (None, None, None) => None,
    };
    let shard_id = shards.as_ref().map(|set| set.id().clone());
    // The data is read, tokenized and split before anything is written
    // (rank 0 trains the tokenizer; the other ranks read it once written).
    let t0 = Instant::now();
    let (val_fraction, seq_len) = (s.val_fraction, s.seq_len);
    let prepare = |tokenizer: Tokenizer, shards: Option<ShardSet>| -> anyhow::Result<_> {
        let tokens = match shards {
            Some(set) => TrainTokens::shards(set, val_fraction, seq_len)?,
            None => TrainTokens::encode(&tokenizer, &text, val_fraction, seq_len)?,
        };
        Ok((tokenizer, tokens))
    };
    let load = |path: &Path| {
        Tokenizer::from_file(path).map_err(|e| usage(format!("{}: {e}", path.display())))
    };
    let mut shards = shards;
    let prepared = match &tokenizer_file {
        Some(path) => Some(prepare(load(path)?, shards.take())?),
        None if lead => {
            let tokenizer = data::train_bpe(&text, model.vocab_size)
                .map_err(|e| usage(format!("--corpus: {e}")))?;
            Some(prepare(tokenizer, None)?)
        }
        None => None,
    };
    if let Some((tokenizer, tokens)) = &prepared {
        say!(
            lead,
            "data: {} train / {} validation tokens (vocab {}), {} in {:.1} s",
            tokens.train().len(),
            tokens.val().len(),
            tokenizer.get_vocab_size(true),
            tokens.describe(),
            t0.elapsed().as_secs_f64()
        );
    }
    let (initial, restore) = match resume {
        Some(r) => {
            let name = r.dir.join("model.safetensors").display().to_string();
            (
                Some((r.model()?, name)),
                Some((r.state.clone(), r.moments()?, r.dir.clone())),
            )
        }
        None => {
            let name = s
                .hf_dir
                .as_ref()
                .map(|d| d.display().to_string())
                .unwrap_or_default();
            (hf.map(|h| (h.tensors, name)), None)
        }
    };
    let config = RunConfig {
        global_batch: Some(mesh.dp * s.micro_batch * s.grad_accum),
        train: s,
        model,
        shards: shard_id,
    };
    let run_tokenizer = out.join("tokenizer.json");
    if lead {
        fs::create_dir_all(&out)
            .with_context(|| format!("creating run directory {}", out.display()))?;
        match (&tokenizer_file, &prepared, &restore) {
            (_, _, Some(_)) => {}
            (Some(tok), _, None) => {
                fs::copy(tok, &run_tokenizer)
                    .with_context(|| format!("copying {} into the run directory", tok.display()))?;
            }
            (None, Some((tokenizer, _)), None) => data::save_tokenizer(tokenizer, &run_tokenizer)?,
            (None, None, None) => unreachable!("rank 0 always prepares the data"),
        }
        write_atomic(
            &out.join("config.toml"),
            toml::to_string(&config)?.as_bytes(),
        )?;
    }
    if tokenizer_file.is_none() {
        // The other ranks read the tokenizer rank 0 trained once it is written.
        comm.barrier()?;
    }
    let (tokenizer, tokens) = match prepared {
        Some(p) => p,
        None => prepare(load(&run_tokenizer)?, None)?,
    };
    dispatch(
        kind,
        local_rank,
        TrainTask {
            config,
            tokenizer,
            tokens,
            out,
            peak,
            initial,
            restore,
            special,
            mesh,
            comm,
            stop,
            gpu: local_rank,
        },
    )
}

/// Refuses outputs that overlap: the run directory `out` and `--hf-out`
/// inside one another, or an output equal to an input (`--corpus`,
/// `--hf-dir`). Paths are compared made absolute, without following links.
fn check_paths_apart(s: &TrainSettings, out: &Path) -> anyhow::Result<()> {
    let abs = |p: &Path| std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
    let out = abs(out);
    if let Some(hf_out) = s.hf_out.as_deref().map(abs) {
        if out.starts_with(&hf_out) || hf_out.starts_with(&out) {
            return Err(usage(format!(
                "--out {} and --hf-out {}: one is inside the other; the run directory and the export must be apart",
                out.display(),
                hf_out.display()
            )));
        }
    }
    let outputs = [
        ("--out", Some(out)),
        ("--hf-out", s.hf_out.as_deref().map(abs)),
    ];
    let inputs = [("--corpus", &s.corpus), ("--hf-dir", &s.hf_dir)];
    for (out_flag, output) in &outputs {
        for (in_flag, input) in inputs {
            if let (Some(o), Some(i)) = (output, input.as_deref().map(abs)) {
                if *o == i {
                    return Err(usage(format!(
                        "{out_flag} {} is also {in_flag}: an output must not replace an input",
                        o.display()
                    )));
                }
            }
        }
    }
    Ok(())
}

/// Where the run goes when `--out` is not given.
fn default_run_dir(model: &str) -> PathBuf {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    Path::new("runs").join(format!("{model}-{secs}"))
}

/// The peak FLOP/s used for MFU: a flag, the table, or (None) to measure.
fn resolve_peak(s: &TrainSettings) -> anyhow::Result<Option<f64>> {
    if let Some(t) = s.peak_tflops {
        return Ok(Some(t * 1e12));
    }
    match &s.device_type {
        None => Ok(None),
        Some(name) => metrics::peak_flops_for(name).map(Some).ok_or_else(|| {
            let known: Vec<&str> = metrics::PEAK_FLOPS_TABLE.iter().map(|(n, _)| *n).collect();
            usage(format!(
                "--device-type: unknown device '{name}'; known: {} (or give --peak-tflops)",
                known.join(", ")
            ))
        }),
    }
}

struct TrainTask {
    config: RunConfig,
    /// The run's tokenizer (its `tokenizer.json` is in the run directory).
    tokenizer: Tokenizer,
    /// The training and validation tokens.
    tokens: TrainTokens,
    out: PathBuf,
    peak: Option<f64>,
    /// Initial weights (from `--hf-dir` or the resumed checkpoint) instead
    /// of a seeded initialisation, and the file they came from.
    initial: Option<(BTreeMap<String, TensorData>, String)>,
    /// A resumed run: the checkpoint's state, AdamW moments and directory.
    restore: Option<(CheckpointState, BTreeMap<String, TensorData>, PathBuf)>,
    /// Begin/end-of-sequence ids of `--hf-dir`, written with `--hf-out`
    /// (`None`: those of the run's tokenizer).
    special: Option<SpecialTokens>,
    /// The parallel layout (data parallelism only, today).
    mesh: Mesh,
    /// This rank's communicator over the whole job.
    comm: Arc<dyn Communicator>,
    /// Set by SIGINT / SIGTERM.
    stop: Arc<AtomicBool>,
    /// This rank's GPU on its node (its local rank).
    gpu: usize,
}

/// Rank 0's energy counter: the GPU's (NVML, ROCm SMI) on cuda and rocm,
/// RAPL's on a CPU backend and on wgpu (whose adapter is not matched to an
/// NVML or ROCm SMI device; on lavapipe the CPU package is the device),
/// under `FERROTRON_POWERCAP_ROOT` if set. Prints the source, or one line
/// naming what is missing.
fn open_energy(kind: BackendKind, gpu: usize) -> Option<metrics::EnergyMeter> {
    let on_gpu = matches!(kind, BackendKind::Cuda | BackendKind::Rocm);
    let mut probe = metrics::EnergyProbe::system(on_gpu.then_some(gpu as u32));
    if let Some(root) = std::env::var_os("FERROTRON_POWERCAP_ROOT") {
        probe.rapl_root = root.into();
    }
    match probe.open() {
        Ok(meter) => {
            println!("energy: measured by {meter}");
            Some(meter)
        }
        Err(why) => {
            println!("energy: not measured ({why})");
            None
        }
    }
}

impl BackendTask for TrainTask {
    type Output = ();

    fn run<B: TrainBackend>(self, kind: BackendKind, device: B::Device) -> anyhow::Result<()> {
        let RunConfig {
            train: s,
            model: mc,
            ..
        } = &self.config;
        let out = &self.out;
        let comm = self.comm.clone();
        let lead = comm.rank() == 0;
        say!(lead, "run directory: {}", out.display());
        say!(lead, "{}", self.mesh.describe());
        let t0 = Instant::now();
        let tokenizer = &self.tokenizer;
        let (train_tokens, val_tokens) = (self.tokens.train(), self.tokens.val());
        let sampler = match self.restore.as_ref().and_then(|r| r.0.sampler) {
            Some(state) if state.tokens_len != train_tokens.len() => {
                return Err(usage(format!(
                    "--resume: the checkpoint's sampler drew from {} training tokens, this data gives {}",
                    state.tokens_len,
                    train_tokens.len()
                )))
            }
            Some(state) => BatchSampler::from_state(state)?,
            None => BatchSampler::new(train_tokens.len(), s.seq_len, s.seed)?,
        };
        let val_batches = data::eval_batches(&val_tokens, s.seq_len, s.micro_batch, s.eval_batches);

        let groups = ProcessGroups::new(comm.clone(), self.mesh)?;
        let mut model = Decoder::<B>::new(mc, s.seed, &device)?;
        if let Some((initial, name)) = self.initial {
            model = load_named_tensors(model, initial, &name)?;
        }
        // Tensor parallelism first: every rank builds the whole model, then
        // keeps its part (then ZeRO shards that over the DP group).
        let shards = shard_plan(mc, self.mesh.tp, s.make_vocab_size_divisible_by)?
            .with_sequence_parallel(s.sp);
        let model = model.shard(&shards, TpGroup::new(groups.tp().clone()))?;
        let peak = match self.peak {
            Some(p) => p,
            None => {
                let p = metrics::measure_matmul_flops::<B::InnerBackend>(&device, 512, 3);
                say!(
                    lead,
                    "MFU is relative to this {kind} device's measured f32 matmul rate, {:.1} GFLOP/s (set --peak-tflops or --device-type for a data-sheet peak)",
                    p / 1e9
                );
                p
            }
        };
        let dp_size = self.mesh.dp;
        let global_batch = dp_size * s.micro_batch * s.grad_accum;
        say!(
            lead,
            "model {} ({:.2} M parameters) on {kind}; global batch {} x {} tokens = dp {} x micro batch {} x grad-accum {}",
            s.model,
            mc.num_params() as f64 / 1e6,
            global_batch,
            s.seq_len,
            dp_size,
            s.micro_batch,
            s.grad_accum
        );
        let step_config = StepConfig {
            adamw: AdamWConfig {
                beta1: s.beta1,
                beta2: s.beta2,
                eps: s.eps,
                weight_decay: s.weight_decay,
            },
            schedule: LrSchedule {
                max_lr: s.lr,
                min_lr: s.min_lr,
                warmup_steps: s.warmup(),
                total_steps: s.steps,
            },
            grad_clip: s.grad_clip,
        };
        let parallel = ParallelConfig {
            zero: s.zero,
            bucket_mb: s.bucket_mb,
            shards,
            pipeline: pipeline_config(s),
            recompute: s.recompute()?,
            reduce: s.reduce_dtype,
        };
        let mut trainer = Trainer::parallel(model, step_config, device.clone(), groups, parallel)?;
        if mc.precision == Precision::Fp16 {
            trainer = trainer.with_loss_scaling(LossScaleConfig {
                init: s.loss_scale_init,
                window: s.loss_scale_window,
            })?;
        }
        say!(
            lead,
            "precision {} (master weights, gradients and AdamW state f32); gradients reduced in {}{}",
            mc.precision,
            s.reduce_dtype,
            if mc.precision == Precision::Fp16 {
                format!(
                    "; dynamic loss scale from {} (doubles after {} clean steps)",
                    s.loss_scale_init, s.loss_scale_window
                )
            } else {
                String::new()
            }
        );
        if let Some((state, moments, dir)) = self.restore {
            if let Some(scaler) = state.loss_scaler {
                trainer.restore_loss_scaler(scaler);
            }
            trainer
                .restore(state.step, state.optimizer_steps, moments)
                .map_err(|e| {
                    usage(format!(
                        "--resume: {}: {e}",
                        dir.join("optimizer.safetensors").display()
                    ))
                })?;
            say!(lead, "resumed from {} (step {})", dir.display(), state.step);
        }
        say!(
            lead,
            "ZeRO stage {}; recompute {}; memory per rank: {}",
            s.zero,
            trainer.recompute(),
            trainer.planned_memory().describe()
        );
        if let Some(g) = s.goldfish() {
            say!(
                lead,
                "goldfish loss: about 1 training target in {} dropped, hashed on the {} tokens before it (validation unmasked)",
                g.k(),
                g.context()
            );
        }
        let plan = LoopConfig {
            steps: s.steps,
            micro_batch: s.micro_batch,
            grad_accum: s.grad_accum,
            eval_every: s.eval_every,
            flops_per_token: mc.train_flops_per_token(s.seq_len, trainer.recompute()),
            model_flops_per_token: mc.train_flops_per_token(s.seq_len, Recompute::None),
            peak_flops: peak,
            run_dir: Some(out.clone()),
            save_every: s.save_every(),
            keep_checkpoints: s.keep_checkpoints,
            checkpoint_files: vec![(
                "config.toml".into(),
                toml::to_string(&self.config)?.into_bytes(),
            )],
            on_nonfinite: match s.on_nonfinite {
                OnNonFinite::Stop => NonFinite::Stop,
                OnNonFinite::Skip => NonFinite::Skip {
                    max_in_a_row: s.max_skipped,
                },
            },
            stop: Some(self.stop.clone()),
            goldfish: s.goldfish(),
            energy: if lead {
                open_energy(kind, self.gpu)
            } else {
                None
            },
            // The host heap holds the activations on the CPU backends only.
            measure_heap: kind.is_cpu(),
        };
        let bar = if lead {
            ProgressBar::new(s.steps as u64)
        } else {
            ProgressBar::hidden()
        };
        bar.set_style(
            ProgressStyle::with_template("{bar:30} step {pos}/{len} | {msg} | ETA {eta}")
                .expect("the progress template is valid"),
        );
        let mut batches = TokenWindows {
            sampler,
            tokens: &train_tokens,
        };
        let summary = match train::run(
            &mut trainer,
            &mut batches,
            &val_batches,
            &plan,
            &mut Bar(&bar),
        ) {
            Ok(summary) => summary,
            Err(LoopError::Stopped { step, checkpoint }) => {
                bar.finish_and_clear();
                let message = match checkpoint {
                    Some(dir) => format!(
                        "stopped after step {step} by a signal; checkpoint {}; continue with: ferrotron train --resume {}",
                        dir.display(),
                        out.display()
                    ),
                    None => format!("stopped after step {step} by a signal"),
                };
                return Err(Interrupted(if lead { message } else { String::new() }).into());
            }
            Err(e) => return Err(e.into()),
        };
        bar.finish_and_clear();
        // The whole model (gathered over the DP and TP groups: every rank
        // takes part), for the export and the sample on rank 0.
        let whole = trainer.whole_parameters()?;
        if !lead {
            return Ok(());
        }
        let model = load_named_tensors(
            Decoder::<B::InnerBackend>::new(mc, s.seed, &device)?,
            whole.into_iter().collect(),
            "the trained model",
        )?;
        if let (Some(&(s0, first)), Some(&(s1, last))) =
            (summary.validations.first(), summary.validations.last())
        {
            println!(
                "done in {:.0} s: val_loss {first:.4} at step {s0} -> {last:.4} at step {s1} ({:.0}% lower)",
                t0.elapsed().as_secs_f64(),
                100.0 * (1.0 - last / first)
            );
        }
        if let Some(j) = summary.energy_j() {
            let tokens: f64 = summary
                .steps
                .iter()
                .map(|r| r.tokens_per_s * r.step_time_s)
                .sum();
            println!(
                "energy: {:.1} kJ over {} steps ({:.1} tokens/J)",
                j / 1e3,
                summary.steps.len(),
                tokens / j
            );
        }
        if let Some(dir) = &s.hf_out {
            let special = self.special.clone();
            let options = ExportOptions {
                special: special.unwrap_or_else(|| SpecialTokens::from_tokenizer(tokenizer)),
                ..ExportOptions::default()
            };
            save_hf_dir(
                dir,
                mc,
                &named_tensors(&model),
                Some(&out.join("tokenizer.json")),
                &options,
            )?;
            println!("Hugging Face model written to {}", dir.display());
        }
        if s.sample_tokens > 0 {
            let sampling = SamplingConfig {
                temperature: 0.8,
                top_k: 40,
                seed: s.seed,
            };
            let text = sample(
                &model,
                tokenizer,
                &s.sample_prompt,
                s.sample_tokens,
                &sampling,
                &[],
                &device,
            )?;
            println!("--- sample ---\n{text}\n--------------");
        }
        Ok(())
    }
}

/// The progress bar and the validation lines of `ferrotron train` (rank 0).
struct Bar<'a>(&'a ProgressBar);

impl Progress for Bar<'_> {
    fn step(&mut self, r: &StepRecord) {
        self.0.set_position(r.step as u64);
        let bubble = r.pipeline.as_ref().map_or(String::new(), |p| {
            format!(
                " | bubble {:.0}% (formula {:.0}%)",
                100.0 * p.bubble,
                100.0 * p.bubble_formula
            )
        });
        self.0.set_message(format!(
            "loss {:.4} | {:.0} tokens/s | MFU {:.1}%{bubble}",
            r.loss,
            r.tokens_per_s,
            100.0 * r.mfu
        ));
    }

    fn validation(&mut self, step: usize, val_loss: f64, last: Option<&StepRecord>) {
        let line = match last {
            None => format!("step {step}: val_loss {val_loss:.4}"),
            Some(r) => format!(
                "step {step}: loss {:.4} | val_loss {val_loss:.4} | {:.0} tokens/s | grad_norm {:.3} | lr {:.2e}",
                r.loss, r.tokens_per_s, r.grad_norm, r.lr
            ),
        };
        self.0.suspend(|| println!("{line}"));
    }
}

/// Continues `prompt` by up to `n` sampled tokens (stopping after any id of
/// `stop`) and returns the whole text.
pub fn sample<B: KernelBackend>(
    model: &Decoder<B>,
    tokenizer: &Tokenizer,
    prompt: &str,
    n: usize,
    sampling: &SamplingConfig,
    stop: &[u32],
    device: &B::Device,
) -> anyhow::Result<String> {
    let ids = data::encode(tokenizer, prompt)?;
    let new = generate(model, &ids, n, sampling, stop, true, device);
    let all: Vec<u32> = ids.into_iter().chain(new).collect();
    tokenizer
        .decode(&all, false)
        .map_err(|e| anyhow::anyhow!("decoding the sample: {e}"))
}
