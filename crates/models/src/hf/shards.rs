//! Weights written as Hugging Face writes them: one `model.safetensors` when
//! everything fits in one shard, otherwise `model-00001-of-0000N.safetensors`
//! files of at most the maximum shard size each and a
//! `model.safetensors.index.json` mapping every tensor to its file.
//!
//! Shards are filled in tensor order (names sorted), a new one starting when
//! the next tensor would overflow the current one, as
//! `huggingface_hub.split_torch_state_dict_into_shards` does; a tensor larger
//! than the limit gets a shard of its own.

/// `save_pretrained`'s default maximum shard size, 5 GB, in bytes.
pub const DEFAULT_MAX_SHARD_SIZE: u64 = 5_000_000_000;

/// Parses a shard size as `transformers` does: plain bytes (`1000000`), or
/// a number with a decimal (`KB`, `MB`, `GB`, `TB`: powers of 1000) or binary
/// (`KiB`, `MiB`, `GiB`, `TiB`: powers of 1024) unit, case-insensitive.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let scale: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        "kib" => 1 << 10,
        "mib" => 1 << 20,
        "gib" => 1 << 30,
        "tib" => 1 << 40,
        other => {
            return Err(format!(
                "'{s}': unknown unit '{other}'; use bytes or KB, MB, GB, TB, KiB, MiB, GiB, TiB"
            ))
        }
    };
    let n: f64 = number
        .parse()
        .map_err(|_| format!("'{s}' is not a size (e.g. 5GB, 500MB, 1000000)"))?;
    let bytes = (n * scale as f64).floor();
    if !(bytes >= 1.0 && bytes < u64::MAX as f64) {
        return Err(format!("'{s}': the size must be at least one byte"));
    }
    Ok(bytes as u64)
}

/// Indices of `sizes` (bytes per tensor, in write order) grouped into shards
/// of at most `max` bytes each (a single oversized tensor excepted).
pub(crate) fn plan(sizes: &[u64], max: u64) -> Vec<Vec<usize>> {
    let mut shards: Vec<Vec<usize>> = Vec::new();
    let mut current = 0u64;
    for (i, &size) in sizes.iter().enumerate() {
        match shards.last_mut() {
            Some(last) if current + size <= max => {
                last.push(i);
                current += size;
            }
            _ => {
                shards.push(vec![i]);
                current = size;
            }
        }
    }
    shards
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_like_transformers() {
        assert_eq!(parse_size("5GB").unwrap(), 5_000_000_000);
        assert_eq!(parse_size("500MB").unwrap(), 500_000_000);
        assert_eq!(parse_size("2GiB").unwrap(), 2 << 30);
        assert_eq!(parse_size("1.5kb").unwrap(), 1500);
        assert_eq!(parse_size("123456").unwrap(), 123_456);
        assert!(parse_size("5 parsecs")
            .unwrap_err()
            .contains("unknown unit"));
        assert!(parse_size("GB").unwrap_err().contains("not a size"));
        assert!(parse_size("0").unwrap_err().contains("at least one byte"));
    }

    #[test]
    fn shards_fill_in_order_and_oversized_tensors_stand_alone() {
        assert_eq!(plan(&[4, 4, 4], 100), vec![vec![0, 1, 2]]);
        assert_eq!(plan(&[4, 4, 4], 8), vec![vec![0, 1], vec![2]]);
        assert_eq!(
            plan(&[3, 20, 3, 3, 3], 8),
            vec![vec![0], vec![1], vec![2, 3], vec![4]]
        );
    }
}
