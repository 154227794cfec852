//! The tiled FlashAttention-2 backward (dK/dV and dQ kernels with tiles in
//! shared memory) against the f64 reference: causal and not, GQA groups of
//! 1, 2 and 4, ALiBi, ragged sequence lengths, head dimensions 32, 48, 64
//! and 128, every tile pair that fits the device; and the launcher's refusals.
//! The fragment backward (the same algorithm with its products in 16 x 16
//! x 16 fragments) on plain units in f32 and f16 here, and on the matrix
//! units where the device has them (the `test-cuda` build); likewise the
//! register backward (the register forward's scheme) on plain units and
//! on the `mma` instruction, each on the matrix units at every tile pair in
//! two cases and at the launcher's tiles in the others
//! (`attention_support::check::matrix_unit_runs`).
//! f16, bf16 and determinism are checked with the row backward in
//! `attention.rs`. Each case runs the forward the launcher chooses only
//! (the forward kernels have their own tests in `attention.rs`), and the
//! mask/ALiBi combinations the other cases compile at each head dimension:
//! every kernel variant is one more shader to compile, slow on lavapipe
//! (about 10 s each for the tiled backward).

use crate::attention_support;
use crate::common;

use attention_support::check::{
    case, check_case_with, chosen_backward, chosen_forward, matrix_unit_dtypes, matrix_unit_runs,
    BackwardKernels,
};
use common::{client, upload, R};
use cubecl::prelude::*;
use ferrotron_kernels::attention::{
    attention_backward_with, AttentionBackwardKernel, AttentionError, AttentionInputs,
    AttentionOptions, AttentionShape, BACKWARD_TILES,
};
use ferrotron_kernels::attention::{FRAGMENT_TILES, MMA_BACKWARD_TILES};
use ferrotron_kernels::FloatDtype;

/// Head dimensions whose chosen backward `tiled_backward_matches_reference`
/// checks.
const CHECKED_HEAD_DIMS: [usize; 3] = [32, 64, 128];

/// The tiled backward at each tile pair of [`BACKWARD_TILES`] whose shared
/// memory fits the device at `head_dim` and that the launcher chooses at
/// none of [`CHECKED_HEAD_DIMS`] (those are checked there): on a 32 KiB
/// device it chooses 32x32, 32x16 and 16x8, which leaves 16x16.
fn tile_pairs_not_chosen(
    client: &ComputeClient<R>,
    head_dim: usize,
) -> Vec<AttentionBackwardKernel> {
    let max_shared = client.properties().hardware.max_shared_memory_size;
    let chosen: Vec<_> = CHECKED_HEAD_DIMS
        .iter()
        .map(|&d| AttentionBackwardKernel::choose(client, d))
        .collect();
    BACKWARD_TILES
        .into_iter()
        .map(|(outer, inner)| AttentionBackwardKernel::Tiled { outer, inner })
        .filter(|kernel| kernel.shared_bytes(head_dim) <= max_shared)
        .filter(|kernel| !chosen.contains(kernel))
        .collect()
}

#[test]
fn the_tiled_backward_runs_on_this_device() {
    // The tests below check the tiled backward where it fits the device: a
    // device without the shared memory for it fails here rather than
    // leaving it unchecked.
    let client = client();
    for head_dim in CHECKED_HEAD_DIMS {
        let chosen = AttentionBackwardKernel::choose(&client, head_dim);
        eprintln!(
            "head_dim {head_dim}: backward chosen {chosen:?}, other pairs checked {:?} ({} bytes \
             of shared memory per cube on this device)",
            tile_pairs_not_chosen(&client, head_dim),
            client.properties().hardware.max_shared_memory_size
        );
        assert_ne!(
            chosen,
            AttentionBackwardKernel::Row,
            "head_dim {head_dim}: the tiled backward does not fit this device's shared memory"
        );
    }
}

