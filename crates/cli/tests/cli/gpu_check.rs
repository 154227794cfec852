//! `scripts/gpu_check.sh --dry-run`: the GPU battery runs every group on
//! this machine's CPU (flex, tiny shapes; with the `kernels-bench` feature
//! `bench kernels` quick, and SwiGLU on wgpu) with the debug `ferrotron`,
//! and leaves what a lease
//! would bring back: every phase in `phases.tsv` in the order of the
//! script's header, the `bench train` and `bench kernels` JSON (attention
//! at head dim 128), a `cubecl.toml` that CubeCL's own config type reads
//! as written, a watchdog report of a quiet phase, the packed results, and
//! a summary table printed last. Nothing here is a benchmark.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::common::scratch;
use ferrotron_test_support::{deadline, nccl_double};

/// `(group, phase, status, exit, note)` of every line of `OUT/*/phases.tsv`.
fn phases(out: &Path) -> Vec<[String; 5]> {
    ["train", "step", "kernels"]
        .iter()
        .flat_map(|g| {
            let text = std::fs::read_to_string(out.join(g).join("phases.tsv"))
                .unwrap_or_else(|e| panic!("{g}/phases.tsv: {e}"));
            text.lines()
                .map(|l| {
                    let f: Vec<&str> = l.split('\t').collect();
                    assert_eq!(f.len(), 6, "{l}");
                    [f[0], f[1], f[2], f[3], f[5]].map(String::from)
                })
                .collect::<Vec<_>>()
        })
        .collect()
}

/// The phases the dry run must have run, in order, and the ones it must
/// skip with a reason (no kernel test binaries, no compute-sanitizer,
/// bench_torch.py's bf16 only on cuda); torch's fp32 runs and its
/// attention may be skipped where python3 has no torch.
fn expected_phases() -> Vec<(String, &'static str)> {
    let mut p: Vec<(String, &str)> = [
        ("env", "ok"),
        ("watchdog-check", "ok"),
        ("train-cold", "ok"),
        ("train-warm", "ok"),
        ("curve-bf16", "ok"),
        ("curve-fp32", "ok"),
        ("kernel-tests", "skipped"),
        (
            "comm-device",
            if cfg!(feature = "mpi") {
                "ok"
            } else {
                "skipped"
            },
        ),
    ]
    .map(|(n, s)| (n.to_string(), s))
    .into();
    for precision in ["bf16", "fp32"] {
        for shape in ["c", "d", "a", "b"] {
            p.push((format!("ferrotron-{shape}-{precision}"), "ok"));
            if precision == "bf16" {
                // The matrix units need a GPU.
                p.push((format!("ferrotron-{shape}-{precision}-mu"), "skipped"));
                p.push((format!("ferrotron-{shape}-{precision}-mma"), "skipped"));
            }
            let torch = if precision == "bf16" {
                "skipped"
            } else {
                "ok|skipped"
            };
            p.push((format!("torch-{shape}-{precision}"), torch));
        }
    }
    // Nsight Compute needs a GPU.
    p.push(("profile-c-bf16".into(), "skipped"));
    p.push(("profile-c-bf16-mu".into(), "skipped"));
    p.push(("profile-c-bf16-mma".into(), "skipped"));
    if cfg!(feature = "kernels-bench") {
        p.push(("kernels-attention".into(), "ok"));
        p.push(("kernels-attention-8192".into(), "ok"));
        // Skipped where python3 has no torch.
        p.push(("torch-attention".into(), "ok|skipped"));
        p.push(("kernels-cmma".into(), "ok"));
        p.push(("kernels-mma".into(), "ok"));
        p.push(("kernels-mma-tiles".into(), "ok"));
        p.push(("profile-kernels-mma".into(), "skipped"));
        p.push(("profile-kernels-mma-source".into(), "skipped"));
        p.push(("kernels-wgpu".into(), "ok"));
    } else {
        p.push(("kernels".into(), "skipped"));
    }
    p.push(("sanitizer".into(), "skipped"));
    p
}

