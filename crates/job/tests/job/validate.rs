//! `JobConfig::validate` and `check_portable`: every problem at once, one
//! line each naming the key; the repository's job files are valid.

use std::path::Path;

use ferrotron_job::{JobConfig, World};

/// The lines `validate` refuses `job` with on one rank here.
fn refusal(job: &JobConfig) -> Vec<String> {
    job.validate(&World::SINGLE)
        .err()
        .expect("refused")
        .iter()
        .map(ToString::to_string)
        .collect()
}

fn problems(job: &JobConfig, world_size: usize) -> Vec<String> {
    job.check_portable(world_size)
        .unwrap_err()
        .iter()
        .map(ToString::to_string)
        .collect()
}

#[test]
fn a_job_with_three_mistakes_reports_three_lines() {
    let job = JobConfig::from_toml_str(
        "[schedule]\nsteps = 0\n[optimizer]\nbeta1 = 1.5\n[data]\ngoldfish_k = 1\n",
        "three.toml",
    )
    .unwrap();
    let p = problems(&job, 1);
    assert_eq!(p.len(), 3, "{p:#?}");
    assert!(
        p[1].starts_with("optimizer.beta1: --beta1 must be in [0, 1)"),
        "{p:#?}"
    );
    assert!(
        p[0].starts_with("schedule.steps: --steps must be positive"),
        "{p:#?}"
    );
    assert!(
        p[2].starts_with("data.goldfish_k: --goldfish-k must be at least 2"),
        "{p:#?}"
    );
    assert!(p.iter().all(|l| !l.contains('\n')), "{p:#?}");
}

#[test]
fn the_layout_is_checked_against_the_model() {
    // llama-mini has 2 KV heads: tp 4 cannot split them.
    let job = JobConfig::from_toml_str(
        "[model]\nname = \"llama-mini\"\n[parallelism]\ntp = 4\n[checkpoint]\nout = \"x\"\n",
        "tp.toml",
    )
    .unwrap();
    let p = problems(&job, 4);
    assert_eq!(p.len(), 1, "{p:#?}");
    assert!(p[0].starts_with("parallelism.tp: --tp 4:"), "{p:#?}");
}

#[test]
fn model_free_and_model_checks_are_reported_together() {
    let job = JobConfig::from_toml_str(
        "[model]\nname = \"gpt-mini\"\n[schedule]\nseq_len = 100000\n[optimizer]\nlr = -1.0\n[parallelism]\nsp = true\n",
        "both.toml",
    )
    .unwrap();
    let p = problems(&job, 1);
    assert!(
        p.iter()
            .any(|l| l.starts_with("optimizer.lr: --lr must be positive")),
        "{p:#?}"
    );
    assert!(
        p.iter()
            .any(|l| l.starts_with("parallelism.sp: --sp needs --tp above 1")),
        "{p:#?}"
    );
    assert!(
        p.iter()
            .any(|l| l.starts_with("schedule.seq_len: --seq-len 100000 exceeds")),
        "{p:#?}"
    );
}

#[test]
fn a_preset_beside_a_hugging_face_directory_is_refused() {
    let dir = std::env::temp_dir().join(format!("ferrotron-hf-{}", std::process::id()));
    let job = |name: &str| {
        JobConfig::from_toml_str(
            &format!(
                "[model]\nname = \"{name}\"\nhf_dir = {:?}\n",
                dir.display().to_string()
            ),
            "hf.toml",
        )
        .unwrap()
    };
    // The directory does not exist: one line for it, and one for the preset.
    let p = problems(&job("gpt2"), 1);
    assert!(
        p.iter()
            .any(|l| l.starts_with("model.name: --model gpt2: the model comes from")),
        "{p:#?}"
    );
    // The default preset is what a job file without `name` has.
    let p = problems(&job("gpt-mini"), 1);
    assert!(p.iter().all(|l| !l.starts_with("model.name")), "{p:#?}");
    assert!(p.iter().any(|l| l.starts_with("model.hf_dir")), "{p:#?}");
}

#[test]
fn a_world_the_mesh_does_not_fill_is_refused() {
    let job = JobConfig::from_toml_str(
        "[parallelism]\ntp = 2\ndp = 2\n[checkpoint]\nout = \"x\"\n",
        "mesh.toml",
    )
    .unwrap();
    let p = problems(&job, 6);
    assert!(
        p.iter()
            .any(|l| l.starts_with("parallelism (dp x tp x pp over 6 ranks)")),
        "{p:#?}"
    );
}

