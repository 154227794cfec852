//! The planner against published figures. Every number below is quoted from
//! the paper and table named beside it.
//!
//! - Memory: the ZeRO paper's per-device model-state memory (Rajbhandari et
//!   al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion
//!   Parameter Models", SC20, Table 1 and Figure 1: a 7.5B-parameter model,
//!   mixed-precision Adam, K = 12) must be reproduced within 10 %.
//! - Memory: OpenGPT-X's published model-state memory of its 13.6B model
//!   at data parallelism 80 under ZeRO-1, whole and per pipeline stage,
//!   within 10 %.
//! - Activations: Korthikanti et al. 2022 ("Reducing Activation
//!   Recomputation in Large Transformer Models", Sec. 4.2, Eq. 1-3 and
//!   Table 2) give per-layer activation bytes in closed form; the planner
//!   counts the terms one by one, and must give the closed forms at the
//!   shapes of their Table 3 models (GPT-3 175B, 530B, 1T). These are the
//!   paper's formulas at the paper's shapes, not values read off a figure.
//! - Layouts: published training configurations (model, GPU type and
//!   count, global batch, sequence length) given to the planner with the
//!   options their framework had; the published `(dp, tp, pp)` must be
//!   among the planner's three best layouts. Where it is not, the row
//!   says so (`known_miss`: the planner's rank of it and why) and the test
//!   holds it to that rank, so the disagreement stays visible.

use ferrotron_engine::metrics::device_spec;
use ferrotron_parallel::plan::activation::LayerActivations;
use ferrotron_parallel::plan::link::default_links;
use ferrotron_parallel::plan::memory::state_bytes;
use ferrotron_parallel::plan::{
    plan, ActivationModel, ModelShape, PlanInput, Precision, Recompute,
};
use ferrotron_parallel::zero::ZeroStage;

/// ZeRO paper, Table 1: GB per device for a 7.5B model at DP degree Nd:
/// (Nd, P_os, P_os+g, P_os+g+p); Nd = 1 is the 120 GB baseline of Figure 1.
const ZERO_TABLE_1: &[(usize, f64, f64, f64)] = &[
    (1, 120.0, 120.0, 120.0),
    (4, 52.5, 41.3, 30.0),
    (16, 35.6, 21.6, 7.5),
    (64, 31.4, 16.6, 1.88),
    (256, 30.4, 15.4, 0.47),
    (1024, 30.1, 15.1, 0.12),
];

#[test]
fn zero_paper_model_state_memory_within_ten_percent() {
    // 7.5e9 parameters as 75 units of 1e8 (the paper counts no padding).
    let units = vec![vec![100_000_000]; 75];
    for &(nd, os, osg, osgp) in ZERO_TABLE_1 {
        for (stage, want_gb) in [
            (ZeroStage::One, os),
            (ZeroStage::Two, osg),
            (ZeroStage::Three, osgp),
        ] {
            let m = state_bytes(&units, nd, stage, Precision::Fp16, 25 << 18);
            let got = (m.param_bytes + m.grad_bytes + m.optimizer_bytes) as f64 / 1e9;
            let err = (got / want_gb - 1.0).abs();
            println!("ZeRO Table 1, Nd={nd} {stage:?}: paper {want_gb} GB, planner {got:.3} GB");
            assert!(err < 0.10, "Nd={nd} {stage:?}: {got} GB vs {want_gb} GB");
        }
    }
}

/// OpenGPT-X's 13.6B model on JUWELS Booster (ISC23 poster, Jülich
/// Supercomputing Centre, 2023, https://x-dev.pages.jsc.fz-juelich.de/2023/05/26/isc23-poster-opengptx.html):
/// "parameters + gradients + optimizer states + ZeRO Stage 1" come to
/// 56 GB at data parallelism 80 (bf16, Megatron-DeepSpeed), and pipeline
/// parallelism 2 leaves 28 GB on each GPU. Model-state bytes depend on the
/// parameter count only, so the unpublished architecture does not matter.
#[test]
fn opengptx_13b_model_states_within_ten_percent() {
    // 13.6e9 parameters as 136 units of 1e8; one pipeline stage holds half.
    for (units, want_gb) in [(136, 56.0), (68, 28.0)] {
        let units = vec![vec![100_000_000]; units];
        let m = state_bytes(&units, 80, ZeroStage::One, Precision::Bf16, 25 << 18);
        let got = (m.param_bytes + m.grad_bytes + m.optimizer_bytes) as f64 / 1e9;
        println!("OpenGPT-X 13.6B, dp 80, ZeRO-1: poster {want_gb} GB, planner {got:.2} GB");
        assert!(
            (got / want_gb - 1.0).abs() < 0.10,
            "{got} GB vs {want_gb} GB"
        );
    }
}

