//! FlashAttention kernels (the row, the tiled and the fragment forward, the
//! FlashAttention-2 backward; f32, f16 and bf16 storage) against a naive
//! host reference, on the wgpu runtime (lavapipe on machines without a
//! GPU; CUDA with the `test-cuda` feature). Each case runs the row forward
//! kernel and the one the launcher chooses (the tile boundary cases: the
//! tiled kernel at every tile size that fits the device, and the fragment
//! kernel on plain units and on the matrix units where they run) and the
//! row and the chosen backward (the tiled one where it fits) on the output of the kernel the launcher chooses
//! (`attention_support::check`); `attention_backward.rs` covers the tiled
//! backward on its own. The forward checks on the matrix units run no
//! backward and spread their cases over the 16-bit types and tile pairs
//! (`attention_support::check::matrix_unit_runs`): on a GPU each kernel is
//! one more for NVRTC to compile. The reference's own gradients are
//! checked against central finite differences first.
//!
//! Every kernel is compiled per head dimension, mask, ALiBi and storage
//! type, which on lavapipe costs seconds per shader (the tiled backward
//! about ten): head dimension 64 has every mask/ALiBi combination, the
//! other head dimensions and types one or two, and the random shapes vary
//! only what is not compiled in.

use crate::attention_support;
use crate::common;

use attention_support::check::{
    alibi_slopes, case, check_case, check_case_as, check_case_with, chosen_backward,
    chosen_forward, forward_kernels, matrix_unit_dtypes, matrix_unit_runs, no_backward,
    row_and_chosen, row_and_chosen_backward, to_f64, ForwardKernels,
};
use attention_support::reference::Problem;
use common::{client, download, upload, Rng, R};
use cubecl::prelude::*;
use ferrotron_kernels::attention::{
    attention_backward_with, attention_forward, attention_forward_with, AttentionBackwardKernel,
    AttentionError, AttentionInputs, AttentionKernel, AttentionOptions, AttentionShape,
    MatrixUnits, MMA_TILES,
};
use ferrotron_kernels::FloatDtype;

#[test]
fn f16_and_bf16_kernels_match_reference() {
    // One case per type covers GQA, the causal mask, ALiBi and a ragged
    // last tile; each new type compiles the shaders again (slow on
    // lavapipe), so the row kernels, which the launcher chooses only for
    // head dimensions the tiles do not fit, run in f16 alone and the other
    // types check the kernels the launcher chooses.
    for dtype in common::low_precision_dtypes(&client()) {
        let c = case(1, 8, 2, 65, 64, true, true);
        if dtype == FloatDtype::F16 {
            check_case_as(dtype, c, 400, row_and_chosen);
        } else {
            check_case_with(dtype, c, 400, chosen_forward, chosen_backward);
        }
    }
}

#[test]
fn fragment_kernel_on_plain_units_matches_reference() {
    // The fragment forward's tiling, masking, split softmax and 16-bit
    // rounding of the probabilities, with its products on plain units (the
    // form that runs here): f16 operands, where the runtime has f16, at
    // the largest tiles that fit (several key steps, a ragged last one),
    // GQA, causal and not, ALiBi. The f32 form runs in the tile-boundary
    // cases (`forward_kernels`).
    let plain = |client: &ComputeClient<R>, head_dim: usize, _: FloatDtype| {
        let max_shared = client.properties().hardware.max_shared_memory_size;
        vec![AttentionKernel::fragment_for(max_shared, head_dim, false)
            .expect("the fragment forward fits this device")]
    };
    check_in_f16_on_plain_units(plain, 64, 600);
}

/// Checks `forward` in f16 on plain units: three cases with several key
/// steps and a ragged last one, GQA, causal and not, ALiBi, head
/// dimensions 64, 32 and `last_head_dim`; seeds from `first_seed`.
fn check_in_f16_on_plain_units(forward: ForwardKernels, last_head_dim: usize, first_seed: u64) {
    assert!(
        FloatDtype::F16.is_supported(&client()),
        "this runtime has no f16: a 16-bit forward test cannot run here \
         (Mesa's lavapipe 25 has it)"
    );
    let cases = [
        case(1, 4, 2, 63, 64, true, true),
        case(2, 4, 4, 65, 32, false, true),
        case(1, 6, 3, 100, last_head_dim, true, false),
    ];
    for (seed, c) in cases.into_iter().enumerate() {
        check_case_with(
            FloatDtype::F16,
            c,
            first_seed + seed as u64,
            forward,
            chosen_backward,
        );
    }
}

