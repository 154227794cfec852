//! Behaviour of the decoder that holds for every family.

use burn::backend::Flex;
use burn::module::Module;
use burn::tensor::{Int, Tensor, TensorData};
use ferrotron_models::presets::preset;
use ferrotron_models::{generate, Decoder, DecoderConfig, KvCache, SamplingConfig};

type B = Flex;

const FAMILIES: [&str; 3] = ["gpt-mini", "llama-mini", "bloom-mini"];

fn tiny(name: &str) -> DecoderConfig {
    DecoderConfig {
        vocab_size: 50,
        hidden_size: 48,
        n_layers: 2,
        ffn_size: 80,
        max_seq_len: 40,
        ..preset(name).unwrap()
    }
}

fn ids(v: &[i64]) -> Tensor<B, 2, Int> {
    Tensor::from_data(
        TensorData::new(v.to_vec(), [1, v.len()]),
        &Default::default(),
    )
}

fn values(t: Tensor<B, 3>) -> Vec<f32> {
    t.into_data().to_vec().unwrap()
}

#[test]
fn built_models_have_the_configured_parameter_count() {
    for name in FAMILIES {
        let c = preset(name).unwrap();
        let m = Decoder::<B>::new(&c, 0, &Default::default()).unwrap();
        assert_eq!(m.num_params(), c.num_params(), "{name}");
    }
}

#[test]
fn same_seed_same_weights_other_seed_other_weights() {
    let c = tiny("llama-mini");
    let dev = Default::default();
    let logits = |seed| {
        values(
            Decoder::<B>::new(&c, seed, &dev)
                .unwrap()
                .forward(ids(&[1, 2, 3])),
        )
    };
    assert_eq!(logits(3), logits(3));
    assert_ne!(logits(3), logits(4));
}

#[test]
fn a_position_never_sees_the_future() {
    for name in FAMILIES {
        let m = Decoder::<B>::new(&tiny(name), 1, &Default::default()).unwrap();
        let a = values(m.forward(ids(&[5, 6, 7, 8, 9])));
        let b = values(m.forward(ids(&[5, 6, 7, 30, 31])));
        let v = 50;
        // Positions 0..3 are unchanged; position 3 changes.
        assert_eq!(&a[..3 * v], &b[..3 * v], "{name}");
        assert_ne!(&a[3 * v..4 * v], &b[3 * v..4 * v], "{name}");
    }
}

#[test]
fn cached_forward_equals_full_forward() {
    for name in FAMILIES {
        let m = Decoder::<B>::new(&tiny(name), 2, &Default::default()).unwrap();
        let seq = [3i64, 14, 15, 9, 26, 5, 35];
        let full = values(m.forward(ids(&seq)));
        let mut cache = KvCache::new(2);
        let mut cached = values(m.forward_cached(ids(&seq[..4]), &mut cache));
        for t in 4..seq.len() {
            cached.extend(values(m.forward_cached(ids(&seq[t..t + 1]), &mut cache)));
        }
        assert_eq!(cache.len(), seq.len());
        for (x, y) in full.iter().zip(&cached) {
            assert!((x - y).abs() < 1e-5, "{name}: {x} vs {y}");
        }
    }
}

#[test]
fn cached_and_uncached_greedy_decoding_agree() {
    let greedy = SamplingConfig {
        temperature: 0.0,
        top_k: 0,
        seed: 0,
    };
    for name in FAMILIES {
        let dev = Default::default();
        let m = Decoder::<B>::new(&tiny(name), 5, &dev).unwrap();
        let with = generate(&m, &[1, 2, 3], 16, &greedy, &[], true, &dev);
        let without = generate(&m, &[1, 2, 3], 16, &greedy, &[], false, &dev);
        assert_eq!(with.len(), 16);
        assert_eq!(with, without, "{name}");
    }
}

#[test]
fn generation_stops_right_after_an_end_of_sequence_id() {
    let greedy = SamplingConfig {
        temperature: 0.0,
        top_k: 0,
        seed: 0,
    };
    let dev = Default::default();
    let m = Decoder::<B>::new(&tiny("llama-mini"), 5, &dev).unwrap();
    let free = generate(&m, &[1, 2, 3], 16, &greedy, &[], true, &dev);
    let eos = free[5];
    let first = free.iter().position(|&t| t == eos).unwrap();
    for cached in [true, false] {
        let stopped = generate(&m, &[1, 2, 3], 16, &greedy, &[eos, 10_000], cached, &dev);
        assert_eq!(stopped, free[..=first], "cache: {cached}");
    }
}
