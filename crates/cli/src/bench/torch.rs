//! `bench kernels --torch FILE`: PyTorch's attention times, as
//! `scripts/bench_torch_attention.py` writes them, beside the fused
//! attention kernels' rows of the same shape and storage type.

use std::collections::HashMap;
use std::path::Path;

use anyhow::Result;
use serde::Deserialize;

use crate::error::usage;

/// The `schema` of the script's JSON.
pub const SCHEMA: &str = "ferrotron-torch-attention/1";

/// The script's JSON, the fields read here.
#[derive(Deserialize)]
struct File {
    schema: String,
    dtype: String,
    backend: String,
    rows: Vec<FileRow>,
}

#[derive(Deserialize)]
struct FileRow {
    shape: String,
    forward_ms: f64,
    backward_ms: f64,
    ms: f64,
}

/// PyTorch's medians at one shape, ms.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TorchTimes {
    /// Forward alone.
    pub forward_ms: f64,
    /// Backward alone (forward + backward minus the forward).
    pub backward_ms: f64,
    /// Forward + backward.
    pub ms: f64,
}

/// PyTorch's attention times in one storage type, by shape.
#[derive(Debug)]
pub struct TorchAttention {
    /// Storage type of the inputs, `bf16`, `f16` or `f32`.
    pub dtype: String,
    /// PyTorch's implementation (`flash`, `efficient`, ...).
    pub backend: String,
    rows: HashMap<String, TorchTimes>,
}

impl TorchAttention {
    /// Reads `path`; a file that is not the script's JSON, or that has a
    /// time that is not positive, is a usage error naming the file.
    pub fn read(path: &Path) -> Result<Self> {
        let bad = |what: String| usage(format!("--torch {}: {what}", path.display()));
        let text = std::fs::read_to_string(path).map_err(|e| bad(format!("cannot read: {e}")))?;
        let file: File = serde_json::from_str(&text).map_err(|e| {
            bad(format!(
                "not the JSON of scripts/bench_torch_attention.py: {e}"
            ))
        })?;
        if file.schema != SCHEMA {
            return Err(bad(format!(
                "schema {:?}, expected {SCHEMA:?} (scripts/bench_torch_attention.py)",
                file.schema
            )));
        }
        let mut rows = HashMap::new();
        for r in file.rows {
            let times = [r.forward_ms, r.backward_ms, r.ms];
            if !times.iter().all(|t| t.is_finite() && *t > 0.0) {
                return Err(bad(format!("shape {}: times must be positive", r.shape)));
            }
            let times = TorchTimes {
                forward_ms: r.forward_ms,
                backward_ms: r.backward_ms,
                ms: r.ms,
            };
            rows.insert(r.shape, times);
        }
        Ok(TorchAttention {
            dtype: file.dtype,
            backend: file.backend,
            rows,
        })
    }

    /// PyTorch's times at `shape` (as `bench kernels` prints it) for a
    /// kernel storing `dtype`; `None` at another shape or type.
    pub fn times(&self, shape: &str, dtype: &str) -> Option<TorchTimes> {
        (dtype == self.dtype)
            .then(|| self.rows.get(shape).copied())
            .flatten()
    }
}