/// Context parallelism: a sequence that does not cut into 2 x cp chunks,
/// a mesh whose cp x tp x dp x pp is not the world, the composition not
/// built yet (mixed precision), and under sequence parallelism a rank's
/// tokens that tp does not divide, each one line naming the key or the
/// mesh; cp with pp is accepted.
#[test]
fn context_parallel_jobs_the_ring_cannot_run_are_refused() {
    let cp = |toml: &str, world: usize| {
        let text = format!("[parallelism]\ncp = 2\n{toml}[checkpoint]\nout = \"x\"\n");
        problems(&JobConfig::from_toml_str(&text, "cp.toml").unwrap(), world)
    };
    let p = cp("[schedule]\nseq_len = 30\n", 2);
    assert_eq!(p.len(), 1, "{p:#?}");
    assert!(
        p[0].starts_with("parallelism.cp: --cp 2: --seq-len 30 must be a multiple of 2 x cp = 4"),
        "{p:#?}"
    );
    let p = cp("dp = 2\n", 6);
    assert_eq!(p.len(), 1, "{p:#?}");
    assert!(
        p[0].starts_with(
            "parallelism (dp x cp x tp x pp over 6 ranks): --dp 2 x --tp 1 x --cp 2 x --pp 1 = 4 must equal the world size 6"
        ),
        "{p:#?}"
    );
    // cp composes with pp (and with tp and sp, dp and ZeRO), in every
    // precision.
    let pp = JobConfig::from_toml_str(
        "[parallelism]\ncp = 2\npp = 2\n[schedule]\ngrad_accum = 2\n[checkpoint]\nout = \"x\"\n",
        "cp-pp.toml",
    )
    .unwrap();
    assert!(pp.check_portable(4).is_ok(), "{:#?}", pp.check_portable(4));
    for precision in ["bf16", "fp16"] {
        let text = format!(
            "[parallelism]\ncp = 2\n[precision]\ncompute = \"{precision}\"\n[checkpoint]\nout = \"x\"\n"
        );
        let c = JobConfig::from_toml_str(&text, "cp-16.toml").unwrap();
        assert!(
            c.check_portable(2).is_ok(),
            "{precision}: {:#?}",
            c.check_portable(2)
        );
    }
    // 8 tokens: 4 per rank of the ring, which 8 TP ranks cannot split.
    let p = cp("tp = 8\nsp = true\n[schedule]\nseq_len = 8\n", 16);
    assert!(
        p.iter().any(|l| l
            == "parallelism.sp: --sp each rank's 4 tokens (--seq-len 8 / --cp 2) must be divisible by --tp 8"),
        "{p:#?}"
    );
    let job = JobConfig::from_toml_str(
        "[parallelism]\ncp = 2\n[schedule]\nseq_len = 64\n[checkpoint]\nout = \"x\"\n",
        "cp.toml",
    )
    .unwrap();
    assert!(job.check_portable(2).is_ok());
}

#[test]
fn a_valid_job_resolves_its_defaults() {
    let dir = std::env::temp_dir().join(format!("ferrotron-job-valid-{}", std::process::id()));
    let mut job = JobConfig::default();
    job.schedule.steps = 7;
    job.checkpoint.out = Some(dir.clone());
    let valid = job.validate(&World::SINGLE).unwrap();
    assert_eq!(valid.config().optimizer.warmup_steps, Some(7));
    assert_eq!(
        valid.config().checkpoint.out.as_deref(),
        Some(dir.as_path())
    );
    let preset = ferrotron_models::presets::preset("gpt-mini").unwrap();
    assert_eq!(valid.model().vocab_size, preset.vocab_size);
    assert!(!dir.exists(), "validation wrote {}", dir.display());
}

