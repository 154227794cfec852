//! The tiled FlashAttention-2 backward (dK/dV and dQ kernels with tiles in
//! shared memory) against the f64 reference: causal and not, GQA groups of
//! 1, 2 and 4, ALiBi, ragged sequence lengths, head dimensions 32, 64 and
//! 128, every tile pair that fits the device; and the launcher's refusals.
//! f16, bf16 and determinism are checked with the row backward in
//! `attention.rs`. Each case runs the forward the launcher chooses only
//! (the forward kernels have their own tests in `attention.rs`), and the
//! mask/ALiBi combinations the other cases compile at each head dimension:
//! every kernel variant is one more shader to compile, slow on lavapipe
//! (about 10 s each for the tiled backward).

use crate::attention_support;
use crate::common;

use attention_support::check::{case, check_case_with, chosen_backward, chosen_forward};
use common::{client, upload, R};
use cubecl::prelude::*;
use ferrotron_kernels::attention::{
    attention_backward_with, AttentionBackwardKernel, AttentionError, AttentionInputs,
    AttentionOptions, AttentionShape, BACKWARD_TILES,
};
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
    // pair).
    let cases = [
        case(1, 4, 4, 100, 32, true, true),
        case(2, 4, 2, 77, 64, false, true),
        case(1, 8, 2, 130, 128, true, true),
        case(1, 4, 1, 256, 64, true, false),
        case(1, 2, 2, 9, 128, false, false),
        case(1, 4, 1, 45, 32, true, true),
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
