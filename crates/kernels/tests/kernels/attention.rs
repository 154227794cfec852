//! FlashAttention kernels (the row, the tiled and the cmma forward, the
//! FlashAttention-2 backward; f32, f16 and bf16 storage) against a naive
//! host reference, on the wgpu runtime (lavapipe on machines without a
//! GPU; CUDA with the `test-cuda` feature). Each case runs the row forward
//! kernel and the one the launcher chooses (the tile boundary cases: the
//! tiled kernel at every tile size that fits the device, and the cmma
//! kernel where it runs) and the backward on the output of the kernel the
//! launcher chooses. The reference's own gradients are checked against
//! central finite differences first.

use crate::attention_support;
use crate::common;

use attention_support::reference::Problem;
use common::{client, download, download_as, round_to, upload, upload_as, Rng, R};
use cubecl::prelude::*;
use ferrotron_kernels::attention::{
    attention_backward, attention_backward_typed, attention_forward, attention_forward_typed,
    attention_forward_with, AttentionError, AttentionInputs, AttentionKernel, AttentionOptions,
    AttentionShape, TILE_SIZES,
};
use ferrotron_kernels::FloatDtype;

/// Largest error allowed, relative to the largest magnitude of the
/// reference tensor.
const TOLERANCE: f64 = 1e-4;

/// One kernel test: shape and options.
#[derive(Clone, Copy, Debug)]
struct Case {
    shape: AttentionShape,
    causal: bool,
    alibi: bool,
    scale: Option<f32>,
}

fn case(
    batch: usize,
    n_heads: usize,
    n_kv_heads: usize,
    seq: usize,
    head_dim: usize,
    causal: bool,
    alibi: bool,
) -> Case {
    Case {
        shape: AttentionShape {
            batch,
            n_heads,
            n_kv_heads,
            seq,
            head_dim,
        },
        causal,
        alibi,
        scale: None,
    }
}

/// ALiBi slopes `2^(-8 (h + 1) / n_heads)` (BLOOM's formula for a power-of-two
/// head count, used here for any count).
fn alibi_slopes(n_heads: usize) -> Vec<f32> {
    (0..n_heads)
        .map(|h| 2f32.powf(-8.0 * (h + 1) as f32 / n_heads as f32))
        .collect()
}

/// The forward kernels the tests check on `client`'s device for
/// `head_dim` and `dtype`: the row kernel, the tiled kernel at every tile
/// size whose shared memory fits the device, and the cmma kernel where it
/// runs.
fn forward_kernels(
    client: &ComputeClient<R>,
    head_dim: usize,
    dtype: FloatDtype,
) -> Vec<AttentionKernel> {
    let max_shared = client.properties().hardware.max_shared_memory_size;
    let tiled = TILE_SIZES
        .into_iter()
        .map(|tile| AttentionKernel::Tiled { tile })
        .filter(|kernel| kernel.shared_bytes(head_dim) <= max_shared);
    let cmma = AttentionKernel::cmma_runs(client, head_dim, dtype).then_some(AttentionKernel::Cmma);
    std::iter::once(AttentionKernel::Row)
        .chain(tiled)
        .chain(cmma)
        .collect()
}

/// The row kernel and the kernel the launcher chooses for `head_dim`
/// (most cases check these two: each kernel variant is one more shader to
/// compile, slow on lavapipe).
fn row_and_chosen(
    client: &ComputeClient<R>,
    head_dim: usize,
    _: FloatDtype,
) -> Vec<AttentionKernel> {
    vec![
        AttentionKernel::Row,
        AttentionKernel::choose(client, head_dim),
    ]
}

/// Tolerance of `kernel`'s output stored as `dtype`: `stored_tol`, plus
/// for the cmma kernel one unit roundoff of the 16-bit type, because it
/// rounds the probabilities to it before the second product (each output
/// `sum_j p_j v_j / l` moves by at most `u sum_j p_j |v_j| / l <= u max
/// |v|`, and the tests' values have `max |v|` near the outputs' largest
/// magnitude).
fn output_tolerance(kernel: AttentionKernel, dtype: FloatDtype, stored_tol: f64) -> f64 {
    match kernel {
        AttentionKernel::Cmma => stored_tol + dtype.unit_roundoff(),
        _ => stored_tol,
    }
}

fn to_f64(values: &[f32]) -> Vec<f64> {
    values.iter().map(|&x| x as f64).collect()
}

/// Largest `|got - want|` divided by the largest `|want|`.
fn relative_error(got: &[f32], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len(), "length of a kernel output");
    let magnitude = want.iter().fold(1e-12f64, |m, w| m.max(w.abs()));
    let worst = got
        .iter()
        .zip(want)
        .map(|(&g, w)| (g as f64 - w).abs())
        .fold(0.0, f64::max);
    worst / magnitude
}

