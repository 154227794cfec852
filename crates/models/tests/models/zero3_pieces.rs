//! ZeRO-3 builds only its DP share: a rank's model is placeholders
//! (`Decoder::placeholder_part`) and `Zero::from_source` draws only its
//! pieces. In one process, for every family (and a vocabulary tp2 pads),
//! dp2 and dp3 (uneven chunks), with and without tp2: each rank's pieces equal the pieces `Zero::new`
//! keeps of the built TP part bit for bit (same layout, same values), and
//! the pieces of every DP rank, joined, are the whole TP part, each
//! element owned once. The same holds for the pieces a ZeRO-3 rank reads
//! from a Hugging Face directory (`HfPartSource`) against its part of the
//! directory (`load_hf_part`).

use std::collections::HashMap;
use std::sync::Arc;

use burn::backend::{Autodiff, Flex};
use burn::module::ParamId;
use ferrotron_engine::params::{named_tensors, param_names};
use ferrotron_engine::precision::Precision;
#[cfg(feature = "flex")]
use ferrotron_models::hf::{load_hf_part, read_hf_dir, HfPartSource};
use ferrotron_models::presets::preset;
use ferrotron_models::tensor_parallel::shard_plan;
use ferrotron_models::{Decoder, DecoderConfig, ModelPart};
use ferrotron_parallel::grad_sync::GradSync;
#[cfg(feature = "flex")]
use ferrotron_parallel::pipeline::PipelineConfig;
use ferrotron_parallel::tensor::{TpGroup, DEFAULT_VOCAB_DIVISIBLE_BY};
use ferrotron_parallel::zero::{Zero, ZeroStage};

use crate::common::rank_of::RankOf;
#[cfg(feature = "flex")]
use crate::hf_slice::{fixture, part};

type B = Autodiff<Flex>;
type Z = Zero<B, Decoder<B>>;

const SEED: u64 = 30_003;

/// Each piece this rank owns, by parameter name: its flat range of the
/// TP part's tensor and its values as bits.
type Pieces = HashMap<String, (std::ops::Range<usize>, Vec<u32>)>;

fn pieces(zero: &Z, model: &Decoder<B>) -> Pieces {
    let names: HashMap<ParamId, String> = param_names(model).into_iter().collect();
    assert!(zero.holds_param_pieces(), "stage 3 holds pieces");
    zero.owned_ranges()
        .expect("ZeRO owns ranges")
        .into_iter()
        .map(|(id, range)| {
            let values = zero.param_piece(id).expect("stage 3 holds pieces");
            let bits = values.into_iter().map(f32::to_bits).collect();
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
    let whole = tensor_bits(&built);
    let mut owners = Owners::of(&whole);
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
        owners.check(&what, rank, &drawn, &whole);
    }
    owners.once(&what);
}

/// Every tensor of `model`, by name, as f32 bits.
fn tensor_bits(model: &Decoder<B>) -> HashMap<String, Vec<u32>> {
    named_tensors(model)
        .into_iter()
        .map(|(n, d)| {
            let values = d.to_vec::<f32>().unwrap();
            (n, values.into_iter().map(f32::to_bits).collect())
        })
        .collect()
}

/// How many DP ranks own each element of each tensor.
struct Owners(HashMap<String, Vec<u8>>);

impl Owners {
    fn of(whole: &HashMap<String, Vec<u32>>) -> Self {
        Self(
            whole
                .iter()
                .map(|(n, v)| (n.clone(), vec![0; v.len()]))
                .collect(),
        )
    }

    /// Checks rank `rank`'s `pieces` against `whole` and counts them.
    fn check(
        &mut self,
        what: &str,
        rank: usize,
        pieces: &Pieces,
        whole: &HashMap<String, Vec<u32>>,
    ) {
        for (name, (range, bits)) in pieces {
            assert!(
                bits[..] == whole[name][range.clone()],
                "{what}: rank {rank}'s piece {range:?} of {name}"
            );
            self.0.get_mut(name).unwrap()[range.clone()]
                .iter_mut()
                .for_each(|o| *o += 1);
        }
    }

    /// Checks that every element was owned exactly once.
    fn once(&self, what: &str) {
        for (name, owned) in &self.0 {
            assert!(owned.iter().all(|&o| o == 1), "{what}: {name} owned once");
        }
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

#[cfg(feature = "flex")]
#[test]
fn zero3_pieces_read_from_an_hf_dir_join_into_its_part() {
    let device = Default::default();
    for family in ["gpt2", "llama", "bloom"] {
        let dir = fixture(family);
        let c = read_hf_dir(&dir).unwrap().config;
        let layout = PipelineConfig::default().layout(c.n_layers, 1).unwrap();
        for (tp, dp) in [(1, 2), (2, 3)] {
            let plan = shard_plan(&c, tp, DEFAULT_VOCAB_DIVISIBLE_BY).unwrap();
            for tp_rank in 0..tp {
                let what = format!("{family} tp{tp} rank {tp_rank} dp{dp}");
                let p = part(&plan, tp_rank, &layout, 0);
                let whole = tensor_bits(&load_hf_part::<B>(&dir, &c, &p, &device).unwrap());
                let mut owners = Owners::of(&whole);
                for rank in 0..dp {
                    let (model, source) = HfPartSource::open::<B>(&dir, &c, &p, &device).unwrap();
                    let (zero, model) = Z::from_source(
                        model,
                        &source,
                        dp_rank(rank, dp),
                        device,
                        Precision::Fp32,
                        false,
                    )
                    .unwrap();
                    owners.check(&what, rank, &pieces(&zero, &model), &whole);
                }
                owners.once(&what);
            }
        }
    }
}