#[test]
fn tiled_backward_matches_reference() {
    // GQA groups 1, 2 and 4; causal and not; ALiBi; sequences below one
    // tile, ragged (not a multiple of any tile) and a multiple of every
    // tile; head dimensions 32, 64 and 128 (each with its chosen tile
    // pair), and 48.
    let cases = [
        case(1, 4, 4, 100, 32, true, true),
        case(2, 4, 2, 77, 64, false, true),
        case(1, 8, 2, 130, 128, true, true),
        case(1, 4, 1, 256, 64, true, false),
        case(1, 2, 2, 9, 128, false, false),
        case(1, 4, 1, 45, 32, true, true),
        // A head dimension that does not divide the 128 units of a cube
        // (each unit's elements span several columns).
        case(1, 2, 2, 37, 48, true, false),
    ];
    for (seed, c) in cases.into_iter().enumerate() {
        check_case_with(
            FloatDtype::F32,
            c,
            900 + seed as u64,
            chosen_forward,
            chosen_backward,
        );
    }
}

#[test]
fn tiled_backward_matches_reference_at_the_other_tile_pairs() {
    // Each tile pair that fits at head_dim 32 and that no head dimension
    // above chooses, one below a multiple of every tile, causal with ALiBi
    // and GQA.
    check_case_with(
        FloatDtype::F32,
        case(1, 4, 2, 63, 32, true, true),
        920,
        chosen_forward,
        tile_pairs_not_chosen,
    );
}

#[test]
fn the_backward_launcher_refuses_tiles_it_cannot_run() {
    let client = client();
    let s = AttentionShape {
        batch: 1,
        n_heads: 2,
        n_kv_heads: 1,
        seq: 3,
        head_dim: 256,
    };
    let q = upload(&client, &vec![0.0; s.q_elems()]);
    let kv = upload(&client, &vec![0.0; s.kv_elems()]);
    let lse = upload(&client, &vec![0.0; s.rows()]);
    let inputs = AttentionInputs {
        q: &q,
        k: &kv,
        v: &kv,
        alibi_slopes: None,
    };
    let run = |kernel| {
        attention_backward_with(
            &client,
            kernel,
            FloatDtype::F32,
            s,
            AttentionOptions::default(),
            inputs,
            &q,
            &lse,
            &q,
        )
    };
    assert_eq!(
        run(AttentionBackwardKernel::Tiled {
            outer: 8,
            inner: 16
        })
        .unwrap_err(),
        AttentionError::UnsupportedBackwardTiles {
            outer: 8,
            inner: 16
        }
    );
    // 32 x 32 tiles at head_dim 256 need 140,288 bytes: more than lavapipe
    // (32 KiB) has, less than an H100 (227 KiB).
    let big = AttentionBackwardKernel::Tiled {
        outer: 32,
        inner: 32,
    };
    let max = client.properties().hardware.max_shared_memory_size;
    if big.shared_bytes(s.head_dim) > max {
        assert_eq!(
            run(big).unwrap_err(),
            AttentionError::BackwardSharedMemory {
                outer: 32,
                inner: 32,
                needed: 140_288,
                max
            }
        );
    }
}

/// The fragment backward on plain units with the largest tiles that fit
/// the device at `head_dim` (lavapipe's 32 KiB: 32 x 16 at 32, 16 x 16 at
/// 64).
fn fragment_on_plain_units(
    client: &ComputeClient<R>,
    head_dim: usize,
) -> Vec<AttentionBackwardKernel> {
    largest_tiles(
        client,
        head_dim,
        AttentionBackwardKernel::fragment_for,
        false,
    )
}

/// The kernel `kernel_for` gives (the launcher's tiles) for the device's
/// shared memory at `head_dim`, its products on the matrix units or not; a
/// device without the shared memory for any fails.
fn largest_tiles(
    client: &ComputeClient<R>,
    head_dim: usize,
    kernel_for: fn(usize, usize, bool) -> Option<AttentionBackwardKernel>,
    matrix_units: bool,
) -> Vec<AttentionBackwardKernel> {
    let max_shared = client.properties().hardware.max_shared_memory_size;
    vec![kernel_for(max_shared, head_dim, matrix_units)
        .unwrap_or_else(|| panic!("head_dim {head_dim}: no backward tiles fit {max_shared} bytes"))]
}

/// The fragment backward on the matrix units at the launcher's tiles for
/// `head_dim`.
fn fragment_chosen_on_matrix_units(
    client: &ComputeClient<R>,
    head_dim: usize,
) -> Vec<AttentionBackwardKernel> {
    largest_tiles(
        client,
        head_dim,
        AttentionBackwardKernel::fragment_for,
        true,
    )
}