#[test]
fn the_dry_run_runs_every_group_and_prints_the_summary_last() {
    let (out, pack) = (scratch("out"), scratch("pack"));
    let ferrotron = Path::new(env!("CARGO_BIN_EXE_ferrotron"));
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/gpu_check.sh");
    let mut cmd = Command::new("bash");
    cmd.arg(&script)
        .arg("--dry-run")
        .arg("--pack")
        .arg(&pack)
        .arg(ferrotron.parent().unwrap())
        .arg(&out)
        // bench kernels (kernels-bench) always has wgpu; lavapipe serves it in CI.
        .env(
            "DRY_WGPU",
            if cfg!(feature = "kernels-bench") {
                "1"
            } else {
                "0"
            },
        );
    if cfg!(feature = "mpi") {
        // bench comm on flex: the double, over a one-process MPI.
        cmd.env("FERROTRON_NCCL_LIBRARY", nccl_double::library());
    }
    let o = deadline::output_within(&mut cmd, Duration::from_secs(600)).expect("bash runs");
    let stdout = String::from_utf8_lossy(&o.stdout);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{stdout}\n{stderr}");

    let got = phases(&out);
    let names: Vec<&str> = got.iter().map(|p| p[1].as_str()).collect();
    let want = expected_phases();
    assert_eq!(
        names,
        want.iter().map(|w| w.0.as_str()).collect::<Vec<_>>(),
        "{stdout}"
    );
    for (p, (_, status)) in got.iter().zip(&want) {
        assert!(
            status.split('|').any(|s| s == p[2]),
            "{} is {} ({}), expected {status}:\n{stdout}",
            p[1],
            p[2],
            p[4]
        );
        if p[2] == "skipped" {
            assert!(!p[4].is_empty(), "{} skipped without a reason", p[1]);
        }
    }

    // The summary comes last and names every phase.
    let summary = &stdout[stdout.rfind("######## summary of").expect("a summary")..];
    for name in &names {
        assert!(summary.contains(name), "summary lacks {name}:\n{summary}");
    }
    assert!(summary.contains("bench train (tokens/s"), "{summary}");
    assert!(summary.contains("gpt-mini bf16"), "{summary}");
    // Both curves ran their 4 steps, and bf16 is set against fp32.
    let against = summary
        .lines()
        .find(|l| l.trim_start().starts_with("bf16 against fp32"))
        .unwrap_or_else(|| panic!("no curve comparison: {summary}"));
    assert_eq!(against.matches(" %").count(), 2, "{against}");

    // Every log line is timestamped; the quiet phase got a watchdog report.
    let watchdog = std::fs::read_to_string(out.join("train/watchdog-check.log")).unwrap();
    assert!(watchdog.contains("watchdog: no new line for"), "{watchdog}");
    assert!(
        watchdog.contains("gpu: nvidia-smi is not on this machine"),
        "{watchdog}"
    );
    assert!(
        watchdog.contains("    thread "),
        "thread states: {watchdog}"
    );
    let env = std::fs::read_to_string(out.join("train/env.log")).unwrap();
    for section in ["== gpu", "NVRTC", "NCCL", "cuda_bf16.h", "together:"] {
        assert!(env.contains(section), "env lacks {section}: {env}");
    }
    let stamped = |l: &str| l.len() >= 9 && l.as_bytes()[2] == b':' && l.as_bytes()[8] == b' ';
    assert!(env.lines().all(stamped), "{env}");

    // gpt-mini ran its 3 steps twice; bench train wrote its schema.
    for run in ["train-cold", "train-warm"] {
        let metrics = std::fs::read_to_string(out.join("train").join(run).join("metrics.jsonl"))
            .unwrap_or_else(|e| panic!("{run}: {e}"));
        assert!(metrics.lines().count() >= 3, "{run}: {metrics}");
    }
    for shape in ["a", "b", "c", "d"] {
        let path = out.join(format!("step/ferrotron-{shape}-bf16.json"));
        let doc: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(doc["schema"], "ferrotron-bench-train/1");
        assert_eq!(doc["results"][0]["precision"], "bf16", "{doc}");
    }
    check_kernels_json(&out);
    check_comm_json(&out);
    check_cubecl_toml(&out);
    if cfg!(feature = "kernels-bench") {
        // CubeCL read cubecl.toml: its compilation logger printed.
        let log = std::fs::read_to_string(out.join("kernels/kernels-wgpu.log")).unwrap();
        assert!(log.contains("[Compiling kernel]"), "{log}");
    }
    for group in ["train", "step", "kernels"] {
        let f = pack.join(format!("gpu-check-{group}.tar.gz"));
        assert!(f.metadata().is_ok_and(|m| m.len() > 0), "{}", f.display());
    }
    let _ = std::fs::remove_dir_all(&out);
    let _ = std::fs::remove_dir_all(&pack);
}

