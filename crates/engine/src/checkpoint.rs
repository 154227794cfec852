//! Safetensors checkpoints, written atomically.

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::path::Path;

use burn::tensor::TensorData;
use safetensors::tensor::{Dtype, TensorView};
use safetensors::SafeTensors;

/// Errors reading or writing a checkpoint file.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// The file system refused.
    #[error("{path}: {source}")]
    Io {
        /// File involved.
        path: String,
        /// Underlying error.
        source: std::io::Error,
    },
    /// The file is not valid safetensors, or holds a tensor we cannot read.
    #[error("{path}: {message}")]
    Format {
        /// File involved.
        path: String,
        /// What is wrong.
        message: String,
    },
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> CheckpointError + '_ {
    move |source| CheckpointError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// Writes `bytes` to `path` atomically: a temporary file in the same
/// directory is written, flushed to disk and renamed over `path`, so a crash
/// leaves either the previous file or the new one, never a torn one.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), CheckpointError> {
    let dir = path.parent().unwrap_or_else(|| Path::new("."));
    let file_name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{file_name}.tmp-{}", std::process::id()));
    let mut f = fs::File::create(&tmp).map_err(io_err(&tmp))?;
    f.write_all(bytes).map_err(io_err(&tmp))?;
    f.sync_all().map_err(io_err(&tmp))?;
    drop(f);
    fs::rename(&tmp, path).map_err(io_err(path))
}

/// Saves named tensors as float32 safetensors at `path` (atomically).
pub fn save_safetensors(
    path: &Path,
    tensors: &[(String, TensorData)],
) -> Result<(), CheckpointError> {
    let converted: Vec<(String, Vec<usize>, Vec<u8>)> =
        tensors
            .iter()
            .map(|(name, data)| {
                let values: Vec<f32> = data.clone().convert::<f32>().to_vec().map_err(|e| {
                    CheckpointError::Format {
                        path: path.display().to_string(),
                        message: format!("tensor '{name}': {e:?}"),
                    }
                })?;
                let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
                Ok((name.clone(), data.shape.to_vec(), bytes))
            })
            .collect::<Result<_, CheckpointError>>()?;
    let views: Vec<(String, TensorView<'_>)> = converted
        .iter()
        .map(|(name, shape, bytes)| {
            TensorView::new(Dtype::F32, shape.clone(), bytes)
                .map(|v| (name.clone(), v))
                .map_err(|e| CheckpointError::Format {
                    path: path.display().to_string(),
                    message: format!("tensor '{name}': {e}"),
                })
        })
        .collect::<Result<_, _>>()?;
    let bytes = safetensors::serialize(views, &None).map_err(|e| CheckpointError::Format {
        path: path.display().to_string(),
        message: e.to_string(),
    })?;
    write_atomic(path, &bytes)
}

/// Loads every tensor of a safetensors file as float32 `TensorData`.
///
/// F32, F16 and BF16 tensors are accepted; other dtypes are an error naming
/// the tensor.
pub fn load_safetensors(path: &Path) -> Result<BTreeMap<String, TensorData>, CheckpointError> {
    let bytes = fs::read(path).map_err(io_err(path))?;
    let fmt = |message: String| CheckpointError::Format {
        path: path.display().to_string(),
        message,
    };
    let st = SafeTensors::deserialize(&bytes).map_err(|e| fmt(e.to_string()))?;
    let mut out = BTreeMap::new();
    for (name, view) in st.tensors() {
        let raw = view.data();
        let values: Vec<f32> = match view.dtype() {
            Dtype::F32 => raw
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            Dtype::BF16 => raw
                .chunks_exact(2)
                .map(|c| f32::from_bits((u16::from_le_bytes([c[0], c[1]]) as u32) << 16))
                .collect(),
            Dtype::F16 => raw
                .chunks_exact(2)
                .map(|c| half_to_f32(u16::from_le_bytes([c[0], c[1]])))
                .collect(),
            other => {
                return Err(fmt(format!(
                    "tensor '{name}' has dtype {other:?}; expected F32, F16 or BF16"
                )))
            }
        };
        out.insert(name, TensorData::new(values, view.shape().to_vec()));
    }
    Ok(out)
}

/// IEEE half precision bits to f32.
fn half_to_f32(h: u16) -> f32 {
    let sign = ((h >> 15) as u32) << 31;
    let exp = ((h >> 10) & 0x1f) as u32;
    let frac = (h & 0x3ff) as u32;
    let bits = match (exp, frac) {
        (0, 0) => sign,
        (0, f) => {
            // Subnormal: value = f * 2^-24.
            let v = f as f32 * 2f32.powi(-24);
            return if sign != 0 { -v } else { v };
        }
        (0x1f, f) => sign | 0x7f80_0000 | (f << 13),
        (e, f) => sign | ((e + 112) << 23) | (f << 13),
    };
    f32::from_bits(bits)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_leaves_no_temporary_file() {
        let dir = std::env::temp_dir().join(format!("ft-ckpt-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let path = dir.join("model.safetensors");
        let t = vec![
            (
                "a".to_string(),
                TensorData::new(vec![1.0f32, 2.0, 3.0, 4.0], [2, 2]),
            ),
            ("b".to_string(), TensorData::new(vec![-0.5f32], [1])),
        ];
        save_safetensors(&path, &t).unwrap();
        let back = load_safetensors(&path).unwrap();
        assert_eq!(back["a"], t[0].1);
        assert_eq!(back["b"], t[1].1);
        let files: Vec<_> = fs::read_dir(&dir).unwrap().collect();
        assert_eq!(files.len(), 1);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn half_precision_decodes() {
        assert_eq!(half_to_f32(0x3c00), 1.0);
        assert_eq!(half_to_f32(0xc000), -2.0);
        assert_eq!(half_to_f32(0x0001), 2f32.powi(-24));
    }

    #[test]
    fn a_bad_file_is_named() {
        let path = std::env::temp_dir().join(format!("ft-bad-{}.st", std::process::id()));
        fs::write(&path, b"not safetensors").unwrap();
        let e = load_safetensors(&path).unwrap_err().to_string();
        assert!(e.starts_with(&path.display().to_string()), "{e}");
        fs::remove_file(&path).unwrap();
    }
}