/// Runs forward and backward of `case` on the device and on the host,
/// asserts every output within [`TOLERANCE`] and returns the largest
/// relative error.
fn check_case(case: Case, seed: u64) -> f64 {
    check_case_as(FloatDtype::F32, case, seed, row_and_chosen)
}

/// [`check_case`] with `q`, `k`, `v`, `d_out`, the output and the gradients
/// stored as `dtype` (the log-sum-exp and the slopes f32). The reference
/// gets the same rounded inputs; its backward takes the kernel's stored
/// output for `delta = rowsum(dO * out)`, as the backward kernel does (the
/// forward output is checked on its own). Outputs of `dtype` must be within
/// [`common::tolerance`] of [`TOLERANCE`], the log-sum-exp within
/// [`TOLERANCE`].
fn check_case_as(
    dtype: FloatDtype,
    case: Case,
    seed: u64,
    kernels: fn(&ComputeClient<R>, usize, FloatDtype) -> Vec<AttentionKernel>,
) -> f64 {
    let s = case.shape;
    let mut rng = Rng::new(seed);
    // Queries scaled up so the softmax is far from uniform.
    let q: Vec<f32> = rng
        .vec(s.q_elems(), -1.0, 1.0)
        .iter()
        .map(|x| 4.0 * x)
        .collect();
    let q = round_to(dtype, &q);
    let k = round_to(dtype, &rng.vec(s.kv_elems(), -1.0, 1.0));
    let v = round_to(dtype, &rng.vec(s.kv_elems(), -1.0, 1.0));
    let d_out = round_to(dtype, &rng.vec(s.q_elems(), -1.0, 1.0));
    let slopes = case.alibi.then(|| alibi_slopes(s.n_heads));
    let options = AttentionOptions {
        causal: case.causal,
        scale: case.scale,
    };

    let problem = Problem {
        shape: s,
        causal: case.causal,
        scale: options.scale_for(s.head_dim) as f64,
        slopes: slopes.as_deref().map(to_f64),
        q: to_f64(&q),
        k: to_f64(&k),
        v: to_f64(&v),
    };
    let want = problem.forward();

    let client = client();
    let stored_tol = common::tolerance(dtype, TOLERANCE as f32) as f64;
    let (q_h, k_h, v_h, do_h) = (
        upload_as(&client, dtype, &q),
        upload_as(&client, dtype, &k),
        upload_as(&client, dtype, &v),
        upload_as(&client, dtype, &d_out),
    );
    let slopes_h = slopes.as_deref().map(|x| upload(&client, x));
    let inputs = AttentionInputs {
        q: &q_h,
        k: &k_h,
        v: &v_h,
        alibi_slopes: slopes_h.as_ref(),
    };
    // Each forward kernel of `kernels` is checked; the backward takes the
    // output of the one the launcher chooses.
    let mut errors = Vec::new();
    for kernel in kernels(&client, s.head_dim, dtype) {
        let fwd = attention_forward_with(&client, kernel, dtype, s, options, inputs)
            .expect("forward launch");
        let out = download_as(&client, dtype, &fwd.out);
        errors.push((
            format!("out ({})", kernel.name()),
            relative_error(&out, &want.out),
            output_tolerance(kernel, dtype, stored_tol),
        ));
        errors.push((
            format!("lse ({})", kernel.name()),
            relative_error(&download(&client, &fwd.lse), &want.lse),
            TOLERANCE,
        ));
    }
    let fwd = attention_forward_typed(&client, dtype, s, options, inputs).expect("forward launch");
    let grads = attention_backward_typed(
        &client, dtype, s, options, inputs, &fwd.out, &fwd.lse, &do_h,
    )
    .expect("backward launch");

    let out = download_as(&client, dtype, &fwd.out);
    let want_grads = if dtype == FloatDtype::F32 {
        problem.backward(&to_f64(&d_out))
    } else {
        problem.backward_given_out(&to_f64(&d_out), &to_f64(&out))
    };
    for (name, got, want) in [
        ("dq", &grads.dq, &want_grads.dq),
        ("dk", &grads.dk, &want_grads.dk),
        ("dv", &grads.dv, &want_grads.dv),
    ] {
        errors.push((
            name.to_string(),
            relative_error(&download_as(&client, dtype, got), want),
            stored_tol,
        ));
    }
    eprintln!("{} {case:?}: relative errors {errors:?}", dtype.name());
    for &(ref name, error, tol) in &errors {
        assert!(
            error <= tol,
            "{} {name} off by {error:e} > {tol:e} (relative to its largest magnitude) for {case:?}",
            dtype.name()
        );
    }
    errors.iter().map(|e| e.1).fold(0.0, f64::max)
}