#[test]
fn fragment_kernel_on_matrix_units_matches_reference_where_they_run() {
    // The fragment forward on the matrix units on 16-bit types. Runs where
    // the device has 16x16x16 cmma (tensor cores); lavapipe has none, and
    // the `test-cuda` build requires it.
    let on_matrix_units = |client: &ComputeClient<R>, head_dim: usize, dtype: FloatDtype| {
        vec![AttentionKernel::on_matrix_units(client, head_dim, dtype)
            .expect("the matrix units run this head dimension")]
    };
    let runs = |client: &ComputeClient<R>, dtype| {
        AttentionKernel::on_matrix_units(client, 64, dtype).is_some()
    };
    // Its launcher's tiles only, also in the wide cases: NVRTC takes up to
    // a minute per fragment kernel.
    check_in_16_bits_on_matrix_units(
        runs,
        on_matrix_units,
        on_matrix_units,
        "fragment forward",
        700,
    );
}

#[test]
fn register_kernel_on_plain_units_matches_reference() {
    // The register forward's PTX register layouts, online softmax over
    // groups of four units, in-place reuse of the score accumulators as
    // the left operand and 16-bit rounding of the probabilities, with its
    // products and group reductions on plain units (the form that runs
    // here). The f32 form runs in the tile-boundary cases
    // (`forward_kernels`).
    let plain = |client: &ComputeClient<R>, head_dim: usize, _: FloatDtype| {
        let max_shared = client.properties().hardware.max_shared_memory_size;
        vec![AttentionKernel::registers_for(max_shared, head_dim, false)
            .expect("the register forward fits this device")]
    };
    check_in_f16_on_plain_units(plain, 128, 800);
}

#[test]
fn register_kernel_with_query_chunks_on_plain_units_matches_reference() {
    // The register forward at the tiles of MMA_TILES whose key tile has
    // fewer rows than the cube has queries (64 rows, 32 and 16 keys): the
    // query rows are staged through it in 2 and 4 chunks, and each plane
    // keeps the operands of its own chunk (the other tests run the largest
    // tile, one chunk). f32 operands at head dim 16, causal, ALiBi, GQA 2,
    // 100 rows (the last cube ragged).
    let chunked = |client: &ComputeClient<R>, head_dim: usize, _: FloatDtype| {
        let max_shared = client.properties().hardware.max_shared_memory_size;
        let kernels: Vec<_> = MMA_TILES
            .into_iter()
            .filter(|&(planes, keys)| keys < 16 * planes)
            .map(|(planes, keys)| AttentionKernel::Registers {
                planes,
                keys,
                matrix_units: false,
            })
            .filter(|kernel| kernel.shared_bytes(head_dim) <= max_shared)
            .collect();
        assert_eq!(
            kernels.len(),
            2,
            "the chunked register tiles do not fit this device"
        );
        kernels
    };
    check_case_with(
        FloatDtype::F32,
        case(1, 4, 2, 100, 16, true, true),
        810,
        chunked,
        no_backward,
    );
}

#[test]
fn register_kernel_on_matrix_units_matches_reference_where_it_runs() {
    // The register forward on the `mma` instruction in 16 bits. Runs where
    // the device has the 16 x 8 x 16 `mma` (NVIDIA from sm_80); lavapipe
    // has none, and the `test-cuda` build requires it.
    let on_mma = |client: &ComputeClient<R>, head_dim: usize, _: FloatDtype| {
        let max_shared = client.properties().hardware.max_shared_memory_size;
        vec![AttentionKernel::registers_for(max_shared, head_dim, true)
            .expect("the register forward fits this device")]
    };
    let every_on_mma = |client: &ComputeClient<R>, head_dim: usize, _: FloatDtype| {
        let max_shared = client.properties().hardware.max_shared_memory_size;
        let kernels: Vec<_> = MMA_TILES
            .into_iter()
            .map(|(planes, keys)| AttentionKernel::Registers {
                planes,
                keys,
                matrix_units: true,
            })
            .filter(|kernel| kernel.shared_bytes(head_dim) <= max_shared)
            .collect();
        assert!(!kernels.is_empty(), "no register forward fits this device");
        kernels
    };
    check_in_16_bits_on_matrix_units(
        AttentionKernel::mma_runs,
        on_mma,
        every_on_mma,
        "register forward",
        900,
    );
}