/// MFU's data-sheet peak is the one of the run's precision, under the
/// names `plan --gpu` takes; a short name is refused with the list.
#[test]
fn the_data_sheet_peak_follows_the_precision() {
    let dir = std::env::temp_dir().join(format!("ferrotron-job-peak-{}", std::process::id()));
    let job = |device: &str, precision: &str| {
        let mut job = JobConfig::from_toml_str(
            &format!(
                "[metrics]\ndevice_type = \"{device}\"\n[precision]\ncompute = \"{precision}\"\n"
            ),
            "peak.toml",
        )
        .unwrap();
        job.checkpoint.out = Some(dir.clone());
        job
    };
    let peak = |job: JobConfig| job.validate(&World::SINGLE).unwrap().peak_flops();
    assert_eq!(peak(job("h100-80gb", "fp32")), Some(67e12));
    assert_eq!(peak(job("H100-80GB", "bf16")), Some(989e12));
    assert_eq!(peak(job("mi250x-gcd", "bf16")), Some(191.5e12));
    let mut given = job("h100-80gb", "fp32");
    given.metrics.peak_tflops = Some(500.0);
    assert_eq!(peak(given), Some(500e12));
    let p = refusal(&job("h100", "bf16"));
    assert_eq!(p.len(), 1, "{p:#?}");
    assert!(
        p[0].starts_with(
            "metrics.device_type: --device-type unknown device 'h100'; known: a100-40gb,"
        ) && !p[0].contains("cpu"),
        "{p:#?}"
    );
}

/// The repository's job files: each parses and passes every check that
/// does not look at this machine, on the world its layout names.
#[test]
fn every_job_file_in_configs_validates() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../configs");
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "toml") {
            continue;
        }
        let job =
            JobConfig::from_file(&path).unwrap_or_else(|e| panic!("{}: {e:?}", path.display()));
        let par = &job.parallelism;
        let world = par.dp.unwrap_or(1) * par.cp * par.tp * par.pp;
        if let Err(e) = job.check_portable(world) {
            panic!("{} on {world} ranks: {e:#?}", path.display());
        }
        seen += 1;
    }
    assert!(seen >= 6, "only {seen} job files in {}", dir.display());
}

