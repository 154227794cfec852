//! Safetensors checkpoints, written atomically.

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::path::Path;

use burn::tensor::{bf16, f16, TensorData};
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
    /// Writing a file of a checkpoint failed; the checkpoint's temporary
    /// files were removed.
    /// (`error` is not the error's `source`: the line already holds it.)
    #[error("{path}: {error}; the checkpoint needs {needed_bytes} bytes ({:.2} MiB) in all; its temporary files were removed and {kept}", *needed_bytes as f64 / 1048576.0)]
    Write {
        /// The file whose write failed.
        path: String,
        /// What the system said.
        error: std::io::Error,
        /// Bytes of every file of the checkpoint together.
        needed_bytes: u64,
        /// What the checkpoint directory still holds (`checkpoints/latest
        /// still names step-N`).
        kept: String,
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

/// How floating-point tensors are stored in a safetensors file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FloatDtype {
    /// IEEE single precision, 4 bytes.
    F32,
    /// bfloat16, 2 bytes (rounded to nearest even, as `torch` converts).
    Bf16,
    /// IEEE half precision, 2 bytes (rounded to nearest even).
    F16,
}

impl FloatDtype {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            FloatDtype::F32 => 4,
            FloatDtype::Bf16 | FloatDtype::F16 => 2,
        }
    }

    /// The `torch` name (`torch_dtype` in a Hugging Face `config.json`).
    pub fn torch_name(self) -> &'static str {
        match self {
            FloatDtype::F32 => "float32",
            FloatDtype::Bf16 => "bfloat16",
            FloatDtype::F16 => "float16",
        }
    }

    /// The safetensors dtype tag.
    pub fn safetensors(self) -> Dtype {
        match self {
            FloatDtype::F32 => Dtype::F32,
            FloatDtype::Bf16 => Dtype::BF16,
            FloatDtype::F16 => Dtype::F16,
        }
    }

    fn of(dtype: Dtype) -> Option<Self> {
        match dtype {
            Dtype::F32 => Some(FloatDtype::F32),
            Dtype::BF16 => Some(FloatDtype::Bf16),
            Dtype::F16 => Some(FloatDtype::F16),
            _ => None,
        }
    }

    /// Little-endian bytes of `values` in this dtype (`size()` bytes each).
    pub fn encode(self, values: &[f32]) -> Vec<u8> {
        match self {
            FloatDtype::F32 => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
            FloatDtype::Bf16 => values
                .iter()
                .flat_map(|v| bf16::from_f32(*v).to_le_bytes())
                .collect(),
            FloatDtype::F16 => values
                .iter()
                .flat_map(|v| f16::from_f32(*v).to_le_bytes())
                .collect(),
        }
    }
}

impl std::str::FromStr for FloatDtype {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "f32" => Ok(FloatDtype::F32),
            "bf16" => Ok(FloatDtype::Bf16),
            "f16" => Ok(FloatDtype::F16),
            _ => Err(format!("'{s}' is not a dtype; use f32, bf16 or f16")),
        }
    }
}

/// Saves named tensors as float32 safetensors at `path` (atomically).
pub fn save_safetensors(
    path: &Path,
    tensors: &[(String, TensorData)],
) -> Result<(), CheckpointError> {
    save_safetensors_as(path, tensors, FloatDtype::F32)
}

/// Saves named tensors as safetensors of `dtype` at `path` (atomically).
pub fn save_safetensors_as(
    path: &Path,
    tensors: &[(String, TensorData)],
    dtype: FloatDtype,
) -> Result<(), CheckpointError> {
    write_atomic(path, &encode_safetensors(path, tensors, dtype)?)
}

/// The bytes of a safetensors file of named tensors in `dtype`: what
/// [`save_safetensors_as`] writes (`path` only names the file in errors).
pub fn encode_safetensors(
    path: &Path,
    tensors: &[(String, TensorData)],
    dtype: FloatDtype,
) -> Result<Vec<u8>, CheckpointError> {
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
                Ok((name.clone(), data.shape.to_vec(), dtype.encode(&values)))
            })
            .collect::<Result<_, CheckpointError>>()?;
    let views: Vec<(String, TensorView<'_>)> = converted
        .iter()
        .map(|(name, shape, bytes)| {
            TensorView::new(dtype.safetensors(), shape.clone(), bytes)
                .map(|v| (name.clone(), v))
                .map_err(|e| CheckpointError::Format {
                    path: path.display().to_string(),
                    message: format!("tensor '{name}': {e}"),
                })
        })
        .collect::<Result<_, _>>()?;
    safetensors::serialize(views, &None).map_err(|e| CheckpointError::Format {
        path: path.display().to_string(),
        message: e.to_string(),
    })
}

/// Loads every tensor of a safetensors file as float32 `TensorData`.
///
/// F32, F16 and BF16 tensors are accepted; other dtypes are an error naming
/// the tensor.
pub fn load_safetensors(path: &Path) -> Result<BTreeMap<String, TensorData>, CheckpointError> {
    load_safetensors_typed(path).map(|(tensors, _)| tensors)
}

/// [`load_safetensors`], and the dtype the file stores its tensors in (`None`
/// for an empty file or one that mixes dtypes).
pub fn load_safetensors_typed(
    path: &Path,
) -> Result<(BTreeMap<String, TensorData>, Option<FloatDtype>), CheckpointError> {
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
    Ok((out, single_dtype(&st)))
}

/// The one float dtype of every tensor in `st`, if they share one.
fn single_dtype(st: &SafeTensors<'_>) -> Option<FloatDtype> {
    let mut found = None;
    for (_, view) in st.tensors() {
        let d = FloatDtype::of(view.dtype())?;
        if found.is_some_and(|f| f != d) {
            return None;
        }
        found = Some(d);
    }
    found
}

/// IEEE half precision bits to f32.
fn half_to_f32(h: u16) -> f32 {
    f16::from_bits(h).to_f32()
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
    fn half_dtypes_round_to_nearest_even_and_report_their_dtype() {
        let dir = std::env::temp_dir().join(format!("ft-ckpt-half-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let path = dir.join("model.safetensors");
        // bf16 keeps 8 significant bits: 1 + 2^-9 rounds down to 1, and
        // 1 + 1.5 ulp (a tie) to the even 1 + 2 ulp; f16 keeps 11 bits.
        let values = vec![1.0 + 2f32.powi(-9), 1.0 + 3.0 * 2f32.powi(-8), -2.0];
        let t = vec![("w".to_string(), TensorData::new(values, [3]))];
        let cases = [
            (FloatDtype::Bf16, vec![1.0, 1.015625, -2.0], 2),
            (
                FloatDtype::F16,
                vec![1.0 + 2f32.powi(-9), 1.0 + 3.0 * 2f32.powi(-8), -2.0],
                2,
            ),
            (FloatDtype::F32, t[0].1.to_vec::<f32>().unwrap(), 4),
        ];
        for (dtype, want, size) in cases {
            save_safetensors_as(&path, &t, dtype).unwrap();
            let (back, found) = load_safetensors_typed(&path).unwrap();
            assert_eq!(found, Some(dtype));
            assert_eq!(dtype.size(), size);
            assert_eq!(back["w"].to_vec::<f32>().unwrap(), want, "{dtype:?}");
        }
        assert!("fp8"
            .parse::<FloatDtype>()
            .unwrap_err()
            .contains("f32, bf16 or f16"));
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