/// Checks a forward kernel alone (output and log-sum-exp) on the matrix
/// units in the 16-bit types the device `runs` it in, as
/// [`matrix_unit_runs`] spreads the cases over them: the launcher's tiles
/// (`chosen`), and in the wide cases (not causal at head dim 32; causal
/// with ALiBi at 128 over several tiles) `every` tile pair. Sequences of
/// one tile below, at and above, and several; head dimensions 16 to 128,
/// GQA, causal and not, ALiBi; seeds from `first_seed`. Says so where no
/// type runs (and fails in the `test-cuda` build, which requires them).
fn check_in_16_bits_on_matrix_units(
    runs: fn(&ComputeClient<R>, FloatDtype) -> bool,
    chosen: ForwardKernels,
    every: ForwardKernels,
    what: &str,
    first_seed: u64,
) {
    let dtypes = matrix_unit_dtypes(runs, what);
    let cases = [
        case(1, 4, 2, 63, 64, true, true),
        case(1, 2, 1, 64, 128, true, false),
        case(2, 4, 4, 65, 32, false, true),
        case(1, 6, 3, 200, 64, true, false),
        case(1, 2, 2, 130, 16, false, false),
        case(1, 8, 2, 257, 128, true, true),
    ];
    for (dtype, i, wide) in matrix_unit_runs(&dtypes, cases.len(), &[2, 5]) {
        let forward = if wide { every } else { chosen };
        check_case_with(dtype, cases[i], first_seed + i as u64, forward, no_backward);
    }
}

/// The input tensor `name` (`q`, `k` or `v`) of `problem`.
fn tensor_mut<'a>(problem: &'a mut Problem, name: &str) -> &'a mut Vec<f64> {
    match name {
        "q" => &mut problem.q,
        "k" => &mut problem.k,
        _ => &mut problem.v,
    }
}

#[test]
fn reference_gradients_match_finite_differences() {
    let shape = AttentionShape {
        batch: 1,
        n_heads: 4,
        n_kv_heads: 2,
        seq: 5,
        head_dim: 3,
    };
    for (causal, alibi) in [(false, false), (true, false), (true, true), (false, true)] {
        let mut rng = Rng::new(7);
        let mut problem = Problem {
            shape,
            causal,
            scale: 0.8,
            slopes: alibi.then(|| to_f64(&alibi_slopes(shape.n_heads))),
            q: to_f64(&rng.vec(shape.q_elems(), -1.0, 1.0)),
            k: to_f64(&rng.vec(shape.kv_elems(), -1.0, 1.0)),
            v: to_f64(&rng.vec(shape.kv_elems(), -1.0, 1.0)),
        };
        let d_out = to_f64(&rng.vec(shape.q_elems(), -1.0, 1.0));
        let grads = problem.backward(&d_out);
        let loss =
            |p: &Problem| -> f64 { p.forward().out.iter().zip(&d_out).map(|(o, g)| o * g).sum() };
        let step = 1e-5;
        for (name, analytic) in [("q", &grads.dq), ("k", &grads.dk), ("v", &grads.dv)] {
            for (idx, &exact) in analytic.iter().enumerate() {
                let original = tensor_mut(&mut problem, name)[idx];
                tensor_mut(&mut problem, name)[idx] = original + step;
                let up = loss(&problem);
                tensor_mut(&mut problem, name)[idx] = original - step;
                let down = loss(&problem);
                tensor_mut(&mut problem, name)[idx] = original;
                let numeric = (up - down) / (2.0 * step);
                assert!(
                    (numeric - exact).abs() < 1e-8,
                    "d{name}[{idx}] (causal {causal}, alibi {alibi}): analytic {exact} vs numeric {numeric}"
                );
            }
        }
    }
}

#[test]
fn reference_causal_first_row_copies_first_value() {
    let shape = AttentionShape {
        batch: 1,
        n_heads: 1,
        n_kv_heads: 1,
        seq: 3,
        head_dim: 2,
    };
    let mut rng = Rng::new(3);
    let problem = Problem {
        shape,
        causal: true,
        scale: 0.5,
        slopes: None,
        q: to_f64(&rng.vec(6, -1.0, 1.0)),
        k: to_f64(&rng.vec(6, -1.0, 1.0)),
        v: to_f64(&rng.vec(6, -1.0, 1.0)),
    };
    let fwd = problem.forward();
    assert_eq!(&fwd.out[..2], &problem.v[..2]);
    let score = 0.5 * (problem.q[0] * problem.k[0] + problem.q[1] * problem.k[1]);
    assert!((fwd.lse[0] - score).abs() < 1e-12);
}

