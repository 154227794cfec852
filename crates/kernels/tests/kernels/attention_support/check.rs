//! The kernel-against-reference check of the attention tests: random
//! inputs rounded to the storage type, the forward kernels and the
//! backward kernels of a case on the device, the f64 reference on the
//! host, every output within its tolerance.

use cubecl::prelude::*;
use ferrotron_kernels::attention::{
    attention_backward_with, attention_forward_typed, attention_forward_with,
    AttentionBackwardKernel, AttentionInputs, AttentionKernel, AttentionOptions, AttentionShape,
    MatrixUnits, TILE_SIZES,
};
use ferrotron_kernels::FloatDtype;

use super::reference::Problem;
use crate::common::{self, client, download, download_as, round_to, upload, upload_as, Rng, R};

/// The forward kernels a check runs for `head_dim` and the storage type.
pub type ForwardKernels = fn(&ComputeClient<R>, usize, FloatDtype) -> Vec<AttentionKernel>;

/// The backward kernels a check runs for `head_dim`.
pub type BackwardKernels = fn(&ComputeClient<R>, usize) -> Vec<AttentionBackwardKernel>;

/// The 16-bit storage types (bf16, f16, bf16 in f32 storage) in which the
/// device `runs` the `what` on its matrix units. Where there is none, says
/// so on stderr and returns none; in the `test-cuda` build, which requires
/// them, that fails the test.
pub fn matrix_unit_dtypes(
    runs: fn(&ComputeClient<R>, FloatDtype) -> bool,
    what: &str,
) -> Vec<FloatDtype> {
    let client = client();
    let dtypes: Vec<FloatDtype> = [FloatDtype::Bf16, FloatDtype::F16, FloatDtype::Bf16InF32]
        .into_iter()
        .filter(|&d| d.is_supported(&client) && runs(&client, d))
        .collect();
    if dtypes.is_empty() {
        if cfg!(feature = "test-cuda") {
            panic!("the {what} does not run on this CUDA device's matrix units");
        }
        eprintln!(
            "NOT RUN: the {what} on matrix units (this device has none for f16/bf16 with \
             32-unit planes; it runs in the test-cuda build on an NVIDIA GPU)"
        );
    }
    dtypes
}

/// The runs of a matrix-unit test over `cases` cases, as `(dtype, case
/// index, every tile pair)`: in the first of `dtypes`, the cases `wide` at
/// every tile pair (the launcher's among them) and the others at the
/// launcher's tiles; in each other type, the cases `wide` at the
/// launcher's tiles. The tile pairs change a kernel's loops (and the order
/// of its sums), the storage types its loads, rounding and stores, so the
/// wide cases cover each with the others fixed. Each tile pair and type is
/// one more kernel for NVRTC to compile (a register kernel about 3 s on the
/// H200, on the device's one compiling thread), and a lease has minutes
/// for all tests.
pub fn matrix_unit_runs(
    dtypes: &[FloatDtype],
    cases: usize,
    wide: &[usize],
) -> Vec<(FloatDtype, usize, bool)> {
    let mut runs = Vec::new();
    for (t, &dtype) in dtypes.iter().enumerate() {
        for case in 0..cases {
            let is_wide = wide.contains(&case);
            if t == 0 {
                runs.push((dtype, case, is_wide));
            } else if is_wide {
                runs.push((dtype, case, false));
            }
        }
    }
    runs
}

/// No backward kernel: a check of a forward kernel alone (its output and
/// log-sum-exp).
pub fn no_backward(_: &ComputeClient<R>, _: usize) -> Vec<AttentionBackwardKernel> {
    Vec::new()
}

/// The row backward and the one the launcher chooses for `head_dim` (the
/// tiled one where it fits the device).
pub fn row_and_chosen_backward(
    client: &ComputeClient<R>,
    head_dim: usize,
) -> Vec<AttentionBackwardKernel> {
    vec![
        AttentionBackwardKernel::Row,
        AttentionBackwardKernel::choose(client, head_dim),
    ]
}