/// The fragment backward on the matrix units at every tile pair of
/// [`FRAGMENT_TILES`] whose shared memory fits the device.
fn fragment_on_matrix_units(
    client: &ComputeClient<R>,
    head_dim: usize,
) -> Vec<AttentionBackwardKernel> {
    let max_shared = client.properties().hardware.max_shared_memory_size;
    FRAGMENT_TILES
        .into_iter()
        .map(|(planes, inner)| AttentionBackwardKernel::Fragment {
            planes,
            inner,
            matrix_units: true,
        })
        .filter(|kernel| kernel.shared_bytes(head_dim) <= max_shared)
        .collect()
}

#[test]
fn fragment_backward_on_plain_units_matches_reference() {
    // f32 operands: two planes at head_dim 32 (causal, ALiBi, GQA 2,
    // ragged); f16 operands, whose probabilities and their gradient are
    // rounded to f16 before their products as on the matrix units: one
    // plane at 64 (causal, ALiBi, GQA 2, ragged). Two cases only: each
    // compiles a forward and two backward shaders, minutes on lavapipe.
    check_case_with(
        FloatDtype::F32,
        case(1, 4, 2, 100, 32, true, true),
        940,
        chosen_forward,
        fragment_on_plain_units,
    );
    let client = client();
    assert!(
        FloatDtype::F16.is_supported(&client),
        "f16 is not supported on this device: the fragment backward's 16-bit rounding is unchecked"
    );
    check_case_with(
        FloatDtype::F16,
        case(1, 4, 2, 77, 64, true, true),
        950,
        chosen_forward,
        fragment_on_plain_units,
    );
}

#[test]
fn fragment_backward_on_matrix_units_matches_reference_where_it_runs() {
    // Runs where the device has 16x16x16 cmma (tensor cores); lavapipe
    // has none, and the `test-cuda` build requires it.
    check_in_16_bits_on_matrix_units(
        AttentionBackwardKernel::matrix_units_run,
        fragment_chosen_on_matrix_units,
        fragment_on_matrix_units,
        "fragment backward",
        960,
    );
}

/// Checks a backward on the matrix units in the 16-bit types the device
/// `runs` it in, as [`matrix_unit_runs`] spreads the cases over them: the
/// launcher's tiles (`chosen`), and in the wide cases (not causal at head
/// dim 32; causal with ALiBi at 128 over several tiles) `every` tile pair
/// that fits. Head dimensions 16 to 128, GQA, causal and not, ALiBi,
/// sequences below, at and above one tile; seeds from `first_seed`. Says
/// so where no type runs (and fails in the `test-cuda` build, which
/// requires them).
fn check_in_16_bits_on_matrix_units(
    runs: fn(&ComputeClient<R>, FloatDtype) -> bool,
    chosen: BackwardKernels,
    every: BackwardKernels,
    what: &str,
    first_seed: u64,
) {
    let dtypes = matrix_unit_dtypes(runs, what);
    let cases = [
        case(1, 4, 2, 63, 64, true, true),
        case(1, 2, 1, 64, 128, true, false),
        case(2, 4, 4, 65, 32, false, true),
        case(1, 8, 2, 257, 128, true, true),
        case(1, 2, 2, 130, 16, false, false),
    ];
    for (dtype, i, wide) in matrix_unit_runs(&dtypes, cases.len(), &[2, 3]) {
        let backward = if wide { every } else { chosen };
        check_case_with(
            dtype,
            cases[i],
            first_seed + i as u64,
            chosen_forward,
            backward,
        );
    }
}

/// The register backward on plain units with the largest tiles that fit
/// the device at `head_dim` (lavapipe's 32 KiB: 64 x 16 at 32, 32 x 16 at
/// 64).
fn registers_on_plain_units(
    client: &ComputeClient<R>,
    head_dim: usize,
) -> Vec<AttentionBackwardKernel> {
    largest_tiles(
        client,
        head_dim,
        AttentionBackwardKernel::registers_for,
        false,
    )
}

/// The register backward on the `mma` instruction at the launcher's tiles
/// for `head_dim`.
fn registers_chosen_on_matrix_units(
    client: &ComputeClient<R>,
    head_dim: usize,
) -> Vec<AttentionBackwardKernel> {
    largest_tiles(
        client,
        head_dim,
        AttentionBackwardKernel::registers_for,
        true,
    )
}

