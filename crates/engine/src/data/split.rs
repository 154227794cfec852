//! Train/validation split of a token stream.

use super::DataError;

/// A token stream cut into a training part and a validation part.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenSplit {
    /// The first `len - val_len` token ids of the stream.
    pub train: Vec<u32>,
    /// The last `val_len = round(len * val_fraction)` token ids of the stream.
    pub val: Vec<u32>,
}

/// Splits `tokens` into a training prefix and a validation suffix.
///
/// The validation part is the last `round(tokens.len() * val_fraction)`
/// tokens, the training part the rest; no token is dropped or duplicated.
/// `min_len` is the minimum number of tokens each part must have — pass
/// `seq_len + 1` so that each part yields at least one window.
///
/// # Errors
///
/// [`DataError::InvalidArgument`] naming `val_fraction` unless it is finite
/// and strictly between 0 and 1; [`DataError::SplitTooShort`] naming the
/// part ("train" or "val") that would have fewer than `min_len` tokens.
pub fn split(tokens: Vec<u32>, val_fraction: f64, min_len: usize) -> Result<TokenSplit, DataError> {
    if !(val_fraction.is_finite() && val_fraction > 0.0 && val_fraction < 1.0) {
        return Err(DataError::InvalidArgument {
            name: "val_fraction",
            value: val_fraction.to_string(),
            reason: "must be a finite number strictly between 0 and 1",
        });
    }
    let total = tokens.len();
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
    let mut train = tokens;
    let val = train.split_off(train_len);
    Ok(TokenSplit { train, val })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_tail_as_validation() {
        let tokens: Vec<u32> = (0..100).collect();
        let s = split(tokens, 0.1, 5).unwrap();
        assert_eq!(s.train, (0..90).collect::<Vec<_>>());
        assert_eq!(s.val, (90..100).collect::<Vec<_>>());
    }

    #[test]
    fn tiny_inputs_are_errors() {
        let err = split(vec![1, 2, 3], 0.1, 2).unwrap_err();
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
        let err = split((0..10).collect(), 0.9, 2).unwrap_err();
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
        let err = split(Vec::new(), 0.5, 0).unwrap_err();
        assert!(matches!(err, DataError::SplitTooShort { .. }), "{err}");
        let err = split((0..100).collect(), 0.5, 51).unwrap_err();
        assert!(err.to_string().contains("51"), "{err}");
    }

    #[test]
    fn bad_fractions_are_errors() {
        for f in [0.0, 1.0, -0.1, 1.5, f64::NAN, f64::INFINITY] {
            let err = split((0..100).collect(), f, 1).unwrap_err();
            assert!(err.to_string().contains("val_fraction"), "{err}");
        }
    }
}