#[test]
fn kernels_match_reference_head_dim_64() {
    let cases = [
        case(1, 2, 2, 1, 64, true, false),
        case(1, 8, 2, 7, 64, true, true),
        case(2, 4, 4, 33, 64, false, true),
        case(1, 8, 2, 65, 64, false, false),
        case(1, 2, 1, 65, 64, true, true),
        case(1, 4, 2, 150, 64, true, true),
    ];
    for (seed, c) in cases.into_iter().enumerate() {
        check_case(c, seed as u64);
    }
}

#[test]
fn kernels_match_reference_head_dim_128() {
    // Two of the four mask/ALiBi combinations (head dimension 64 has all
    // four): each combination is one more set of shaders to compile.
    let cases = [
        case(1, 8, 2, 65, 128, true, true),
        case(2, 2, 1, 33, 128, false, false),
        case(1, 4, 2, 7, 128, false, false),
        case(1, 2, 2, 1, 128, true, true),
    ];
    for (seed, c) in cases.into_iter().enumerate() {
        check_case(c, 100 + seed as u64);
    }
}

#[test]
fn kernels_match_reference_other_head_dims() {
    let cases = [
        case(1, 4, 2, 20, 32, true, true),
        case(1, 2, 1, 19, 80, false, true),
    ];
    for (seed, c) in cases.into_iter().enumerate() {
        check_case(c, 300 + seed as u64);
    }
}

#[test]
fn the_tiled_kernel_runs_on_this_device() {
    // The tests below check the tiled kernel only where it fits the
    // device: a device without the shared memory for it fails here rather
    // than leaving it unchecked.
    let client = client();
    for head_dim in [32, 64, 128] {
        let kernels = forward_kernels(&client, head_dim, FloatDtype::F32);
        eprintln!(
            "head_dim {head_dim}: forward kernels checked {kernels:?}, chosen {:?} ({} bytes of \
             shared memory per cube on this device)",
            AttentionKernel::choose(&client, head_dim),
            client.properties().hardware.max_shared_memory_size
        );
        assert!(
            kernels.len() > 1,
            "head_dim {head_dim}: the tiled kernel does not fit this device's shared memory"
        );
        assert_ne!(
            AttentionKernel::choose(&client, head_dim),
            AttentionKernel::Row
        );
    }
}

#[test]
fn kernels_match_reference_at_tile_boundaries() {
    // Sequences one below, at and one above the tile sizes (16, 32) and
    // their multiples, with GQA, causal masks and ALiBi; and the largest
    // head dimension (256: 16 x 16 tiles need 33.3 KiB of shared memory, so
    // a 32 KiB device such as lavapipe runs the row kernel only).
    let cases = [
        case(1, 4, 2, 32, 32, true, true),
        case(1, 2, 1, 64, 64, true, false),
        case(2, 4, 2, 31, 128, false, false),
        case(1, 6, 3, 97, 32, true, true),
        case(1, 2, 2, 17, 64, false, false),
        case(1, 4, 2, 37, 256, true, true),
    ];
    // The row backward has no tiles: the chosen backward alone.
    for (seed, c) in cases.into_iter().enumerate() {
        check_case_with(
            FloatDtype::F32,
            c,
            500 + seed as u64,
            forward_kernels,
            chosen_backward,
        );
    }
}

#[test]
fn kernels_match_reference_on_random_shapes() {
    // Batch, heads, sequence, scale, mask and ALiBi drawn at random; head
    // dimension 64, whose shaders the cases above compile for every mask
    // and ALiBi combination.
    let mut rng = Rng::new(2024);
    for seed in 0..4 {
        let (n_heads, n_kv_heads) = [(8, 2), (4, 1), (2, 2), (6, 3)][rng.below(4)];
        let mut c = case(
            1 + rng.below(2),
            n_heads,
            n_kv_heads,
            1 + rng.below(80),
            64,
            rng.below(2) == 0,
            rng.below(2) == 0,
        );
        c.scale = Some(0.05 + 0.2 * (rng.below(100) as f32 / 100.0));
        check_case(c, 200 + seed);
    }
}

