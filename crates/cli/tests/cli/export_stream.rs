//! `ferrotron export --run` streams the run's latest sharded checkpoint:
//! the export of a tp2 x pp2 run (4 ranks, each checkpointing only its
//! blocks) equals the export of the one-rank run of the same job, with
//! `config.json` identical and the weights within the tensor-parallel
//! equivalence tolerances; a damaged block is refused with one line and
//! nothing written.
//!
//! The same runs check the end of training without a whole-model gather:
//! `train --hf-out` (each parameter gathered in turn, rank 0 streaming the
//! export) writes exactly the files `export --run` writes from the final
//! checkpoint, and the tp2 x pp2 run's validation (on the parallel model,
//! through the pipeline) matches the one-rank run's.
//!
//! Needs the binary built with the `mpi` feature and Open MPI's `mpirun`
//! (skipped with a printed reason otherwise).

use std::path::Path;

use crate::common::{corpus, ferrotron, scratch};
use crate::mpirun::{mpi_built, run, RunFlags};
use ferrotron_test_support::runs::{check_val_losses, check_weights};

/// The tolerances of tests/facade/tensor_parallel.rs (which explains
/// them): the largest weight difference relative to the model's largest
/// weight, and within each tensor relative to its own.
const MODEL_TOLERANCE: f32 = 1e-4;
const TENSOR_TOLERANCE: f32 = 5e-3;

/// `ferrotron export --run run --out out`, which must succeed.
fn export(run: &Path, out: &Path) {
    let o = ferrotron(&[
        "export",
        "--run",
        &run.display().to_string(),
        "--out",
        &out.display().to_string(),
    ]);
    assert!(
        o.status.success(),
        "export of {} failed:\n{}",
        run.display(),
        String::from_utf8_lossy(&o.stderr)
    );
    let said = String::from_utf8_lossy(&o.stdout);
    assert!(said.contains("checkpoints"), "{said}");
}

/// Flips one byte of a weight's (not a moment's) block in `file` of the
/// checkpoint `ckpt`, found through `index.json` and the file's header.
fn damage_a_weight(ckpt: &Path, file: &str) {
    let index: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(ckpt.join("index.json")).unwrap()).unwrap();
    let key = index["tensors"]
        .as_object()
        .unwrap()
        .iter()
        .filter(|(name, _)| !name.starts_with("m.") && !name.starts_with("v."))
        .flat_map(|(_, t)| t["blocks"].as_array().unwrap())
        .find(|b| b["file"] == file)
        .map(|b| b["key"].as_str().unwrap().to_string())
        .expect("the rank holds a weight");
    let path = ckpt.join(file);
    let mut bytes = std::fs::read(&path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let start = header[&key]["data_offsets"][0].as_u64().unwrap() as usize;
    bytes[8 + n + start] ^= 0xff;
    std::fs::write(&path, bytes).unwrap();
}

#[test]
fn export_of_a_tp2_pp2_run_equals_the_export_of_the_one_rank_run() {
    if !mpi_built() {
        return;
    }
    let dir = scratch("export-stream");
    let corpus = corpus(&dir);
    let (single, split) = (dir.join("one"), dir.join("tp2-pp2"));
    for (out, ranks, extra) in [
        (&single, 1, &["--tp", "1", "--pp", "1"][..]),
        (&split, 4, &["--tp", "2", "--pp", "2"][..]),
    ] {
        let flags = RunFlags {
            accum: Some("4"),
            save_every: Some("3"),
            ..RunFlags::new("llama-mini", &corpus, out, "3")
        };
        let hf_out = out.with_extension("hf-out").display().to_string();
        let mut extra = extra.to_vec();
        extra.extend(["--hf-out", &hf_out]);
        run("llama-mini", ranks, flags.args(), &extra);
    }
    check_val_losses("tp2 x pp2 validation", &split, &single, 1e-5);
    let (a, b) = (dir.join("one-hf"), dir.join("tp2-pp2-hf"));
    export(&single, &a);
    export(&split, &b);
    // `--hf-out` (gathered per parameter at the end of the run) is the
    // export of the final checkpoint, byte for byte.
    for (run, exported) in [(&single, &a), (&split, &b)] {
        for file in ["config.json", "model.safetensors", "tokenizer.json"] {
            let read = |d: &Path| std::fs::read(d.join(file)).unwrap();
            assert!(
                read(&run.with_extension("hf-out")) == read(exported),
                "{}: --hf-out's {file} differs from the export",
                run.display()
            );
        }
    }
    let config = |d: &Path| std::fs::read_to_string(d.join("config.json")).unwrap();
    assert_eq!(config(&a), config(&b));
    check_weights(
        "tp2 x pp2 export",
        &b,
        &a,
        MODEL_TOLERANCE,
        TENSOR_TOLERANCE,
    );

    // A damaged block: one line naming the tensor's file, exit 2, and the
    // output directory left as it was (absent).
    let ckpt = split.join("checkpoints").join("step-3");
    damage_a_weight(&ckpt, "rank-00003.safetensors");
    let bad = dir.join("damaged-hf");
    let o = ferrotron(&[
        "export",
        "--run",
        &split.display().to_string(),
        "--out",
        &bad.display().to_string(),
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("rank-00003.safetensors") && err.contains("XXH3"),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(!bad.exists(), "nothing is written");
    let _ = std::fs::remove_dir_all(&dir);
}
