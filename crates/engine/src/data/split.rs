//! Train/validation split of a token stream.

use super::DataError;

/// The lengths `(train, val)` of the split of a stream of `total` tokens:
/// `val = round(total * val_fraction)` tokens at the end, `train` the first
/// `total - val`; no token is dropped or duplicated. `min_len` is the
/// minimum number of tokens each part must have — pass `seq_len + 1` so
/// that each part yields at least one window. A stream in memory and a
/// shard set are cut at the same place, so both paths train and validate
/// on the same tokens.
///
/// # Errors
///
/// [`DataError::InvalidArgument`] naming `val_fraction` unless it is finite
/// and strictly between 0 and 1; [`DataError::SplitTooShort`] naming the
/// part ("train" or "val") that would have fewer than `min_len` tokens.
pub fn split_lengths(
    total: usize,
    val_fraction: f64,
    min_len: usize,
) -> Result<(usize, usize), DataError> {
    if !(val_fraction.is_finite() && val_fraction > 0.0 && val_fraction < 1.0) {
        return Err(DataError::InvalidArgument {
            name: "val_fraction",
            value: val_fraction.to_string(),
            reason: "must be a finite number strictly between 0 and 1",
        });
    }
    // Exact for any realistic length; the clamp guards against rounding up to `total`.
    let val_len = ((total as f64) * val_fraction).round().min(total as f64) as usize;
    let train_len = total - val_len;
    for (part, len) in [("train", train_len), ("val", val_len)] {
        if len < min_len || len == 0 {
            return Err(DataError::SplitTooShort {
                part,
                len,
                min_len,
                total,
            });
        }
    }
    Ok((train_len, val_len))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_tail_as_validation() {
        assert_eq!(split_lengths(100, 0.1, 5).unwrap(), (90, 10));
        assert_eq!(split_lengths(101, 0.1, 5).unwrap(), (91, 10));
        assert_eq!(split_lengths(105, 0.1, 5).unwrap(), (94, 11));
    }

    #[test]
    fn tiny_inputs_are_errors() {
        let err = split_lengths(3, 0.1, 2).unwrap_err();
        assert!(
            matches!(
                err,
                DataError::SplitTooShort {
                    part: "val",
                    len: 0,
                    ..
                }
            ),
            "{err}"
        );
        let err = split_lengths(10, 0.9, 2).unwrap_err();
        assert!(
            matches!(
                err,
                DataError::SplitTooShort {
                    part: "train",
                    len: 1,
                    ..
                }
            ),
            "{err}"
        );
        let err = split_lengths(0, 0.5, 0).unwrap_err();
        assert!(matches!(err, DataError::SplitTooShort { .. }), "{err}");
        let err = split_lengths(100, 0.5, 51).unwrap_err();
        assert!(err.to_string().contains("51"), "{err}");
    }

    #[test]
    fn bad_fractions_are_errors() {
        for f in [0.0, 1.0, -0.1, 1.5, f64::NAN, f64::INFINITY] {
            let err = split_lengths(100, f, 1).unwrap_err();
            assert!(err.to_string().contains("val_fraction"), "{err}");
        }
    }
}
