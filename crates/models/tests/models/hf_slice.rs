//! `--hf-dir` under a layout reads only a rank's part (`hf::load_hf_part`):
//! on the GPT-2, Llama and BLOOM fixtures, under tp2, pp2 and tp2 x pp2,
//! every rank's tensors are the whole load's blocks (the fused `c_attn` /
//! `query_key_value` split into q, k, v, then cut), its other stages'
//! tensors placeholders, and the blocks joined over the TP ranks are the
//! whole load bit for bit; and a tp2 rank's read allocates about half of
//! what the one-rank read of the same files does.

#![cfg(feature = "flex")]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use burn::backend::Flex;
use burn::tensor::TensorData;
use ferrotron_engine::params::named_tensors;
use ferrotron_models::hf::{load_hf_dir, load_hf_part, save_hf_dir, ExportOptions};
use ferrotron_models::tensor_parallel::shard_plan;
use ferrotron_models::{Decoder, DecoderConfig, ModelPart};
use ferrotron_parallel::pipeline::{PipelineConfig, StageLayout};
use ferrotron_parallel::tensor::{ShardPlan, TpGroup, DEFAULT_VOCAB_DIVISIBLE_BY};

use crate::common::rank_of::RankOf;
use crate::common::thread_heap::peak_during;
use crate::sharded_init::{bits, check_gathered, held, unit_of};

type B = Flex;

pub(crate) fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/hf")
        .join(name)
        .join("model")
}

/// Rank `rank`'s part of `c` under `plan` on `stage` of `layout`.
pub(crate) fn part(plan: &ShardPlan, rank: usize, layout: &StageLayout, stage: usize) -> ModelPart {
    let group = TpGroup::new(Arc::new(RankOf {
        rank,
        size: plan.tp(),
    }));
    ModelPart::tensor_parallel(plan.clone(), group)
        .unwrap()
        .on_stage(layout, stage)
}

/// Checks every rank's part of `dir` under `tp` x `pp` against `whole`.
fn check_layout(
    what: &str,
    dir: &Path,
    c: &DecoderConfig,
    whole: &BTreeMap<String, TensorData>,
    (tp, pp): (usize, usize),
) {
    let what = format!("{what} tp{tp} pp{pp}");
    let plan = shard_plan(c, tp, DEFAULT_VOCAB_DIVISIBLE_BY).unwrap();
    let layout = PipelineConfig::default().layout(c.n_layers, pp).unwrap();
    let device = Default::default();
    let mut parts = Vec::new();
    for stage in 0..pp {
        for rank in 0..tp {
            let p = part(&plan, rank, &layout, stage);
            let model = load_hf_part::<B>(dir, c, &p, &device).unwrap();
            let tensors: BTreeMap<String, TensorData> = named_tensors(&model).into_iter().collect();
            assert_eq!(tensors.len(), whole.len(), "{what}: parameter count");
            for (name, data) in &tensors {
                let at = format!("{what}: {name} on ({stage}, {rank})");
                if held(name, &layout, stage, c.tied_head) {
                    let want = plan.shard(name, whole[name].clone(), rank).unwrap();
                    assert_eq!(data.shape, want.shape, "{at}");
                    assert!(bits(data) == bits(&want), "{at}");
                } else {
                    assert_eq!(data.num_elements(), 1, "{at}: a placeholder");
                }
            }
            parts.push(((stage, rank), tensors));
        }
    }
    for (name, want) in whole {
        let stage = layout.owner(unit_of(name));
        let blocks: Vec<&TensorData> = parts
            .iter()
            .filter(|((s, _), _)| *s == stage)
            .map(|(_, p)| &p[name])
            .collect();
        let block = plan.block(name, &want.shape, 0).unwrap();
        check_gathered(&format!("{what}: {name}"), want, &blocks, block);
    }
}

#[test]
fn every_layouts_parts_of_an_hf_dir_join_into_the_whole_load() {
    for family in ["gpt2", "llama", "bloom"] {
        let dir = fixture(family);
        let whole = load_hf_dir(&dir).unwrap();
        for layout in [(1, 1), (2, 1), (1, 2), (2, 2)] {
            check_layout(family, &dir, &whole.config, &whole.tensors, layout);
        }
    }
}

#[test]
fn a_tp2_rank_reads_about_half_of_an_hf_dir() {
    // Written as a GPT-2 directory.
    let c = crate::sharded_init::parameters_dominate();
    let device = Default::default();
    let dir = std::env::temp_dir().join(format!("ferrotron-hf-slice-{}", std::process::id()));
    let tensors = named_tensors(&Decoder::<B>::new(&c, 7, &device).unwrap());
    save_hf_dir(&dir, &c, &tensors, None, &ExportOptions::default()).unwrap();
    let model_bytes = 4 * tensors.iter().map(|(_, d)| d.num_elements()).sum::<usize>();
    drop(tensors);
    let one = ModelPart::whole();
    let (whole, whole_peak) = peak_during(|| load_hf_part::<B>(&dir, &c, &one, &device).unwrap());
    drop(whole);
    let plan = shard_plan(&c, 2, DEFAULT_VOCAB_DIVISIBLE_BY).unwrap();
    let layout = PipelineConfig::default().layout(c.n_layers, 1).unwrap();
    let tp2 = part(&plan, 0, &layout, 0);
    let (half, half_peak) = peak_during(|| load_hf_part::<B>(&dir, &c, &tp2, &device).unwrap());
    drop(half);
    let (_, read_all_peak) = peak_during(|| load_hf_dir(&dir).unwrap());
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        whole_peak >= model_bytes,
        "the count sees the model: {whole_peak} < {model_bytes}"
    );
    assert!(
        (half_peak as f64) <= 0.6 * whole_peak as f64,
        "tp2 rank 0 peaked at {half_peak} bytes reading, one rank at {whole_peak}"
    );
    assert!(
        read_all_peak >= whole_peak,
        "reading every tensor whole ({read_all_peak}) peaks below the sliced read ({whole_peak})"
    );
}
