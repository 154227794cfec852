//! Autoregressive sampling with a KV cache.

use burn::tensor::{Int, Tensor, TensorData};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::decoder::{Decoder, KvCache};
use crate::ops::KernelBackend;

/// How the next token is chosen.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SamplingConfig {
    /// Softmax temperature; 0 picks the most likely token (greedy).
    pub temperature: f64,
    /// Sample only among the `top_k` most likely tokens (0 = all).
    pub top_k: usize,
    /// Seed of the sampling generator.
    pub seed: u64,
}

/// Picks a token id from one row of logits `[vocab]`.
fn pick(logits: &[f32], s: &SamplingConfig, rng: &mut StdRng) -> u32 {
    let argmax = || {
        logits
            .iter()
            .enumerate()
            .fold((0, f32::NEG_INFINITY), |best, (i, &v)| {
                if v > best.1 {
                    (i, v)
                } else {
                    best
                }
            })
            .0 as u32
    };
    if s.temperature <= 0.0 {
        return argmax();
    }
    let mut order: Vec<u32> = (0..logits.len() as u32).collect();
    order.sort_by(|&a, &b| logits[b as usize].total_cmp(&logits[a as usize]));
    if s.top_k > 0 {
        order.truncate(s.top_k);
    }
    let max = logits[order[0] as usize] as f64;
    let weights: Vec<f64> = order
        .iter()
        .map(|&i| ((logits[i as usize] as f64 - max) / s.temperature).exp())
        .collect();
    let mut r = rng.random::<f64>() * weights.iter().sum::<f64>();
    for (&id, w) in order.iter().zip(&weights) {
        if r < *w {
            return id;
        }
        r -= w;
    }
    order[order.len() - 1]
}

/// Generates up to `max_new` tokens after `prompt` and returns only the new ids.
/// Generation also ends right after any id in `stop` (end-of-sequence ids;
/// the stop id is returned, as `transformers` does).
///
/// With `use_cache` the prompt is run once and each new token attends to the
/// cached keys and values; without it every step re-runs the whole sequence
/// (kept as the reference the cached path is tested against). Generation
/// stops early at `max_seq_len`.
pub fn generate<B: KernelBackend>(
    model: &Decoder<B>,
    prompt: &[u32],
    max_new: usize,
    sampling: &SamplingConfig,
    stop: &[u32],
    use_cache: bool,
    device: &B::Device,
) -> Vec<u32> {
    let max_seq = model.config().max_seq_len;
    let ids = |v: &[u32]| {
        let data: Vec<i64> = v.iter().map(|&x| x as i64).collect();
        Tensor::<B, 2, Int>::from_data(TensorData::new(data, [1, v.len()]), device)
    };
    let last_row = |logits: Tensor<B, 3>| -> Vec<f32> {
        let [_, t, v] = logits.dims();
        logits
            .narrow(1, t - 1, 1)
            .reshape([v])
            .into_data()
            .convert::<f32>()
            .to_vec()
            .unwrap_or_default()
    };
    let mut rng = StdRng::seed_from_u64(sampling.seed);
    let mut seq = prompt.to_vec();
    let mut cache = KvCache::new(model.config().n_layers);
    let mut fed = 0;
    let mut out = Vec::new();
    while out.len() < max_new && seq.len() < max_seq && !seq.is_empty() {
        let logits = if use_cache {
            let l = model.forward_cached(ids(&seq[fed..]), &mut cache);
            fed = seq.len();
            l
        } else {
            model.forward(ids(&seq))
        };
        let next = pick(&last_row(logits), sampling, &mut rng);
        seq.push(next);
        out.push(next);
        if stop.contains(&next) {
            break;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_takes_the_argmax_and_top_one_sampling_agrees() {
        let logits = [0.1, 2.0, -1.0, 1.9];
        let mut rng = StdRng::seed_from_u64(0);
        let greedy = SamplingConfig {
            temperature: 0.0,
            top_k: 0,
            seed: 0,
        };
        assert_eq!(pick(&logits, &greedy, &mut rng), 1);
        let top1 = SamplingConfig {
            temperature: 1.0,
            top_k: 1,
            seed: 0,
        };
        for _ in 0..20 {
            assert_eq!(pick(&logits, &top1, &mut rng), 1);
        }
        let top2 = SamplingConfig { top_k: 2, ..top1 };
        let picks: Vec<u32> = (0..200).map(|_| pick(&logits, &top2, &mut rng)).collect();
        assert!(picks.iter().all(|&p| p == 1 || p == 3));
        assert!(picks.contains(&3) && picks.contains(&1));
    }
}
