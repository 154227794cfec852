//! The memory pre-check's estimate against hand-computed bytes, and the
//! check itself: a model far too big for this host is refused naming
//! `--no-memory-check`, which lets the same job validate.

use ferrotron_engine::backend::BackendKind;
use ferrotron_engine::metrics::available_memory_bytes;
use ferrotron_job::memory::job_memory;
use ferrotron_job::{JobConfig, World};
use ferrotron_models::presets::preset;
use ferrotron_models::{DecoderConfig, MlpKind, NormKind, Position};
use ferrotron_parallel::mesh::Mesh;
use ferrotron_parallel::plan::MemoryEstimate;
use ferrotron_parallel::recompute::Recompute;
use ferrotron_parallel::zero::ZeroStage;
use ferrotron_test_support::skip::skip;

/// A GPT-2-style model small enough to count by hand: vocabulary 64,
/// width 8, 2 blocks of 2 heads, MLP 32, 16 learned positions, LayerNorm,
/// biases, GELU, tied head.
fn tiny() -> DecoderConfig {
    let mut m = preset("gpt-mini").unwrap();
    (m.vocab_size, m.hidden_size, m.n_layers) = (64, 8, 2);
    (m.n_heads, m.n_kv_heads, m.ffn_size, m.max_seq_len) = (2, 2, 32, 16);
    assert_eq!(m.position, Position::Learned);
    assert_eq!((m.norm, m.mlp), (NormKind::LayerNorm, MlpKind::GeluTanh));
    assert!(m.bias && m.tied_head && !m.embed_norm);
    m
}

/// Bytes per rank of `tiny()` at micro-batch 2 x 16 tokens, buckets of
/// 1024 f32 values, no vocabulary padding beyond tp.
fn bytes(dp: usize, tp: usize, pp: usize, zero: ZeroStage, grad_accum: usize) -> (f64, String) {
    let mesh = Mesh::new(Some(dp), tp, pp, dp * tp * pp).unwrap();
    bytes_on(mesh, zero, grad_accum)
}

/// [`bytes`] on `mesh`.
fn bytes_on(mesh: Mesh, zero: ZeroStage, grad_accum: usize) -> (f64, String) {
    bytes_with(mesh, zero, grad_accum, |_| {})
}

/// [`bytes_on`] with the job changed by `change` last.
fn bytes_with(
    mesh: Mesh,
    zero: ZeroStage,
    grad_accum: usize,
    change: impl FnOnce(&mut JobConfig),
) -> (f64, String) {
    let m = estimate_with(mesh, zero, grad_accum, change);
    (m.total(), m.stage.to_string())
}

/// The estimate of [`bytes_with`].
fn estimate_with(
    mesh: Mesh,
    zero: ZeroStage,
    grad_accum: usize,
    change: impl FnOnce(&mut JobConfig),
) -> MemoryEstimate {
    let mut c = JobConfig::default();
    c.schedule.micro_batch = 2;
    c.schedule.seq_len = 16;
    c.schedule.grad_accum = grad_accum;
    c.parallelism.bucket_mb = 1.0 / 256.0;
    c.parallelism.make_vocab_size_divisible_by = 1;
    c.parallelism.zero = zero;
    c.parallelism.cp = mesh.cp;
    let recompute = if zero == ZeroStage::Three {
        Recompute::Full
    } else {
        Recompute::None
    };
    change(&mut c);
    job_memory(&tiny(), &c, &mesh, recompute, BackendKind::Flex).unwrap()
}

// Counted by hand (f32; `T` = 32 tokens per micro-batch). Parameters:
// embedding 64x8 + 16x8 = 640, a block 16 + 4 x (64 + 8) + 16 + (256 + 32)
// + (256 + 8) = 872, final norm 16: 2400. A block's activations on the CPU
// path (`ferrotron-cpu`): 4 bytes x (two norms 2(T h + 2T) + the two
// projection inputs 2 T h + q, k, v, attention output 4 T h + GELU 2 T f)
// = 4 x (1152 + 3072 / tp); the output layer 4 x (2 T h + 2T) and, at tp 1
// (the chunked head: its f32 weight gradient), 4 h V = 2048, or under TP the
// logits and row sums 4 T V / tp + 4 T. Buffers: two buckets of 1024
// values, 8192 bytes.

#[test]
fn estimate_tp1_counts_state_activations_and_buckets() {
    // 16 x 2400 + 2 x 16896 + (2304 + 2048) + 8192
    assert_eq!(bytes(1, 1, 1, ZeroStage::Off, 1), (84736.0, "only".into()));
}

#[test]
fn estimate_tp2_divides_the_split_tensors_and_activations() {
    // A block on one of 2 ranks: 16 + 3 x 36 + 40 + 16 + 144 + 136 = 460,
    // embedding 32x8 + 128 = 384: 1320 parameters; block activations
    // 4 x (1152 + 1536) = 10752, output 2304 + 4096 + 128 = 6528.
    let want = 16.0 * 1320.0 + 2.0 * 10752.0 + 6528.0 + 8192.0;
    assert_eq!(bytes(1, 2, 1, ZeroStage::Off, 1), (want, "only".into()));
}

