//! Copying, reading and comparing run directories: the records of `metrics.jsonl`
//! (step losses, gradient norms, memory by class, validation losses) and
//! every weight of `model.safetensors`, for the tests that compare a
//! multi-rank (or resumed, or other-backend) run with the one-rank run on
//! the same global batch.

use std::collections::BTreeMap;
use std::path::Path;

use safetensors::tensor::Dtype;
use safetensors::SafeTensors;
use serde_json::Value;

/// Copies the directory tree `from` to `to` (a run, to resume the copy
/// while the original stays as it was).
pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let target = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &target);
        } else {
            std::fs::copy(e.path(), target).unwrap();
        }
    }
}

/// Every record (line) of a run's `metrics.jsonl`, in file order (a
/// resumed run appends); panics naming the run if there is no such file.
pub fn records(run: &Path) -> Vec<Value> {
    std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap_or_else(|e| panic!("{}: metrics.jsonl: {e}", run.display()))
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .collect()
}

/// [`records`], or none while the run has not written `metrics.jsonl`
/// yet (for a test that polls a run still going).
pub fn records_so_far(run: &Path) -> Vec<Value> {
    if run.join("metrics.jsonl").exists() {
        records(run)
    } else {
        Vec::new()
    }
}

/// The step records (those with a `loss`) of `records`.
pub fn steps(records: Vec<Value>) -> Vec<Value> {
    records
        .into_iter()
        .filter(|v| v.get("loss").is_some())
        .collect()
}

/// The step records of [`records`].
pub fn step_records(run: &Path) -> Vec<Value> {
    steps(records(run))
}

/// `(loss, grad_norm)` of every step record.
pub fn loss_and_norm(run: &Path) -> Vec<(f64, f64)> {
    step_records(run)
        .iter()
        .map(|v| {
            (
                v["loss"].as_f64().unwrap(),
                v["grad_norm"].as_f64().unwrap(),
            )
        })
        .collect()
}

/// `(step, val_loss)` of every validation record.
pub fn val_losses(run: &Path) -> Vec<(u64, f64)> {
    records(run)
        .iter()
        .filter_map(|v| Some((v["step"].as_u64()?, v.get("val_loss")?.as_f64()?)))
        .collect()
}

/// Checks that run `got` has the steps of run `want`, each loss and
/// gradient norm within `tolerance` relative.
pub fn check_steps(label: &str, got: &Path, want: &Path, tolerance: f64) {
    let (got, want) = (loss_and_norm(got), loss_and_norm(want));
    assert_eq!(got.len(), want.len(), "{label}: steps");
    for (step, (g, w)) in got.iter().zip(&want).enumerate() {
        for (what, a, b) in [("loss", g.0, w.0), ("grad_norm", g.1, w.1)] {
            let rel = (a - b).abs() / b.abs();
            assert!(
                rel <= tolerance,
                "{label} step {}: {what} {a} vs {b} (rel {rel:e})",
                step + 1
            );
        }
    }
}

/// Checks that run `got` validated at the steps run `want` did, each
/// validation loss within `tolerance` relative.
pub fn check_val_losses(label: &str, got: &Path, want: &Path, tolerance: f64) {
    let (got, want) = (val_losses(got), val_losses(want));
    assert_eq!(
        got.iter().map(|v| v.0).collect::<Vec<_>>(),
        want.iter().map(|v| v.0).collect::<Vec<_>>(),
        "{label}: validation steps"
    );
    for ((step, a), (_, b)) in got.iter().zip(&want) {
        let rel = (a - b).abs() / b.abs();
        assert!(
            rel <= tolerance,
            "{label} step {step}: val_loss {a} vs {b} (rel {rel:e})"
        );
    }
}

/// The memory by class of a run's last step record, bytes:
/// `[param_bytes, grad_bytes, optimizer_bytes]`.
pub fn memory(run: &Path) -> [u64; 3] {
    let last = step_records(run).pop().unwrap();
    ["param_bytes", "grad_bytes", "optimizer_bytes"].map(|k| last[k].as_u64().unwrap())
}

