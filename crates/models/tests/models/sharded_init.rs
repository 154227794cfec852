//! Layout-independent initialisation: every rank's part of a model, built
//! alone (`Decoder::new_part`), is the same slice of the one-rank model bit
//! for bit, for every family and every layout the equivalence tests run
//! (tp2, pp2, tp2 x pp2, with and without sequence parallelism, an
//! interleaved pipeline, a padded vocabulary); the values are the
//! counter-based stream of each parameter's name; and a TP rank's build
//! holds about its share of the model, never the whole.

use std::collections::BTreeMap;
use std::sync::Arc;

use burn::backend::Flex;
use burn::tensor::TensorData;
use ferrotron_engine::lm::LmUnit;
use ferrotron_engine::params::named_tensors;
use ferrotron_models::init::counter::{name_key, NormalStream};
use ferrotron_models::presets::preset;
use ferrotron_models::tensor_parallel::shard_plan;
use ferrotron_models::{Decoder, DecoderConfig, ModelPart};
use ferrotron_parallel::pipeline::{PipelineConfig, ScheduleKind, StageLayout};
use ferrotron_parallel::tensor::{ShardPlan, TpGroup, DEFAULT_VOCAB_DIVISIBLE_BY};

use crate::common::rank_of::RankOf;
use crate::common::thread_heap::peak_during;

type B = Flex;

const SEED: u64 = 20_261_124;

/// A layout of one model: TP degree, sequence parallelism, pipeline
/// stages and chunks per stage (interleaved when more than one).
#[derive(Clone, Copy, Debug)]
struct Layout {
    tp: usize,
    sp: bool,
    pp: usize,
    chunks: usize,
}

const LAYOUTS: [Layout; 7] = [
    Layout {
        tp: 1,
        sp: false,
        pp: 1,
        chunks: 1,
    },
    Layout {
        tp: 2,
        sp: false,
        pp: 1,
        chunks: 1,
    },
    Layout {
        tp: 2,
        sp: true,
        pp: 1,
        chunks: 1,
    },
    Layout {
        tp: 1,
        sp: false,
        pp: 2,
        chunks: 1,
    },
    Layout {
        tp: 1,
        sp: false,
        pp: 2,
        chunks: 2,
    },
    Layout {
        tp: 2,
        sp: false,
        pp: 2,
        chunks: 1,
    },
    Layout {
        tp: 2,
        sp: true,
        pp: 2,
        chunks: 1,
    },
];

/// The unit a parameter belongs to, from its name.
pub(crate) fn unit_of(name: &str) -> LmUnit {
    match name.strip_prefix("layers.") {
        Some(rest) => LmUnit::Block(rest.split('.').next().unwrap().parse().unwrap()),
        None if name == "head" || name.starts_with("final_norm.") => LmUnit::Head,
        None => LmUnit::Embedding,
    }
}

/// Whether `stage` of `layout` holds parameter `name` (its unit's owner,
/// and the last stage's copy of a tied embedding).
pub(crate) fn held(name: &str, layout: &StageLayout, stage: usize, tied: bool) -> bool {
    let last = stage + 1 == layout.stages();
    layout.owner(unit_of(name)) == stage || (tied && last && name == "embed")
}

pub(crate) fn bits(data: &TensorData) -> Vec<u32> {
    data.to_vec::<f32>()
        .unwrap()
        .into_iter()
        .map(f32::to_bits)
        .collect()
}

/// The blocks of every TP rank, `[rank][...]` each of `block_shape`,
/// joined along `dim`: the padded whole tensor.
fn join(blocks: &[Vec<f32>], block_shape: &[usize], dim: usize) -> Vec<f32> {
    let outer: usize = block_shape[..dim].iter().product();
    let run: usize = block_shape[dim..].iter().product();
    let mut out = Vec::new();
    for o in 0..outer {
        for b in blocks {
            out.extend_from_slice(&b[o * run..(o + 1) * run]);
        }
    }
    out
}

/// Every rank's part of the model `c` under `l`, by (stage, TP rank).
fn parts(
    c: &DecoderConfig,
    l: Layout,
    plan: &ShardPlan,
    layout: &StageLayout,
) -> Vec<((usize, usize), BTreeMap<String, TensorData>)> {
    let device = Default::default();
    let mut out = Vec::new();
    for stage in 0..l.pp {
        for rank in 0..l.tp {
            let group = TpGroup::new(Arc::new(RankOf { rank, size: l.tp }));
            let part = ModelPart::tensor_parallel(plan.clone(), group)
                .unwrap()
                .on_stage(layout, stage);
            let model = Decoder::<B>::new_part(c, SEED, &device, &part).unwrap();
            assert_eq!(model.tp_degree(), l.tp);
            out.push(((stage, rank), named_tensors(&model).into_iter().collect()));
        }
    }
    out
}