#[test]
fn korthikanti_closed_forms_at_their_table_3_shapes() {
    // (name, heads a, hidden h, layers) of Korthikanti et al. 2022, Table 3;
    // s = 2048, b = 1, t = 8 as there.
    for (name, a, h, l) in [
        ("GPT-3 175B", 96, 12288, 96),
        ("530B", 128, 20480, 105),
        ("1T", 160, 25600, 128),
    ] {
        let m = ModelShape::gpt(51200, h, l, a, 2048);
        let (s, af, hf, t) = (2048.0, a as f64, h as f64, 8.0);
        let sbh = s * hf;
        let act = |sp| LayerActivations {
            seq: 2048,
            cp: 1,
            micro_batch: 1,
            tp: 8,
            sp,
            elem_bytes: 2,
            dropout: true,
            model: ActivationModel::Korthikanti,
            chunked_head: false,
        };
        let cases = [
            (
                act(false),
                Recompute::None,
                sbh * (10.0 + 24.0 / t + 5.0 * af * s / (hf * t)),
            ),
            (
                act(true),
                Recompute::None,
                sbh * (34.0 / t + 5.0 * af * s / (hf * t)),
            ),
            (act(true), Recompute::Selective, sbh * 34.0 / t),
            (act(false), Recompute::Full, 2.0 * sbh),
        ];
        for (act, rc, want) in cases {
            let got = act.layer_bytes(&m, rc);
            println!(
                "{name} sp={} {rc:?}: {:.1} MiB per layer, whole model {:.1} GiB",
                act.sp,
                got / (1 << 20) as f64,
                got * l as f64 / (1u64 << 30) as f64
            );
            assert!(
                (got / want - 1.0).abs() < 1e-9,
                "{name} {rc:?}: {got} vs {want}"
            );
        }
    }
}