#[test]
fn f16_and_bf16_kernels_match_reference() {
    // One case per type covers GQA, the causal mask, ALiBi and a ragged
    // last tile; each new type compiles the four shaders again (slow on
    // lavapipe).
    for dtype in common::low_precision_dtypes(&client()) {
        check_case_as(
            dtype,
            case(1, 8, 2, 65, 64, true, true),
            400,
            row_and_chosen,
        );
    }
}

#[test]
fn cmma_kernel_matches_reference_where_it_runs() {
    // The matrix-unit kernel on 16-bit types: query tiles of 64 rows and
    // key tiles of 64 (one below, at and above, and several), head
    // dimensions 16 to 128, GQA, causal and not, ALiBi. Runs where the
    // device has 16x16x16 cmma (tensor cores); lavapipe has none, and the
    // `test-cuda` build requires it.
    let client = client();
    let dtypes: Vec<FloatDtype> = [FloatDtype::Bf16, FloatDtype::F16, FloatDtype::Bf16InF32]
        .into_iter()
        .filter(|&d| d.is_supported(&client) && AttentionKernel::cmma_runs(&client, 64, d))
        .collect();
    if dtypes.is_empty() {
        if cfg!(feature = "test-cuda") {
            panic!("the cmma attention kernel does not run on this CUDA device");
        }
        eprintln!(
            "NOT RUN: the cmma attention kernel (this device has no 16x16x16 cmma for f16/bf16 \
             with 32-unit planes; it runs in the test-cuda build on an NVIDIA GPU)"
        );
        return;
    }
    let cases = [
        case(1, 4, 2, 63, 64, true, true),
        case(1, 2, 1, 64, 128, true, false),
        case(2, 4, 4, 65, 32, false, true),
        case(1, 6, 3, 200, 64, true, false),
        case(1, 2, 2, 130, 16, false, false),
        case(1, 8, 2, 257, 128, true, true),
    ];
    for dtype in dtypes {
        for (seed, c) in cases.into_iter().enumerate() {
            let only_cmma =
                |_: &ComputeClient<R>, _: usize, _: FloatDtype| vec![AttentionKernel::Cmma];
            check_case_as(dtype, c, 700 + seed as u64, only_cmma);
        }
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
    let cases = [
        case(1, 8, 2, 65, 128, true, true),
        case(2, 2, 1, 33, 128, false, false),
        case(1, 4, 2, 7, 128, false, true),
        case(1, 2, 2, 1, 128, true, false),
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
        case(2, 4, 2, 31, 128, false, true),
        case(1, 6, 3, 97, 32, true, true),
        case(1, 2, 2, 17, 64, false, false),
        case(1, 4, 2, 37, 256, true, true),
    ];
    for (seed, c) in cases.into_iter().enumerate() {
        check_case_as(FloatDtype::F32, c, 500 + seed as u64, forward_kernels);
    }
}

#[test]
fn kernels_match_reference_on_random_shapes() {
    let mut rng = Rng::new(2024);
    for seed in 0..4 {
        let (n_heads, n_kv_heads) = [(8, 2), (4, 1), (2, 2), (6, 3)][rng.below(4)];
        let mut c = case(
            1 + rng.below(2),
            n_heads,
            n_kv_heads,
            1 + rng.below(80),
            [64, 128][rng.below(2)],
            rng.below(2) == 0,
            rng.below(2) == 0,
        );
        c.scale = Some(0.05 + 0.2 * (rng.below(100) as f32 / 100.0));
        check_case(c, 200 + seed);
    }
}

#[test]
fn backward_is_deterministic() {
    let s = AttentionShape {
        batch: 1,
        n_heads: 4,
        n_kv_heads: 2,
        seq: 40,
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
    };
    let fwd = attention_forward(&client, s, options, inputs).expect("forward launch");
    let run = || {
        let g = attention_backward(&client, s, options, inputs, &fwd.out, &fwd.lse, &d_out)
            .expect("backward launch");
        [g.dq, g.dk, g.dv].map(|h| download(&client, &h))
    };
    assert_eq!(run(), run());
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
    assert_eq!(
        attention_forward_with(
            &client,
            AttentionKernel::Cmma,
            FloatDtype::F32,
            s,
            options,
            inputs
        )
        .unwrap_err(),
        AttentionError::CmmaUnsupported {
            head_dim: 64,
            dtype: "f32"
        }
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
}