/// Checks every rank's part of `c` under `l` against the one-rank model
/// `whole`: each held tensor is the whole's block (vocabulary padding
/// zero), each other one a one-element placeholder, and the blocks of the
/// owning stage, joined over the TP ranks, are the whole tensor bit for bit.
fn check_layout(family: &str, c: &DecoderConfig, whole: &BTreeMap<String, TensorData>, l: Layout) {
    let what = format!("{family} {l:?}");
    let plan = shard_plan(c, l.tp, DEFAULT_VOCAB_DIVISIBLE_BY)
        .unwrap()
        .with_sequence_parallel(l.sp);
    let schedule = if l.chunks > 1 {
        ScheduleKind::Interleaved
    } else {
        ScheduleKind::OneFOneB
    };
    let pipeline = PipelineConfig {
        schedule,
        chunks: l.chunks,
        layers: None,
    };
    let layout = pipeline.layout(c.n_layers, l.pp).unwrap();
    let parts = parts(c, l, &plan, &layout);
    for ((stage, rank), part) in &parts {
        assert_eq!(part.len(), whole.len(), "{what}: parameter count");
        for (name, data) in part {
            if held(name, &layout, *stage, c.tied_head) {
                let want = plan.shard(name, whole[name].clone(), *rank).unwrap();
                assert_eq!(
                    data.shape, want.shape,
                    "{what}: {name} on ({stage}, {rank})"
                );
                assert!(
                    bits(data) == bits(&want),
                    "{what}: {name} on ({stage}, {rank})"
                );
            } else {
                assert_eq!(
                    data.num_elements(),
                    1,
                    "{what}: {name} on ({stage}, {rank})"
                );
            }
        }
    }
    for (name, want) in whole {
        let stage = layout.owner(unit_of(name));
        let blocks: Vec<&TensorData> = parts
            .iter()
            .filter(|((s, _), _)| *s == stage)
            .map(|(_, p)| &p[name])
            .collect();
        check_gathered(
            &format!("{what}: {name}"),
            want,
            &blocks,
            plan.block(name, &want.shape, 0).unwrap(),
        );
    }
}

/// Checks that the TP ranks' `blocks` of a tensor, cut along `block`'s
/// dimension (`None`: replicated), joined are `want` bit for bit, with
/// zeros in the vocabulary padding.
pub(crate) fn check_gathered(
    what: &str,
    want: &TensorData,
    blocks: &[&TensorData],
    block: Option<(usize, std::ops::Range<usize>)>,
) {
    let Some((dim, _)) = block else {
        assert!(
            blocks.iter().all(|b| bits(b) == bits(want)),
            "{what}: replicated"
        );
        return;
    };
    let block_shape = blocks[0].shape.to_vec();
    let values: Vec<Vec<f32>> = blocks.iter().map(|b| b.to_vec().unwrap()).collect();
    let joined = join(&values, &block_shape, dim);
    let want_values = want.to_vec::<f32>().unwrap();
    let real = want.shape[dim];
    let inner: usize = want.shape[dim + 1..].iter().product();
    let padded = block_shape[dim] * blocks.len();
    for (row, want_row) in joined
        .chunks(padded * inner)
        .zip(want_values.chunks(real * inner))
    {
        let (kept, padding) = row.split_at(real * inner);
        let kept_bits = kept.iter().map(|v| v.to_bits());
        assert!(
            kept_bits.eq(want_row.iter().map(|v| v.to_bits())),
            "{what}: gathered"
        );
        assert!(padding.iter().all(|&v| v == 0.0), "{what}: padding");
    }
}

/// The mini presets, and GPT-2's with a vocabulary that tp2 pads (1000
/// tokens: rank 1's block of 128-multiples is part padding).
fn families() -> Vec<(String, DecoderConfig)> {
    let mut out: Vec<(String, DecoderConfig)> = ["gpt-mini", "llama-mini", "bloom-mini"]
        .iter()
        .map(|f| (f.to_string(), preset(f).unwrap()))
        .collect();
    let mut padded = preset("gpt-mini").unwrap();
    padded.vocab_size = 1000;
    out.push(("gpt-mini, vocab 1000".into(), padded));
    out
}

#[test]
fn every_layout_builds_slices_of_the_one_rank_model_bit_for_bit() {
    let device = Default::default();
    for (family, c) in families() {
        let whole = Decoder::<B>::new(&c, SEED, &device).unwrap();
        let whole: BTreeMap<String, TensorData> = named_tensors(&whole).into_iter().collect();
        for l in LAYOUTS {
            check_layout(&family, &c, &whole, l);
        }
    }
}