/// A published run: the shape, the constraints and the layout used.
struct Published {
    source: &'static str,
    model: ModelShape,
    gpu: &'static str,
    gpus: usize,
    gpus_per_node: usize,
    global_batch: usize,
    seq: usize,
    precision: Precision,
    zero: &'static [ZeroStage],
    /// Whether the framework had sequence parallelism.
    sp: bool,
    /// Whether its optimizer kept an fp32 copy of the gradients.
    fp32_main_grads: bool,
    layout: (usize, usize, usize),
    /// Where the planner disagrees: its rank of the published layout, and why.
    known_miss: Option<(usize, &'static str)>,
}

/// Table 1 rows (billions of parameters) whose published layout the
/// planner does not rank in its top 3: its rank of it, and why. What
/// decides the row is TP's all-reduce volume per GPU, which the model
/// counts as the paper's own analysis does (Sec. 3.3.1: `l_stage x
/// 8bsh(t-1)/t` per micro-batch): at the same dp and compute per GPU,
/// TP 8 x PP 2 holds twice the layers per GPU that TP 4 x PP 4 does and
/// all-reduces 2.3 times the bytes, more than two more stages cost. GEMM
/// sizes do not decide it: the published layout's best variant
/// (micro-batch 2) runs the same per-GPU GEMMs as the planner's best
/// (micro-batch 1 at TP 4). Table 1 keeps TP at the 8 GPUs of a node
/// throughout (the paper's Takeaway #1).
const MEGATRON_MISSES: &[(f64, usize, &str)] = &[(
    39.1,
    4,
    "estimated 3.9 % slower than (32, 4, 4) with 2 interleaved chunks, the planner's best, and 0.1 % slower than the third, (16, 4, 8): TP collectives 1.59 s per step at TP 8 against 0.68 s at TP 4, more than the deeper pipeline's bubble (+0.13 s) and head stage (+0.20 s) cost",
)];

/// A row of Narayanan et al. 2021, Table 1: (billions of parameters,
/// heads, hidden, layers, t, p, GPUs, global batch).
type MegatronRow = (f64, usize, usize, usize, usize, usize, usize, usize);

fn published() -> Vec<Published> {
    // Narayanan et al. 2021, "Efficient Large-Scale Language Model Training
    // on GPU Clusters Using Megatron-LM", SC21, Table 1: GPT models of
    // vocabulary 51,200 and sequence 2048 on DGX A100 (80 GB) nodes of 8
    // GPUs, mixed precision, activation recomputation, no ZeRO (and, in
    // 2021, no sequence parallelism or selective recomputation).
    let megatron: [MegatronRow; 7] = [
        (18.4, 48, 6144, 40, 8, 1, 256, 1024),
        (39.1, 64, 8192, 48, 8, 2, 512, 1536),
        (76.1, 80, 10240, 60, 8, 4, 1024, 1792),
        (145.6, 96, 12288, 80, 8, 8, 1536, 2304),
        (310.1, 128, 16384, 96, 8, 16, 1920, 2160),
        (529.6, 128, 20480, 105, 8, 35, 2520, 2520),
        (1008.0, 160, 25600, 128, 8, 64, 3072, 3072),
    ];
    let mut runs: Vec<Published> = megatron
        .iter()
        .map(|&(billions, a, h, l, t, p, n, batch)| Published {
            source: "Narayanan et al. 2021, Table 1",
            model: ModelShape::gpt(51200, h, l, a, 2048),
            gpu: "a100-80gb",
            gpus: n,
            gpus_per_node: 8,
            global_batch: batch,
            seq: 2048,
            precision: Precision::Fp16,
            zero: &[ZeroStage::Off],
            sp: false,
            // Megatron-LM's mixed-precision optimizer: fp16 parameters and
            // gradients, fp32 master weights, their fp32 gradients and Adam's
            // moments, 20 bytes per parameter (Megatron Core user guide,
            // "Distributed Optimizer", non-distributed column).
            fp32_main_grads: true,
            layout: (n / (t * p), t, p),
            known_miss: MEGATRON_MISSES
                .iter()
                .find(|m| m.0 == billions)
                .map(|m| (m.1, m.2)),
        })
        .collect();
    // BigScience, "BLOOM: A 176B-Parameter Open-Access Multilingual
    // Language Model" (Le Scao et al. 2022), Sec. 3.4: 384 A100 80 GB on
    // 48 nodes of 8, Megatron-DeepSpeed with ZeRO stage 1, TP 4, PP 12,
    // DP 8, bf16, global batch 2048 of 2048 tokens; 70 layers, hidden
    // 14336, 112 heads, vocabulary 250,880 (padded).
    runs.push(Published {
        source: "Le Scao et al. 2022 (BLOOM), Sec. 3.4",
        model: ModelShape {
            vocab: 250880,
            hidden: 14336,
            layers: 70,
            heads: 112,
            kv_heads: 112,
            ffn: 4 * 14336,
            learned_positions: None,
            layer_norm: true,
            bias: true,
            gated_mlp: false,
            tied_head: true,
            embed_norm: true,
        },
        gpu: "a100-80gb",
        gpus: 384,
        gpus_per_node: 8,
        global_batch: 2048,
        seq: 2048,
        precision: Precision::Bf16,
        zero: &[ZeroStage::Off, ZeroStage::One],
        sp: false,
        // DeepSpeed's ZeRO-1 optimizer: counted as the ZeRO paper does.
        fp32_main_grads: false,
        layout: (8, 4, 12),
        known_miss: None,
    });
    runs
}

#[test]
fn published_layouts_rank_among_the_top_three() {
    let mut misses = Vec::new();
    for run in published() {
        let (intra, inter) = default_links(run.gpu).unwrap();
        let input = PlanInput {
            model: run.model.clone(),
            gpus: run.gpus,
            gpus_per_node: run.gpus_per_node,
            device: device_spec(run.gpu).unwrap(),
            intra,
            inter,
            global_batch: run.global_batch,
            seq: run.seq,
            precision: run.precision,
            efficiency: 0.5,
            reserve_bytes: 2.0 * (1u64 << 30) as f64,
            bucket_mb: 25.0,
            dropout: true,
            fp32_main_grads: run.fp32_main_grads,
            max_micro_batch: 16,
            zero_stages: run.zero.to_vec(),
            recompute: vec![Recompute::Full],
            sequence_parallel: run.sp,
            // The published layouts were chosen among layouts without
            // context parallelism (2021-2022, before Megatron-Core had
            // it); with it the planner prefers cp2 for three of them by
            // 1.5-4 % (it replaces TP all-reduces and shortens the
            // bubble; shorter attention blocks' lower kernel efficiency
            // is not modelled).
            context_parallel: false,
            activations: ActivationModel::Korthikanti,
            chunked_head: true,
            // Priced as they always were here: nothing overlapped.
            overlap_grad_reduce: false,
            zero3_prefetch: 1,
        };
        let p = plan(&input);
        let layouts = p.layouts();
        let rank = layouts.iter().position(|l| *l == run.layout);
        let best = p.feasible[0].time.step_s;
        let published_best = p
            .feasible
            .iter()
            .find(|e| (e.choice.dp, e.choice.tp, e.choice.pp) == run.layout)
            .map(|e| (e.label.clone(), e.time.step_s));
        println!(
            "{} ({:.1} B on {} GPUs): published dp/tp/pp {:?}, planner's best {:?}, published ranks {} ({:?}, {:+.1} % step time against the best, {})",
            run.source,
            run.model.num_params() as f64 / 1e9,
            run.gpus,
            run.layout,
            &layouts[..layouts.len().min(3)],
            rank.map_or("nowhere (does not fit)".to_string(), |r| (r + 1).to_string()),
            published_best.as_ref().map(|b| b.0.as_str()),
            published_best.as_ref().map_or(f64::NAN, |b| 100.0 * (b.1 / best - 1.0)),
            p.feasible[0].label
        );
        let allowed = run.known_miss.map_or(3, |(r, _)| r);
        if let Some((_, why)) = run.known_miss {
            println!("  known disagreement: {why}");
        }
        if rank.is_none_or(|r| r >= allowed) {
            misses.push(format!("{} {:?}", run.source, run.layout));
        }
    }
    assert!(misses.is_empty(), "not in the top 3: {misses:?}");
}
