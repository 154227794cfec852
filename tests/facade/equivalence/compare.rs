//! Comparing a multi-rank run with the one-rank run on the same global
//! batch, from their run directories: the step records of
//! `metrics.jsonl` (loss, gradient norm, memory by class), the validation
//! losses, and every weight of `model.safetensors`.

use std::collections::BTreeMap;
use std::path::Path;

use burn::tensor::TensorData;
use ferrotron::engine::checkpoint::load_safetensors;
use serde_json::Value;

/// Every record (line) of a run's `metrics.jsonl`, in file order.
pub fn records(run: &Path) -> Vec<Value> {
    std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap_or_else(|e| panic!("{}: metrics.jsonl: {e}", run.display()))
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .collect()
}

/// The step records (those with a `loss`) of [`records`].
pub fn step_records(run: &Path) -> Vec<Value> {
    records(run)
        .into_iter()
        .filter(|v| v.get("loss").is_some())
        .collect()
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

/// The `model.safetensors` of directory `dir` (a run or an export).
fn weights(dir: &Path) -> BTreeMap<String, TensorData> {
    load_safetensors(&dir.join("model.safetensors"))
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
}

/// Relative error of the whole model between the `model.safetensors` of
/// directories `a` and `b`: max |a - b| over every weight divided by max
/// |b| over every weight. Every weight must be finite.
pub fn max_weight_rel_err(a: &Path, b: &Path) -> f64 {
    let (a, b) = (weights(a), weights(b));
    assert_eq!(a.keys().collect::<Vec<_>>(), b.keys().collect::<Vec<_>>());
    let (mut diff, mut scale) = (0f32, 0f32);
    for (name, ta) in &a {
        let x = ta.to_vec::<f32>().unwrap();
        let y = b[name].to_vec::<f32>().unwrap();
        assert_eq!(x.len(), y.len(), "{name}");
        for (p, q) in x.iter().zip(&y) {
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
    let values = |t: &TensorData| t.to_vec::<f32>().unwrap();
    let max_abs = |v: &[f32]| v.iter().fold(0f32, |m, x| m.max(x.abs()));
    let model_max = b.values().map(|t| max_abs(&values(t))).fold(0f32, f32::max);
    let (mut model_diff, mut worst) = (0f32, (0f32, String::new()));
    for (name, ta) in &a {
        let (x, y) = (values(ta), values(&b[name]));
        assert_eq!(x.len(), y.len(), "{label}: {name} size");
        let diff = x
            .iter()
            .zip(&y)
            .fold(0f32, |m, (p, q)| m.max((p - q).abs()));
        model_diff = model_diff.max(diff);
        if !noise_only(name) {
            let rel = diff / max_abs(&y);
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