#[test]
fn a_part_built_alone_equals_the_whole_model_cut_by_shard() {
    let device = Default::default();
    let c = preset("llama-mini").unwrap();
    let plan = shard_plan(&c, 2, DEFAULT_VOCAB_DIVISIBLE_BY)
        .unwrap()
        .with_sequence_parallel(true);
    for rank in 0..2 {
        let group = || TpGroup::new(Arc::new(RankOf { rank, size: 2 }));
        let cut = Decoder::<B>::new(&c, SEED, &device)
            .unwrap()
            .shard(&plan, group())
            .unwrap();
        let part = ModelPart::tensor_parallel(plan.clone(), group()).unwrap();
        let alone = Decoder::<B>::new_part(&c, SEED, &device, &part).unwrap();
        let (a, b) = (named_tensors(&cut), named_tensors(&alone));
        assert_eq!(a.len(), b.len());
        for ((na, da), (nb, db)) in a.iter().zip(&b) {
            assert_eq!(na, nb);
            assert_eq!(da.shape, db.shape, "{na}");
            assert!(bits(da) == bits(db), "{na} on rank {rank}");
        }
    }
}

#[test]
fn initial_values_are_the_counter_stream_of_each_parameter_name() {
    let device = Default::default();
    for (family, c) in families() {
        let model = Decoder::<B>::new(&c, SEED, &device).unwrap();
        let out_std = c.init_std / (2.0 * c.n_layers as f64).sqrt();
        for (name, data) in named_tensors(&model) {
            let got = data.to_vec::<f32>().unwrap();
            let want: Vec<f32> = if name.ends_with("norm.weight") {
                vec![1.0; got.len()]
            } else if name.ends_with(".bias") {
                vec![0.0; got.len()]
            } else {
                let std = if name.ends_with("attn.o.weight") || name.ends_with("mlp.down.weight") {
                    out_std
                } else {
                    c.init_std
                };
                let s = NormalStream::new(SEED, name_key(&name));
                (0..got.len() as u64)
                    .map(|i| (s.at(i) * std) as f32)
                    .collect()
            };
            assert!(
                got.iter()
                    .map(|v| v.to_bits())
                    .eq(want.iter().map(|v| v.to_bits())),
                "{family}: {name}"
            );
        }
    }
}

/// A GPT whose parameters dominate the heap of building or loading it: a
/// 16384-token embedding of width 256 (16 MiB) and two blocks (6 MiB).
pub(crate) fn parameters_dominate() -> DecoderConfig {
    let mut c = preset("gpt-mini").unwrap();
    (c.vocab_size, c.hidden_size, c.n_layers) = (16384, 256, 2);
    (c.n_heads, c.n_kv_heads, c.ffn_size, c.max_seq_len) = (4, 4, 1024, 64);
    c
}

#[test]
fn a_tp2_rank_builds_its_share_of_the_heap_not_the_whole_model() {
    let c = parameters_dominate();
    let device = Default::default();
    let (whole, whole_peak) = peak_during(|| Decoder::<B>::new(&c, SEED, &device).unwrap());
    let whole_bytes = 4 * named_tensors(&whole)
        .iter()
        .map(|(_, d)| d.num_elements())
        .sum::<usize>();
    drop(whole);
    let plan = shard_plan(&c, 2, DEFAULT_VOCAB_DIVISIBLE_BY).unwrap();
    let group = || TpGroup::new(Arc::new(RankOf { rank: 0, size: 2 }));
    let part = ModelPart::tensor_parallel(plan.clone(), group()).unwrap();
    let (alone, part_peak) =
        peak_during(|| Decoder::<B>::new_part(&c, SEED, &device, &part).unwrap());
    drop(alone);
    // The old way, the whole model then cut, holds the whole model.
    let (cut, cut_peak) = peak_during(|| {
        Decoder::<B>::new(&c, SEED, &device)
            .unwrap()
            .shard(&plan, group())
            .unwrap()
    });
    drop(cut);
    assert!(
        whole_peak >= whole_bytes,
        "the count sees the model: {whole_peak} < {whole_bytes}"
    );
    assert!(
        cut_peak >= whole_bytes,
        "whole then cut: {cut_peak} < {whole_bytes}"
    );
    assert!(
        (part_peak as f64) <= 0.6 * whole_peak as f64,
        "tp2 rank 0 peaked at {part_peak} bytes building, the whole model at {whole_peak}"
    );
}