#[test]
fn backward_is_deterministic() {
    // The row and the chosen backward: no atomics, so bit-identical
    // gradients from run to run (the tiled dK/dV kernel sums a GQA group in
    // one cube; the dQ pass is its own kernel).
    let s = AttentionShape {
        batch: 1,
        n_heads: 4,
        n_kv_heads: 1,
        seq: 70,
        head_dim: 64,
    };
    let mut rng = Rng::new(11);
    let client = client();
    let (q, k, v, d_out) = (
        upload(&client, &rng.vec(s.q_elems(), -1.0, 1.0)),
        upload(&client, &rng.vec(s.kv_elems(), -1.0, 1.0)),
        upload(&client, &rng.vec(s.kv_elems(), -1.0, 1.0)),
        upload(&client, &rng.vec(s.q_elems(), -1.0, 1.0)),
    );
    let inputs = AttentionInputs {
        q: &q,
        k: &k,
        v: &v,
        alibi_slopes: None,
    };
    let options = AttentionOptions {
        causal: true,
        scale: None,
        matrix_units: MatrixUnits::Off,
    };
    let fwd = attention_forward(&client, s, options, inputs).expect("forward launch");
    for kernel in row_and_chosen_backward(&client, s.head_dim) {
        let run = || {
            let g = attention_backward_with(
                &client,
                kernel,
                FloatDtype::F32,
                s,
                options,
                inputs,
                &fwd.out,
                &fwd.lse,
                &d_out,
            )
            .expect("backward launch");
            [g.dq, g.dk, g.dv].map(|h| download(&client, &h))
        };
        assert_eq!(run(), run(), "backward {}", kernel.name());
    }
}

#[test]
fn launchers_reject_bad_shapes_and_buffers() {
    let client = client();
    let s = AttentionShape {
        batch: 1,
        n_heads: 4,
        n_kv_heads: 2,
        seq: 3,
        head_dim: 64,
    };
    let q = upload(&client, &vec![0.0; s.q_elems()]);
    let kv = upload(&client, &vec![0.0; s.kv_elems()]);
    let inputs = AttentionInputs {
        q: &q,
        k: &kv,
        v: &kv,
        alibi_slopes: None,
    };
    let options = AttentionOptions::default();

    let uneven = AttentionShape { n_kv_heads: 3, ..s };
    assert_eq!(
        attention_forward(&client, uneven, options, inputs).unwrap_err(),
        AttentionError::HeadsNotDivisible {
            n_heads: 4,
            n_kv_heads: 3
        }
    );
    let wide = AttentionShape { head_dim: 512, ..s };
    assert!(matches!(
        attention_forward(&client, wide, options, inputs),
        Err(AttentionError::HeadDimTooLarge { .. })
    ));
    // A buffer smaller than the shape is refused; a larger one is
    // accepted (CUDA's allocator rounds Burn's buffers up).
    let swapped = AttentionInputs { q: &kv, ..inputs };
    assert_eq!(
        attention_forward(&client, s, options, swapped).unwrap_err(),
        AttentionError::BufferSize {
            name: "q",
            expected_bytes: (s.q_elems() * 4) as u64,
            actual_bytes: (s.kv_elems() * 4) as u64,
        }
    );
    let larger = AttentionInputs {
        k: &q,
        v: &q,
        ..inputs
    };
    let fwd = attention_forward(&client, s, options, larger).expect("larger k and v buffers");
    let reference = attention_forward(&client, s, options, inputs).expect("exact buffers");
    assert_eq!(
        download(&client, &fwd.out),
        download(&client, &reference.out)
    );
    for tile in [8, 64] {
        assert_eq!(
            attention_forward_with(
                &client,
                AttentionKernel::Tiled { tile },
                FloatDtype::F32,
                s,
                options,
                inputs
            )
            .unwrap_err(),
            AttentionError::UnsupportedTile { tile }
        );
    }
    let on_matrix_units = AttentionKernel::Fragment {
        planes: 1,
        keys: 16,
        matrix_units: true,
    };
    assert_eq!(
        attention_forward_with(
            &client,
            on_matrix_units,
            FloatDtype::F32,
            s,
            options,
            inputs
        )
        .unwrap_err(),
        AttentionError::MatrixUnitsUnsupported { dtype: "f32" }
    );
    let slopes = upload(&client, &[0.5; 3]);
    let short_slopes = AttentionInputs {
        alibi_slopes: Some(&slopes),
        ..inputs
    };
    assert!(matches!(
        attention_forward(&client, s, options, short_slopes),
        Err(AttentionError::BufferSize {
            name: "alibi_slopes",
            ..
        })
    ));
    // A softmax scale must lie in SCALE_RANGE, in both passes.
    for scale in [0.0, -0.125, 1e-21, 2e8, f32::NAN, f32::INFINITY] {
        let bad = AttentionOptions {
            scale: Some(scale),
            ..options
        };
        let refused = AttentionError::Scale {
            scale: scale.to_string(),
        };
        assert_eq!(
            attention_forward(&client, s, bad, inputs).unwrap_err(),
            refused
        );
        let err = attention_backward_with(
            &client,
            AttentionBackwardKernel::Row,
            FloatDtype::F32,
            s,
            bad,
            inputs,
            &reference.out,
            &reference.lse,
            &q,
        )
        .unwrap_err();
        assert_eq!(err, refused);
    }
}