#[test]
fn estimate_pp2_counts_the_fuller_stage_with_its_micro_batches_in_flight() {
    // First stage: embedding and block 0 held (1512 values), 18
    // placeholders of the other stage's tensors (one value each): 4 x 1530
    // + 12 x 1512; 1F1B keeps 2 micro-batches of its block in flight.
    let first = 4.0 * 1530.0 + 12.0 * 1512.0 + 2.0 * 16896.0 + 8192.0;
    // The last (block 1, final norm, the tied embedding's copy: 1400
    // values, 17 placeholders) is smaller: one micro-batch and the output.
    let last = 4.0 * 1417.0 + 12.0 * 1400.0 + 16896.0 + 4352.0 + 8192.0;
    assert!(last < first);
    assert_eq!(bytes(1, 1, 2, ZeroStage::Off, 2), (first, "first".into()));
}

#[test]
fn estimate_zero2_and_3_with_overlap_hold_a_shard_of_results_in_flight() {
    // A second micro-batch adds one shard of reduce-scatter results (the
    // size of the rank's accumulated gradients) under overlap, and nothing
    // without it.
    let mesh = || Mesh::new(Some(2), 1, 1, 2).unwrap();
    for zero in [ZeroStage::Two, ZeroStage::Three] {
        let no_overlap = |c: &mut JobConfig| c.parallelism.overlap_grad_reduce = false;
        let one = estimate_with(mesh(), zero, 1, |_| {});
        let two = estimate_with(mesh(), zero, 2, |_| {});
        let (one_off, two_off) = (
            estimate_with(mesh(), zero, 1, no_overlap),
            estimate_with(mesh(), zero, 2, no_overlap),
        );
        assert_eq!(two_off.total(), one_off.total(), "{zero}");
        assert!(two.state.grad_bytes > 0);
        assert_eq!(
            two.total() - one.total(),
            two.state.grad_bytes as f64,
            "{zero}"
        );
    }
}

#[test]
fn estimate_gpipe_holds_every_micro_batch_on_every_stage() {
    use ferrotron_job::config::PpSchedule;
    // As above with 4 micro-batches: 1F1B still holds 2 on the first
    // stage; GPipe holds all 4 on both, the last stage's output too, which
    // makes the last stage the fuller one.
    let one_f_one_b = 4.0 * 1530.0 + 12.0 * 1512.0 + 2.0 * 16896.0 + 8192.0;
    assert_eq!(
        bytes(1, 1, 2, ZeroStage::Off, 4),
        (one_f_one_b, "first".into())
    );
    let mesh = Mesh::new(Some(1), 1, 2, 2).unwrap();
    let gpipe = bytes_with(mesh, ZeroStage::Off, 4, |c| {
        c.parallelism.pp_schedule = PpSchedule::Gpipe;
    });
    let last = 4.0 * 1417.0 + 12.0 * 1400.0 + 4.0 * (16896.0 + 4352.0) + 8192.0;
    assert_eq!(gpipe, (last, "last".into()));
}

#[test]
fn estimate_zero3_shards_every_class_over_dp() {
    // Rank 0's chunk of each unit over dp 2: 320 + 436 + 436 + 8 = 1200
    // values, plus one placeholder value for each of the 36 tensors;
    // full recomputation keeps each block's input (4 T h = 1024 bytes) and
    // rebuilds one block (16896). The buffers: the embedding and the final
    // norm stay gathered with their gradients, 8 x (640 + 16); overlap is
    // on by default with --zero3-prefetch 1, so two blocks are gathered at
    // once, with one block's gradients: 4 x 2 x 872 + 4 x 872.
    let state = 4.0 * (1200.0 + 36.0) + 4.0 * 1200.0 + 8.0 * 1200.0;
    let buffers = 8.0 * 656.0 + 12.0 * 872.0;
    let want = state + 2.0 * 1024.0 + 4352.0 + 16896.0 + buffers;
    assert_eq!(bytes(2, 1, 1, ZeroStage::Three, 1), (want, "only".into()));
}

#[test]
fn estimate_zero3_counts_the_blocks_its_prefetch_gathers() {
    // Each block more gathered ahead adds its parameters, 4 x 872 bytes;
    // without overlap nothing is gathered ahead, whatever the depth.
    let mesh = || Mesh::new(Some(2), 1, 1, 2).unwrap();
    let with = |overlap: bool, depth: Option<usize>| {
        bytes_with(mesh(), ZeroStage::Three, 1, |c| {
            c.parallelism.overlap_grad_reduce = overlap;
            c.parallelism.zero3_prefetch = depth;
        })
        .0
    };
    let one = with(true, Some(1));
    assert_eq!(with(true, None), one, "the default is one block ahead");
    assert_eq!(with(true, Some(0)), one - 4.0 * 872.0);
    assert_eq!(with(true, Some(3)), one + 2.0 * 4.0 * 872.0);
    assert_eq!(with(false, Some(0)), one - 4.0 * 872.0);
}