/// A short lease: PHASES runs only the phases it names (the rest are
/// recorded as skipped, with that reason), SHAPES and PRECISIONS narrow the
/// step group, LEASE_S caps the groups of one call together, and
/// --seed-cache unpacks an earlier lease's CubeCL caches, which stay
/// since train-cold does not run.
#[test]
fn a_short_lease_runs_only_the_phases_it_names() {
    let (out, seed) = (scratch("short-out"), scratch("short-seed"));
    let entry = seed.join("cubecl-cache/autotune/entry");
    std::fs::create_dir_all(entry.parent().unwrap()).unwrap();
    std::fs::write(&entry, "earlier lease").unwrap();
    let tgz = seed.join("gpu-check-step-cubecl.tar.gz");
    let mut tar = Command::new("tar");
    tar.arg("czf")
        .arg(&tgz)
        .arg("-C")
        .arg(&seed)
        .arg("cubecl-cache");
    let packed = deadline::output_within(&mut tar, Duration::from_secs(60)).expect("tar runs");
    assert!(packed.status.success(), "{packed:?}");
    let ferrotron = Path::new(env!("CARGO_BIN_EXE_ferrotron"));
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/gpu_check.sh");
    let mut cmd = Command::new("bash");
    cmd.arg(&script)
        .arg("--dry-run")
        .arg("--seed-cache")
        .arg(&tgz)
        .arg(ferrotron.parent().unwrap())
        .arg(&out)
        .args(["train", "step", "kernels"])
        .env("PHASES", "env|ferrotron-c-bf16")
        .env("LEASE_S", "300")
        .env("SHAPES", "c")
        .env("PRECISIONS", "bf16");
    let o = deadline::output_within(&mut cmd, Duration::from_secs(300)).expect("bash runs");
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{stdout}");
    let got = phases(&out);
    let status = |name: &str| {
        let p = got.iter().find(|p| p[1] == name);
        p.map(|p| (p[2].clone(), p[4].clone()))
            .unwrap_or_else(|| panic!("no phase {name}: {stdout}"))
    };
    assert_eq!(status("env").0, "ok", "{stdout}");
    assert_eq!(status("ferrotron-c-bf16").0, "ok", "{stdout}");
    let mut unnamed = vec!["train-cold", "train-warm", "curve-bf16"];
    if cfg!(feature = "kernels-bench") {
        unnamed.extend(["kernels-cmma", "kernels-mma"]);
    }
    for name in unnamed {
        assert_eq!(
            status(name),
            ("skipped".into(), "not in PHASES".into()),
            "{stdout}"
        );
    }
    let step: Vec<&str> = got
        .iter()
        .filter(|p| p[0] == "step")
        .map(|p| p[1].as_str())
        .collect();
    assert_eq!(
        step,
        [
            "ferrotron-c-bf16",
            "ferrotron-c-bf16-mu",
            "ferrotron-c-bf16-mma",
            "torch-c-bf16",
            "profile-c-bf16",
            "profile-c-bf16-mu",
            "profile-c-bf16-mma"
        ],
        "{stdout}"
    );
    assert!(stdout.contains("(CubeCL caches seeded from"), "{stdout}");
    let kept = std::fs::read_to_string(out.join("cubecl-cache/autotune/entry"));
    assert_eq!(kept.ok().as_deref(), Some("earlier lease"), "{stdout}");
    let _ = std::fs::remove_dir_all(&out);
    let _ = std::fs::remove_dir_all(&seed);
}