/// `AttentionOptions::matrix_units` (`backend.attention_kernel =
/// matrix-units` or `registers`) asks for the fragment or the register
/// forward and backward on the matrix units: the launchers take them
/// exactly where the device runs them for the type and head dimension
/// (never in f32; on CUDA in 16 bits), and the kernels `choose` picks
/// elsewhere and when not asked.
#[test]
fn matrix_units_are_taken_where_they_run_when_asked_for() {
    let client = client();
    let max_shared = client.properties().hardware.max_shared_memory_size;
    let ask = |matrix_units| AttentionOptions {
        matrix_units,
        ..AttentionOptions::default()
    };
    for dtype in [FloatDtype::F32, FloatDtype::F16, FloatDtype::Bf16] {
        for head_dim in [64, 72, 128] {
            let plain_fwd = AttentionKernel::choose(&client, head_dim);
            let plain_bwd = AttentionBackwardKernel::choose(&client, head_dim);
            let default = AttentionOptions::default();
            assert_eq!(
                AttentionKernel::for_call(&client, head_dim, dtype, default),
                plain_fwd
            );
            assert_eq!(
                AttentionBackwardKernel::for_call(&client, head_dim, dtype, default),
                plain_bwd
            );
            let fragments = ask(MatrixUnits::Fragments);
            let fwd = AttentionKernel::for_call(&client, head_dim, dtype, fragments);
            let on_matrix_units = AttentionKernel::matrix_units_run(&client, dtype)
                .then(|| AttentionKernel::fragment_for(max_shared, head_dim, true))
                .flatten();
            assert_eq!(fwd, on_matrix_units.unwrap_or(plain_fwd));
            let fragment = AttentionBackwardKernel::matrix_units_run(&client, dtype)
                .then(|| AttentionBackwardKernel::fragment_for(max_shared, head_dim, true))
                .flatten();
            assert_eq!(
                AttentionBackwardKernel::for_call(&client, head_dim, dtype, fragments),
                fragment.unwrap_or(plain_bwd),
                "{dtype:?} at head dim {head_dim}"
            );
            let registers = ask(MatrixUnits::Registers);
            let mma_fwd = AttentionKernel::for_call(&client, head_dim, dtype, registers);
            let on_mma = AttentionKernel::mma_runs(&client, dtype)
                .then(|| AttentionKernel::registers_for(max_shared, head_dim, true))
                .flatten();
            assert_eq!(mma_fwd, on_mma.unwrap_or(plain_fwd));
            let mma_bwd = AttentionBackwardKernel::mma_runs(&client, dtype)
                .then(|| AttentionBackwardKernel::registers_for(max_shared, head_dim, true))
                .flatten();
            assert_eq!(
                AttentionBackwardKernel::for_call(&client, head_dim, dtype, registers),
                mma_bwd.unwrap_or(plain_bwd),
                "{dtype:?} at head dim {head_dim}"
            );
            if dtype == FloatDtype::F32 || head_dim == 72 {
                assert_eq!(fwd, plain_fwd, "{dtype:?} at head dim {head_dim}");
                assert_eq!(mma_fwd, plain_fwd, "{dtype:?} at head dim {head_dim}");
            }
        }
    }
}