/// Outputs that cannot be written are found by validation, naming the key,
/// and the probe leaves nothing behind: /proc takes no new file, even as
/// root (file permissions would not stop root).
#[test]
fn outputs_that_cannot_be_written_are_refused_before_training() {
    let mut job = JobConfig::default();
    job.checkpoint.out = Some("/proc/ferrotron-run/new".into());
    job.checkpoint.hf_out = Some("/proc/ferrotron-export".into());
    let lines = refusal(&job);
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert!(
        lines[0]
            .starts_with("checkpoint.out: --out /proc/ferrotron-run/new: cannot write in /proc"),
        "{lines:?}"
    );
    assert!(
        lines[1].starts_with(
            "checkpoint.hf_out: --hf-out /proc/ferrotron-export: cannot write in /proc"
        ),
        "{lines:?}"
    );

    // A writable place passes, and the probe file is gone.
    let dir = std::env::temp_dir().join(format!("ferrotron-job-probe-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut job = JobConfig::default();
    job.checkpoint.out = Some(dir.join("run"));
    job.checkpoint.hf_out = Some(dir.join("export"));
    job.validate(&World::SINGLE).unwrap();
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
    std::fs::remove_dir(&dir).unwrap();
}

#[test]
fn zero3_prefetch_is_refused_where_it_would_do_nothing() {
    let check = |toml: &str| {
        let text = format!("[parallelism]\n{toml}[checkpoint]\nout = \"x\"\n");
        JobConfig::from_toml_str(&text, "prefetch.toml")
            .unwrap()
            .check_portable(2)
    };
    let refused = |toml: &str| -> Vec<String> {
        check(toml)
            .unwrap_err()
            .iter()
            .map(ToString::to_string)
            .collect()
    };
    let p = refused("zero = 2\nzero3_prefetch = 2\n");
    assert_eq!(p.len(), 1, "{p:#?}");
    assert!(
        p[0].starts_with(
            "parallelism.zero3_prefetch: --zero3-prefetch 2 with --zero 2: only ZeRO-3 gathers parameters"
        ),
        "{p:#?}"
    );
    let p = refused("zero = 3\noverlap_grad_reduce = false\nzero3_prefetch = 1\n");
    assert_eq!(p.len(), 1, "{p:#?}");
    assert!(
        p[0].starts_with(
            "parallelism.zero3_prefetch: --zero3-prefetch 1 with --overlap-grad-reduce false:"
        ),
        "{p:#?}"
    );
    for ok in [
        "zero = 3\nzero3_prefetch = 0\n",
        "zero = 3\nzero3_prefetch = 3\n",
        "zero = 3\noverlap_grad_reduce = false\nzero3_prefetch = 0\n",
        "zero = 1\n",
    ] {
        assert!(check(ok).is_ok(), "{ok}");
    }
}

/// `parallelism.offload = "optimizer"` needs a ZeRO shard to offload and a
/// backend whose device memory is not host memory; each refusal is one
/// line naming the key.
#[test]
fn optimizer_offload_is_refused_without_zero_and_on_cpu_backends() {
    let check = |parallelism: &str, backend: &str| {
        let text = format!(
            "[parallelism]\noffload = \"optimizer\"\n{parallelism}[backend]\nname = \"{backend}\"\n[checkpoint]\nout = \"x\"\n"
        );
        JobConfig::from_toml_str(&text, "offload.toml")
            .unwrap()
            .check_portable(2)
    };
    let refused = |parallelism: &str, backend: &str| -> Vec<String> {
        let p: Vec<String> = check(parallelism, backend)
            .unwrap_err()
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(p.len(), 1, "{p:#?}");
        assert!(!p[0].contains('\n'), "{p:#?}");
        p
    };
    let p = refused("zero = 0\n", "cuda");
    assert!(
        p[0].starts_with("parallelism.offload: --offload optimizer with --zero 0:")
            && p[0].contains("use --zero 1, 2 or 3"),
        "{p:#?}"
    );
    for cpu in ["flex", "ndarray"] {
        let p = refused("zero = 1\n", cpu);
        assert!(
            p[0].starts_with(&format!(
                "parallelism.offload: --offload optimizer on {cpu}:"
            )) && p[0].contains("device memory is host memory"),
            "{p:#?}"
        );
    }
    for (parallelism, backend) in [
        ("zero = 1\n", "wgpu"),
        ("zero = 2\n", "cuda"),
        ("zero = 3\n", "rocm"),
        ("zero = 1\ntp = 2\n", "cuda"),
    ] {
        assert!(
            check(parallelism, backend).is_ok(),
            "{parallelism} {backend}"
        );
    }
}

/// On cuda an unset `precision.compute` is bf16 (the backend's default)
/// on one rank and under tensor, context and pipeline parallelism alike,
/// with no notice; bf16 and fp16 asked for are accepted there too.
#[test]
fn cudas_bf16_default_holds_under_tp_cp_and_pp() {
    let job = |extra: &str| {
        JobConfig::from_toml_str(
            &format!("[backend]\nname = \"cuda\"\n[checkpoint]\nout = \"x\"\n{extra}"),
            "cuda.toml",
        )
        .unwrap()
    };
    for (layout, world) in [
        ("[parallelism]\ntp = 2\n", 2),
        ("[parallelism]\ntp = 2\nsp = true\n", 2),
        ("[parallelism]\ncp = 2\n", 2),
        ("[parallelism]\npp = 2\n[schedule]\ngrad_accum = 2\n", 2),
        ("", 1),
    ] {
        for precision in [
            "",
            "[precision]\ncompute = \"bf16\"\n",
            "[precision]\ncompute = \"fp16\"\n",
        ] {
            let c = job(&format!("{layout}{precision}"));
            assert!(
                c.check_portable(world).is_ok(),
                "{layout}{precision}: {:#?}",
                c.check_portable(world)
            );
        }
    }
}

/// `backend.attention_kernel = "matrix-units"` or `"registers"` needs the
/// fused attention: on flex each is refused naming the key and the
/// choice; `auto` is the default.
#[test]
fn matrix_unit_attention_is_refused_without_fused_kernels() {
    use ferrotron_job::config::AttentionKernelChoice;
    let mut job = JobConfig::default();
    assert_eq!(job.backend.attention_kernel, AttentionKernelChoice::Auto);
    job.checkpoint.out = Some(std::env::temp_dir().join("ferrotron-never-written-mu"));
    for (choice, name) in [
        (AttentionKernelChoice::MatrixUnits, "matrix-units"),
        (AttentionKernelChoice::Registers, "registers"),
    ] {
        job.backend.attention_kernel = choice;
        let lines = refusal(&job);
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert!(
            lines[0].starts_with(&format!(
                "backend.attention_kernel: --attention-kernel {name} on flex without fused"
            )),
            "{lines:?}"
        );
    }
}
