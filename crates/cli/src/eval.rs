//! `ferrotron eval`: loss (and optionally logits) of a model on given token ids.

use std::path::Path;

use burn::tensor::{Int, Tensor, TensorData};
use ferrotron_engine::backend::BackendKind;
use ferrotron_engine::checkpoint::save_safetensors;
use ferrotron_models::ops::{cross_entropy, TrainBackend};

use crate::args::EvalArgs;
use crate::error::usage;
use crate::source::ModelSource;
use ferrotron_job::{dispatch, parse_backend, BackendTask};

/// Runs `ferrotron eval`: prints `{"loss": <nats/token>, "tokens": <count>}`.
pub fn eval(args: EvalArgs) -> anyhow::Result<()> {
    let source = ModelSource::read(args.run.as_deref(), args.hf_dir.as_deref())?;
    let (ids, shape) = read_tokens(&args.tokens)?;
    source.check_ids(&ids, &format!("--tokens {}", args.tokens.display()))?;
    if shape[1] > source.config.max_seq_len {
        return Err(usage(format!(
            "--tokens {}: rows of {} tokens exceed the model's max_seq_len {}",
            args.tokens.display(),
            shape[1],
            source.config.max_seq_len
        )));
    }
    let backend = args
        .backend
        .clone()
        .unwrap_or_else(|| source.backend.clone());
    let kind: BackendKind = parse_backend(&backend)?;
    dispatch(
        kind,
        0,
        EvalTask {
            source,
            ids,
            shape,
            logits_out: args.logits_out,
        },
    )
}

/// Reads `{"input_ids": [[...], ...]}`: equal-length rows of at least 2 ids.
/// Returns the ids row-major and `[batch, seq]`.
fn read_tokens(path: &Path) -> anyhow::Result<(Vec<u32>, [usize; 2])> {
    let bad = |m: String| usage(format!("--tokens {}: {m}", path.display()));
    let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
    let value: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| bad(format!("not valid JSON: {e}")))?;
    let rows: Vec<Vec<u32>> = value
        .get("input_ids")
        .cloned()
        .map(serde_json::from_value)
        .ok_or_else(|| bad("field 'input_ids' is missing".into()))?
        .map_err(|e| {
            bad(format!(
                "field 'input_ids' must be a list of lists of token ids: {e}"
            ))
        })?;
    let seq = rows.first().map(Vec::len).unwrap_or(0);
    if rows.is_empty() || seq < 2 {
        return Err(bad(
            "field 'input_ids' needs at least one row of at least 2 ids".into(),
        ));
    }
    if let Some(i) = rows.iter().position(|r| r.len() != seq) {
        return Err(bad(format!(
            "field 'input_ids': row {i} has {} ids, row 0 has {seq}; rows must have equal length",
            rows[i].len()
        )));
    }
    let batch = rows.len();
    Ok((rows.into_iter().flatten().collect(), [batch, seq]))
}

struct EvalTask {
    source: ModelSource,
    ids: Vec<u32>,
    shape: [usize; 2],
    logits_out: Option<std::path::PathBuf>,
}

impl BackendTask for EvalTask {
    type Output = ();

    fn run<B: TrainBackend>(self, _: BackendKind, device: B::Device) -> anyhow::Result<()> {
        let model = self.source.model::<B::InnerBackend>(&device)?;
        let [b, t] = self.shape;
        let data: Vec<i64> = self.ids.iter().map(|&i| i as i64).collect();
        let tokens =
            Tensor::<B::InnerBackend, 2, Int>::from_data(TensorData::new(data, [b, t]), &device);
        let logits = model.forward(tokens.clone());
        let loss = cross_entropy(
            model.ops().cross_entropy_impl(),
            logits.clone().narrow(1, 0, t - 1),
            tokens.narrow(1, 1, t - 1),
        );
        let loss: f32 = loss
            .into_data()
            .convert::<f32>()
            .to_vec::<f32>()
            .map_err(|e| anyhow::anyhow!("{e:?}"))?[0];
        if let Some(path) = &self.logits_out {
            save_safetensors(path, &[("logits".to_string(), logits.into_data())])?;
        }
        println!(
            "{}",
            serde_json::json!({"loss": loss as f64, "tokens": b * (t - 1)})
        );
        Ok(())
    }
}