/// Every tensor of the `model.safetensors` of directory `dir` (a run or
/// an export) by name, its values widened to f32 (F32, BF16 and F16
/// files, as `ferrotron_engine::checkpoint::load_safetensors` reads
/// them); panics naming the file otherwise.
pub fn weights(dir: &Path) -> BTreeMap<String, Vec<f32>> {
    let path = dir.join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let st = SafeTensors::deserialize(&bytes).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    st.tensors()
        .into_iter()
        .map(|(name, view)| {
            let raw = view.data();
            let values = match view.dtype() {
                Dtype::F32 => raw
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect(),
                Dtype::BF16 => raw
                    .chunks_exact(2)
                    .map(|c| f32::from_bits(u32::from(u16::from_le_bytes([c[0], c[1]])) << 16))
                    .collect(),
                Dtype::F16 => raw
                    .chunks_exact(2)
                    .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
                    .collect(),
                other => panic!("{}: {name} has dtype {other:?}", path.display()),
            };
            (name, values)
        })
        .collect()
}

/// Relative error of the whole model between the `model.safetensors` of
/// directories `a` and `b`: max |a - b| over every weight divided by max
/// |b| over every weight. Every weight must be finite. (Per tensor it
/// would be meaningless for the attention key biases: see
/// [`check_weights`].)
pub fn max_weight_rel_err(a: &Path, b: &Path) -> f64 {
    let (a, b) = (weights(a), weights(b));
    assert_eq!(a.keys().collect::<Vec<_>>(), b.keys().collect::<Vec<_>>());
    let (mut diff, mut scale) = (0f32, 0f32);
    for (name, x) in &a {
        let y = &b[name];
        assert_eq!(x.len(), y.len(), "{name}");
        for (p, q) in x.iter().zip(y) {
            assert!(p.is_finite(), "{name} holds {p}");
            diff = diff.max((p - q).abs());
            scale = scale.max(q.abs());
        }
    }
    f64::from(diff / scale)
}

/// Parameters whose gradient is analytically zero, so that after training
/// they hold only rounding noise amplified by AdamW's normalisation: the
/// attention key biases (softmax ignores a constant added to every score
/// of a row). Only the whole-model bound applies to them.
fn noise_only(name: &str) -> bool {
    name.ends_with("attn.k.bias")
}

/// Checks `got`'s weights against `want`'s: the largest difference over
/// the model within `model_tolerance` of the model's largest weight, and
/// within each tensor (but the noise-only ones) within `tensor_tolerance`
/// of that tensor's own largest magnitude.
pub fn check_weights(
    label: &str,
    got: &Path,
    want: &Path,
    model_tolerance: f32,
    tensor_tolerance: f32,
) {
    let (a, b) = (weights(got), weights(want));
    assert_eq!(
        a.keys().collect::<Vec<_>>(),
        b.keys().collect::<Vec<_>>(),
        "{label}: parameter names"
    );
    let max_abs = |v: &[f32]| v.iter().fold(0f32, |m, x| m.max(x.abs()));
    let model_max = b.values().map(|v| max_abs(v)).fold(0f32, f32::max);
    let (mut model_diff, mut worst) = (0f32, (0f32, String::new()));
    for (name, x) in &a {
        let y = &b[name];
        assert_eq!(x.len(), y.len(), "{label}: {name} size");
        let diff = x.iter().zip(y).fold(0f32, |m, (p, q)| m.max((p - q).abs()));
        model_diff = model_diff.max(diff);
        if !noise_only(name) {
            let rel = diff / max_abs(y);
            if rel > worst.0 {
                worst = (rel, name.clone());
            }
        }
    }
    let model_rel = model_diff / model_max;
    eprintln!(
        "{label}: weights within {model_rel:e} of the model's largest, worst tensor {} within {:e} of its own",
        worst.1, worst.0
    );
    assert!(
        model_rel <= model_tolerance,
        "{label}: weights differ from the one-rank run by {model_rel:e} of the model's largest"
    );
    assert!(
        worst.0 <= tensor_tolerance,
        "{label}: {} differs from the one-rank run by {:e} of its largest magnitude",
        worst.1,
        worst.0
    );
}