/// The autotune seeds kept in docs/benchmarks hold only CubeCL's autotune
/// cache (`cubecl-cache/autotune/...`, which --seed-cache unpacks), one
/// JSON entry per line with its key and value, and no compiled kernels.
#[test]
fn the_committed_autotune_seeds_hold_autotune_entries_only() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/benchmarks");
    let seeds: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            name.starts_with("cubecl-autotune-") && name.ends_with(".tar.gz")
        })
        .collect();
    assert!(!seeds.is_empty(), "no cubecl-autotune-*.tar.gz in {dir:?}");
    for seed in seeds {
        let tar = |flag: &str| {
            let mut cmd = Command::new("tar");
            cmd.arg(flag).arg(&seed);
            let o = deadline::output_within(&mut cmd, Duration::from_secs(60)).expect("tar runs");
            assert!(o.status.success(), "{seed:?}: {o:?}");
            String::from_utf8(o.stdout).unwrap()
        };
        for member in tar("tzf").lines() {
            assert!(
                member.starts_with("cubecl-cache/autotune"),
                "{seed:?}: {member}"
            );
        }
        let entries: Vec<serde_json::Value> = tar("xzfO")
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{seed:?}: {e}: {l}")))
            .collect();
        assert!(!entries.is_empty(), "{seed:?}");
        for e in entries {
            assert!(
                e["key"].is_object() && e["value"].is_object(),
                "{seed:?}: {e}"
            );
        }
    }
}

/// bench comm compared every operation on both paths and found them
/// equal (the double's bf16 rounding against the host path's).
fn check_comm_json(out: &Path) {
    if !cfg!(feature = "mpi") {
        return;
    }
    let path = out.join("train/comm-device.json");
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert_eq!(doc["backend"], "flex", "{doc}");
    let rows = doc["rows"].as_array().unwrap();
    let ops: Vec<String> = rows
        .iter()
        .map(|r| {
            format!(
                "{} {}",
                r["op"].as_str().unwrap(),
                r["wire"].as_str().unwrap()
            )
        })
        .collect();
    assert_eq!(
        ops,
        [
            "all_reduce fp32",
            "all_reduce bf16",
            "all_gather fp32",
            "reduce_scatter fp32",
            "reduce_scatter bf16",
            "send_recv fp32",
            "send_recv bf16"
        ]
    );
    for row in rows {
        assert_eq!(row["equal"], true, "{row}");
    }
    assert_eq!(rows[1]["wire_bytes"], 2 * 4096, "bf16: 2 bytes a value");
}

/// The attention rows ran at head dim 128 (bench kernels --head-dim).
fn check_kernels_json(out: &Path) {
    if !cfg!(feature = "kernels-bench") {
        return;
    }
    let path = out.join("kernels/kernels-attention.json");
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let rows = doc["rows"].as_array().unwrap();
    assert!(!rows.is_empty());
    for row in rows {
        assert!(row["shape"].as_str().unwrap().ends_with(", 128]"), "{row}");
    }
}

/// The written cubecl.toml, read by CubeCL's own config type where the
/// build has cubecl (kernels-bench): both caches in OUT/cubecl-cache, both
/// loggers on stderr. (Its serde types ignore unknown keys, so the values
/// are compared, not only parsed.)
#[cfg(feature = "kernels-bench")]
fn check_cubecl_toml(out: &Path) {
    use cubecl::config::cache::CacheConfig;
    use cubecl::config::{CubeClRuntimeConfig, RuntimeConfig};
    let c = CubeClRuntimeConfig::from_file_path(out.join("cubecl.toml")).expect("cubecl.toml");
    let cache = out.join("cubecl-cache");
    assert!(matches!(&c.compilation.cache, Some(CacheConfig::File(p)) if *p == cache));
    assert!(matches!(&c.autotune.cache, CacheConfig::File(p) if *p == cache));
    assert!(c.compilation.logger.stderr && c.autotune.logger.stderr);
    assert_eq!(format!("{:?}", c.compilation.logger.level), "Basic");
    assert_eq!(format!("{:?}", c.autotune.logger.level), "Full");
}

/// Without cubecl in the build, the keys as cubecl-runtime 0.10 spells them.
#[cfg(not(feature = "kernels-bench"))]
fn check_cubecl_toml(out: &Path) {
    let text = std::fs::read_to_string(out.join("cubecl.toml")).unwrap();
    let c: toml::Table = text.parse().expect("TOML");
    let cache = out.join("cubecl-cache");
    for section in ["compilation", "autotune"] {
        assert_eq!(
            c[section]["cache"]["file"].as_str(),
            cache.to_str(),
            "{section}.cache"
        );
        assert_eq!(c[section]["logger"]["stderr"].as_bool(), Some(true));
    }
}
