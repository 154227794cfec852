//! ZeRO-3 builds only its DP share: a rank's model is placeholders
//! (`Decoder::placeholder_part`) and `Zero::from_source` draws only its
//! pieces. In one process, for every family (and a vocabulary tp2 pads),
//! dp2 and dp3 (uneven chunks), with and without tp2: each rank's pieces equal the pieces `Zero::new`
//! keeps of the built TP part bit for bit (same layout, same values), and
//! the pieces of every DP rank, joined, are the whole TP part, each
//! element owned once.

use std::collections::HashMap;
use std::sync::Arc;

use burn::backend::{Autodiff, Flex};
use burn::module::ParamId;
use burn::tensor::Tensor;
use ferrotron_engine::params::{named_tensors, param_names};
use ferrotron_engine::precision::Precision;
use ferrotron_models::presets::preset;
use ferrotron_models::tensor_parallel::shard_plan;
use ferrotron_models::{Decoder, DecoderConfig, ModelPart};
use ferrotron_parallel::grad_sync::GradSync;
use ferrotron_parallel::tensor::{TpGroup, DEFAULT_VOCAB_DIVISIBLE_BY};
use ferrotron_parallel::zero::{Zero, ZeroStage};

use crate::common::rank_of::RankOf;

type B = Autodiff<Flex>;
type Z = Zero<B, Decoder<B>>;

const SEED: u64 = 30_003;

/// Each piece this rank owns, by parameter name: its flat range of the
/// TP part's tensor and its values as bits.
type Pieces = HashMap<String, (std::ops::Range<usize>, Vec<u32>)>;

fn pieces(zero: &Z, model: &Decoder<B>) -> Pieces {
    let names: HashMap<ParamId, String> = param_names(model).into_iter().collect();
    let held = zero.param_pieces().expect("stage 3 holds pieces");
    zero.owned_ranges()
        .expect("ZeRO owns ranges")
        .into_iter()
        .map(|(id, range)| {
            let t: Tensor<Flex, 1> = held[&id].clone();
            let bits = t.into_data().to_vec::<f32>().unwrap();
            let bits = bits.into_iter().map(f32::to_bits).collect();
            (names[&id].clone(), (range, bits))
        })
        .collect()
}

fn dp_rank(rank: usize, size: usize) -> Arc<RankOf> {
    Arc::new(RankOf { rank, size })
}

/// Checks every DP rank of `dp` under TP rank `tp_rank` of `tp`.
fn check(family: &str, c: &DecoderConfig, tp: usize, tp_rank: usize, dp: usize) {
    let what = format!("{family} tp{tp} rank {tp_rank} dp{dp}");
    let device = Default::default();
    let plan = shard_plan(c, tp, DEFAULT_VOCAB_DIVISIBLE_BY).unwrap();
    let part = || {
        let group = TpGroup::new(Arc::new(RankOf {
            rank: tp_rank,
            size: tp,
        }));
        ModelPart::tensor_parallel(plan.clone(), group).unwrap()
    };
    let built = Decoder::<B>::new_part(c, SEED, &device, &part()).unwrap();
    let whole: HashMap<String, Vec<u32>> = named_tensors(&built)
        .into_iter()
        .map(|(n, d)| {
            (
                n,
                d.to_vec::<f32>()
                    .unwrap()
                    .into_iter()
                    .map(f32::to_bits)
                    .collect(),
            )
        })
        .collect();
    let mut owners: HashMap<&str, Vec<u8>> = whole
        .iter()
        .map(|(n, v)| (n.as_str(), vec![0; v.len()]))
        .collect();
    for rank in 0..dp {
        let (model, source) = Decoder::<B>::placeholder_part(c, SEED, &device, &part()).unwrap();
        assert!(
            named_tensors(&model)
                .iter()
                .all(|(_, d)| d.num_elements() == 1),
            "{what}: the model of placeholders holds a tensor"
        );
        let (zero, model) = Z::from_source(
            model,
            &source,
            dp_rank(rank, dp),
            device,
            Precision::Fp32,
            false,
        )
        .unwrap();
        let drawn = pieces(&zero, &model);
        let (old, old_model) = Z::new(
            ZeroStage::Three,
            built.clone(),
            dp_rank(rank, dp),
            1 << 20,
            device,
            Precision::Fp32,
            false,
        )
        .unwrap();
        assert_eq!(
            zero.layout().shard_elems(),
            old.layout().shard_elems(),
            "{what}"
        );
        assert!(
            drawn == pieces(&old, &old_model),
            "{what}: rank {rank}'s pieces"
        );
        for (name, (range, bits)) in &drawn {
            assert!(
                bits[..] == whole[name][range.clone()],
                "{what}: rank {rank}'s piece {range:?} of {name}"
            );
            owners.get_mut(name.as_str()).unwrap()[range.clone()]
                .iter_mut()
                .for_each(|o| *o += 1);
        }
    }
    for (name, owned) in owners {
        assert!(owned.iter().all(|&o| o == 1), "{what}: {name} owned once");
    }
}

#[test]
fn zero3_pieces_drawn_alone_join_into_the_built_part_bit_for_bit() {
    let mut padded = preset("gpt-mini").unwrap();
    // tp2 pads a 1000-token vocabulary: rank 1's block is part zeros.
    padded.vocab_size = 1000;
    let families = ["gpt-mini", "llama-mini", "bloom-mini"]
        .map(|f| (f.to_string(), preset(f).unwrap()))
        .into_iter()
        .chain([("gpt-mini vocab 1000".to_string(), padded)]);
    for (family, c) in families {
        for (tp, dp) in [(1, 2), (1, 3), (2, 2), (2, 3)] {
            for tp_rank in 0..tp {
                check(&family, &c, tp, tp_rank, dp);
            }
        }
    }
}