#[test]
fn estimate_cp2_counts_half_the_tokens_and_shards_over_dp_x_cp() {
    // A ring of 2 (dp 1): ZeRO-3 shards over DP x CP, so the state is
    // dp 2's above. Each rank holds 8 of the 16 tokens: T = 16 per
    // micro-batch, so a block's input is 4 T h = 512 bytes; the rebuilt
    // block 4 x (2(T h + 2T) + 2 T h + 4 T h + 2 T f) = 8448 plus the ring
    // node's f32 output and log-sum-exp, 4 T (h + heads) = 640; the output
    // layer 4 x (2 T h + 2T) + 4 h V = 3200. The trainer overlaps
    // nothing beside a ring, so one block is gathered at a time.
    let state = 4.0 * (1200.0 + 36.0) + 4.0 * 1200.0 + 8.0 * 1200.0;
    let buffers = 8.0 * 656.0 + 8.0 * 872.0;
    let want = state + 2.0 * 512.0 + 3200.0 + (8448.0 + 640.0) + buffers;
    let mesh = Mesh::with_cp(Some(1), 1, 2, 1, 2).unwrap();
    assert_eq!(bytes_on(mesh, ZeroStage::Three, 1), (want, "only".into()));
}

/// A Llama mini at a length whose activations on one rank need twice
/// this host's available memory: refused without context parallelism,
/// accepted on a ring of 8 ranks (each holding an eighth of every
/// sequence; one rank per host, as no launcher says otherwise).
#[test]
fn a_job_that_fits_only_because_of_cp_is_not_refused() {
    let Some(have) = available_memory_bytes() else {
        skip("no MemAvailable in /proc/meminfo: the pre-check is not done here");
        return;
    };
    let out = std::env::temp_dir().join(format!("ferrotron-memory-cp-{}", std::process::id()));
    let job = |seq: usize, cp: usize| {
        let mut c = JobConfig::default();
        c.model.name = "llama-mini".into();
        c.model.max_seq_len = Some(seq);
        c.schedule.seq_len = seq;
        c.parallelism.cp = cp;
        c.checkpoint.out = Some(out.clone());
        c
    };
    let world = |cp: usize| World {
        world_size: cp,
        ..World::SINGLE
    };
    // One rank's need, by the estimate the check makes.
    let need = |seq: usize, cp: usize| {
        let mut c = job(seq, cp);
        c.parallelism.memory_check = false;
        let v = c.validate(&world(cp)).unwrap();
        let m = job_memory(
            v.model(),
            v.config(),
            v.mesh(),
            Recompute::None,
            v.backend(),
        );
        m.unwrap().total()
    };
    // Steps of a quarter (multiples of 64 tokens), so that the first length
    // over twice the memory is not near four times it: a ring of 8 then
    // needs about a quarter of the memory, with room for what is not split.
    let mut seq = 1 << 12;
    while need(seq, 1) <= 2.0 * have as f64 {
        seq = seq * 5 / 4 / 64 * 64;
    }
    assert!(need(seq, 8) < have as f64 / 2.0, "cp 8 at seq {seq}");
    let Err(problems) = job(seq, 1).validate(&world(1)) else {
        panic!("seq {seq} on one rank passed the memory pre-check");
    };
    let lines: Vec<String> = problems.iter().map(ToString::to_string).collect();
    assert_eq!(lines.len(), 1, "{lines:#?}");
    assert!(
        lines[0].contains("memory: the job needs about"),
        "{}",
        lines[0]
    );
    assert!(lines[0].contains("--cp (now 1)"), "{}", lines[0]);
    let ring = job(seq, 8).validate(&world(8));
    assert!(ring.is_ok(), "seq {seq} on a ring of 8: {:?}", ring.err());
    assert!(!out.exists());
}

/// llama3-70b on this host (1.1 TB of training state alone) with an
/// unwritten run directory under the system's temporary directory.
fn too_big(check: bool) -> JobConfig {
    let out = std::env::temp_dir().join(format!("ferrotron-memory-{}", std::process::id()));
    let mut c = JobConfig::default();
    c.model.name = "llama3-70b".into();
    c.checkpoint.out = Some(out);
    c.parallelism.memory_check = check;
    c
}

#[test]
fn a_model_too_big_for_the_host_is_refused_unless_the_check_is_off() {
    let Err(problems) = too_big(true).validate(&World::SINGLE) else {
        panic!("llama3-70b passed the memory pre-check");
    };
    let lines: Vec<String> = problems.iter().map(ToString::to_string).collect();
    assert_eq!(lines.len(), 1, "{lines:#?}");
    for needle in [
        "memory: the job needs about",
        "GiB per rank",
        "available memory (MemAvailable)",
        "raise --tp",
        "--recompute full",
        "--no-memory-check",
    ] {
        assert!(lines[0].contains(needle), "'{}' lacks '{needle}'", lines[0]);
    }
    let job = too_big(false).validate(&World::SINGLE);
    assert!(job.is_ok(), "{:?}", job.err());
    assert!(!too_big(false).checkpoint.out.unwrap().exists());
}