/// The register backward on the `mma` instruction at every tile pair of
/// [`MMA_BACKWARD_TILES`] whose shared memory fits the device.
fn registers_on_matrix_units(
    client: &ComputeClient<R>,
    head_dim: usize,
) -> Vec<AttentionBackwardKernel> {
    let max_shared = client.properties().hardware.max_shared_memory_size;
    MMA_BACKWARD_TILES
        .into_iter()
        .map(|(planes, inner)| AttentionBackwardKernel::Registers {
            planes,
            inner,
            matrix_units: true,
        })
        .filter(|kernel| kernel.shared_bytes(head_dim) <= max_shared)
        .collect()
}

// The register backward's layouts, masking and in-place reuse of the
// accumulators as left operands, with its products on plain units, in two
// tests so that lavapipe compiles their kernels at once (each takes
// minutes there: the plain-unit products' barriers become LLVM coroutine
// suspensions).
#[test]
fn register_backward_on_plain_units_matches_reference_in_f32() {
    // f32 operands at head_dim 32 (causal, ALiBi, GQA 2, ragged).
    check_case_with(
        FloatDtype::F32,
        case(1, 4, 2, 100, 32, true, true),
        1040,
        chosen_forward,
        registers_on_plain_units,
    );
}

#[test]
fn register_backward_on_plain_units_matches_reference_in_f16() {
    // f16 operands (the probabilities and their gradient rounded to f16
    // before their products, as on the matrix units) at head_dim 64
    // (causal, GQA 2, ragged).
    let client = client();
    assert!(
        FloatDtype::F16.is_supported(&client),
        "f16 is not supported on this device: the register backward's 16-bit rounding is unchecked"
    );
    check_case_with(
        FloatDtype::F16,
        case(1, 4, 2, 77, 64, true, false),
        1050,
        chosen_forward,
        registers_on_plain_units,
    );
}

#[test]
fn register_backward_on_matrix_units_matches_reference_where_it_runs() {
    // Runs where the device has the 16 x 8 x 16 `mma` (NVIDIA from
    // sm_80); lavapipe has none, and the `test-cuda` build requires it.
    check_in_16_bits_on_matrix_units(
        AttentionBackwardKernel::mma_runs,
        registers_chosen_on_matrix_units,
        registers_on_matrix_units,
        "register backward",
        1060,
    );
}

#[test]
fn the_backward_launcher_refuses_fragments_it_cannot_run() {
    let client = client();
    let s = AttentionShape {
        batch: 1,
        n_heads: 2,
        n_kv_heads: 1,
        seq: 3,
        head_dim: 64,
    };
    let q = upload(&client, &vec![0.0; s.q_elems()]);
    let kv = upload(&client, &vec![0.0; s.kv_elems()]);
    let lse = upload(&client, &vec![0.0; s.rows()]);
    let inputs = AttentionInputs {
        q: &q,
        k: &kv,
        v: &kv,
        alibi_slopes: None,
    };
    let run = |kernel, shape| {
        attention_backward_with(
            &client,
            kernel,
            FloatDtype::F32,
            shape,
            AttentionOptions::default(),
            inputs,
            &q,
            &lse,
            &q,
        )
    };
    let fragment = |planes, matrix_units| AttentionBackwardKernel::Fragment {
        planes,
        inner: 16,
        matrix_units,
    };
    // f32 never runs on the matrix units.
    assert_eq!(
        run(fragment(1, true), s).unwrap_err(),
        AttentionError::MatrixUnitsUnsupported { dtype: "f32" }
    );
    // Three planes are not compiled; head_dim 24 is not whole 16-column
    // blocks.
    assert_eq!(
        run(fragment(3, false), s).unwrap_err(),
        AttentionError::UnsupportedFragment {
            outer: 48,
            inner: 16,
            head_dim: 64
        }
    );
    let narrow = AttentionShape { head_dim: 24, ..s };
    assert_eq!(
        run(fragment(1, false), narrow).unwrap_err(),
        AttentionError::UnsupportedFragment {
            outer: 16,
            inner: 16,
            head_dim: 24
        }
    );
}