/// The backward the launcher chooses for `head_dim` alone.
pub fn chosen_backward(client: &ComputeClient<R>, head_dim: usize) -> Vec<AttentionBackwardKernel> {
    vec![AttentionBackwardKernel::choose(client, head_dim)]
}

/// Largest error allowed, relative to the largest magnitude of the
/// reference tensor.
pub const TOLERANCE: f64 = 1e-4;

/// One kernel test: shape and options.
#[derive(Clone, Copy, Debug)]
pub struct Case {
    /// Dimensions.
    pub shape: AttentionShape,
    /// Causal mask.
    pub causal: bool,
    /// ALiBi slopes ([`alibi_slopes`]).
    pub alibi: bool,
    /// Softmax scale (`None`: `1 / sqrt(head_dim)`).
    pub scale: Option<f32>,
}

/// A [`Case`] with the default scale.
pub fn case(
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
pub fn alibi_slopes(n_heads: usize) -> Vec<f32> {
    (0..n_heads)
        .map(|h| 2f32.powf(-8.0 * (h + 1) as f32 / n_heads as f32))
        .collect()
}

/// The forward kernel the launcher chooses for `head_dim` alone.
pub fn chosen_forward(
    client: &ComputeClient<R>,
    head_dim: usize,
    _: FloatDtype,
) -> Vec<AttentionKernel> {
    vec![AttentionKernel::choose(client, head_dim)]
}

/// The forward kernels the tests check on `client`'s device for
/// `head_dim` and `dtype`: the row kernel, the tiled kernel at every tile
/// size whose shared memory fits the device, and the fragment and the
/// register kernel on plain units at the largest tiles that fit, and on
/// the matrix units where they run.
pub fn forward_kernels(
    client: &ComputeClient<R>,
    head_dim: usize,
    dtype: FloatDtype,
) -> Vec<AttentionKernel> {
    let max_shared = client.properties().hardware.max_shared_memory_size;
    let tiled = TILE_SIZES
        .into_iter()
        .map(|tile| AttentionKernel::Tiled { tile })
        .filter(|kernel| kernel.shared_bytes(head_dim) <= max_shared);
    let plain = AttentionKernel::fragment_for(max_shared, head_dim, false);
    let matrix_units = AttentionKernel::on_matrix_units(client, head_dim, dtype);
    let registers = AttentionKernel::registers_for(max_shared, head_dim, false);
    let mma = AttentionKernel::mma_runs(client, dtype)
        .then(|| AttentionKernel::registers_for(max_shared, head_dim, true))
        .flatten();
    std::iter::once(AttentionKernel::Row)
        .chain(tiled)
        .chain(plain)
        .chain(matrix_units)
        .chain(registers)
        .chain(mma)
        .collect()
}

/// The row kernel and the kernel the launcher chooses for `head_dim`
/// (most cases check these two: each kernel variant is one more shader to
/// compile, slow on lavapipe).
pub fn row_and_chosen(
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
/// for the fragment and register kernels on a 16-bit type one unit
/// roundoff of it,
/// because it rounds the probabilities to it before the second product
/// (each output
/// `sum_j p_j v_j / l` moves by at most `u sum_j p_j |v_j| / l <= u max
/// |v|`, and the tests' values have `max |v|` near the outputs' largest
/// magnitude).
pub fn output_tolerance(kernel: AttentionKernel, dtype: FloatDtype, stored_tol: f64) -> f64 {
    match kernel {
        AttentionKernel::Fragment { .. } | AttentionKernel::Registers { .. }
            if dtype != FloatDtype::F32 =>
        {
            stored_tol + dtype.unit_roundoff()
        }
        _ => stored_tol,
    }
}

/// Tolerance of `kernel`'s gradients stored as `dtype`: `stored_tol`,
/// plus for the fragment and register kernels on a 16-bit type two unit
/// roundoffs of
/// it, because they round the probabilities and their gradient to it
/// before their products (each product's sum moves by at most `u` times
/// the sum of its terms' magnitudes; the tests' random signs keep that
/// near the gradients' largest magnitude). Measured on plain units in f16
/// (lavapipe): dq 6.0e-4, dk 3.9e-4, dv 4.2e-4 against `stored_tol` 5.9e-4
/// and `u` 4.9e-4.
pub fn gradient_tolerance(
    kernel: AttentionBackwardKernel,
    dtype: FloatDtype,
    stored_tol: f64,
) -> f64 {
    match (kernel, dtype) {
        (
            AttentionBackwardKernel::Fragment { .. } | AttentionBackwardKernel::Registers { .. },
            FloatDtype::F32,
        ) => stored_tol,
        (
            AttentionBackwardKernel::Fragment { .. } | AttentionBackwardKernel::Registers { .. },
            _,
        ) => stored_tol + 2.0 * dtype.unit_roundoff(),
        _ => stored_tol,
    }
}

/// `values` widened to f64.
pub fn to_f64(values: &[f32]) -> Vec<f64> {
    values.iter().map(|&x| x as f64).collect()
}

/// Largest `|got - want|` divided by the largest `|want|`.
pub fn relative_error(got: &[f32], want: &[f64]) -> f64 {
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
pub fn check_case(case: Case, seed: u64) -> f64 {
    check_case_as(FloatDtype::F32, case, seed, row_and_chosen)
}

/// [`check_case_with`] running the row and the chosen backward.
pub fn check_case_as(dtype: FloatDtype, case: Case, seed: u64, forward: ForwardKernels) -> f64 {
    check_case_with(dtype, case, seed, forward, row_and_chosen_backward)
}

/// [`check_case`] with `q`, `k`, `v`, `d_out`, the output and the gradients
/// stored as `dtype` (the log-sum-exp and the slopes f32), each forward
/// kernel of `forward` and each backward kernel of `backward` (the
/// backward on the output of the forward the launcher chooses). The
/// reference gets the same rounded inputs; its backward takes the kernel's
/// stored output for `delta = rowsum(dO * out)`, as the backward kernel
/// does (the forward output is checked on its own). Outputs of `dtype` must
/// be within [`common::tolerance`] of [`TOLERANCE`], the log-sum-exp within
/// [`TOLERANCE`].
pub fn check_case_with(
    dtype: FloatDtype,
    case: Case,
    seed: u64,
    forward: ForwardKernels,
    backward: BackwardKernels,
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
        matrix_units: MatrixUnits::Off,
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
    let mut errors = Vec::new();
    for kernel in forward(&client, s.head_dim, dtype) {
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
    let out = download_as(&client, dtype, &fwd.out);
    let want_grads = if dtype == FloatDtype::F32 {
        problem.backward(&to_f64(&d_out))
    } else {
        problem.backward_given_out(&to_f64(&d_out), &to_f64(&out))
    };
    for kernel in backward(&client, s.head_dim) {
        let grads = attention_backward_with(
            &client, kernel, dtype, s, options, inputs, &fwd.out, &fwd.lse, &do_h,
        )
        .expect("backward launch");
        for (name, got, want) in [
            ("dq", &grads.dq, &want_grads.dq),
            ("dk", &grads.dk, &want_grads.dk),
            ("dv", &grads.dv, &want_grads.dv),
        ] {
            errors.push((
                format!("{name} ({})", kernel.name()),
                relative_error(&download_as(&client, dtype, got), want),
                gradient_tolerance(kernel, dtype, stored_tol),
            ));
        }
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
fn matrix_unit_runs_cover_every_case_type_and_tile_pair() {
    use FloatDtype::{Bf16, Bf16InF32, F16};
    assert_eq!(
        matrix_unit_runs(&[Bf16, F16, Bf16InF32], 4, &[1, 3]),
        vec![
            (Bf16, 0, false),
            (Bf16, 1, true),
            (Bf16, 2, false),
            (Bf16, 3, true),
            (F16, 1, false),
            (F16, 3, false),
            (Bf16InF32, 1, false),
            (Bf16InF32, 3, false),
        ]
    );
    assert!(matrix_unit_runs(&[], 4, &[1]).is_empty());
}
