//! The tiled FlashAttention-2 backward (dK/dV and dQ kernels with tiles in
//! shared memory) against the f64 reference: causal and not, GQA groups of
//! 1, 2 and 4, ALiBi, ragged sequence lengths, head dimensions 32, 64 and
//! 128, f32, f16 and bf16 storage, every tile pair that fits the device;
//! and the launcher's refusals. Each case runs the forward the launcher
//! chooses only (the forward kernels have their own tests in
//! `attention.rs`): every kernel variant is one more shader to compile,
//! slow on lavapipe.

use crate::attention_support;
use crate::common;

use attention_support::check::{case, check_case_with, chosen_backward};
use common::{client, download, upload, Rng, R};
use cubecl::prelude::*;
use ferrotron_kernels::attention::{
    attention_backward_with, attention_forward, AttentionBackwardKernel, AttentionError,
    AttentionInputs, AttentionKernel, AttentionOptions, AttentionShape, BACKWARD_TILES,
};
use ferrotron_kernels::FloatDtype;

/// The forward kernel the launcher chooses for `head_dim`.
fn chosen_forward(
    client: &ComputeClient<R>,
    head_dim: usize,
    _: FloatDtype,
) -> Vec<AttentionKernel> {
    vec![AttentionKernel::choose(client, head_dim)]
}

/// The tiled backward at every tile pair of [`BACKWARD_TILES`] whose shared
/// memory fits the device.
fn every_tiled_backward(
    client: &ComputeClient<R>,
    head_dim: usize,
) -> Vec<AttentionBackwardKernel> {
    let max_shared = client.properties().hardware.max_shared_memory_size;
    BACKWARD_TILES
        .into_iter()
        .map(|(outer, inner)| AttentionBackwardKernel::Tiled { outer, inner })
        .filter(|kernel| kernel.shared_bytes(head_dim) <= max_shared)
        .collect()
}

#[test]
fn the_tiled_backward_runs_on_this_device() {
    // The tests below check the tiled backward where it fits the device: a
    // device without the shared memory for it fails here rather than
    // leaving it unchecked.
    let client = client();
    for head_dim in [32, 64, 128] {
        let chosen = AttentionBackwardKernel::choose(&client, head_dim);
        eprintln!(
            "head_dim {head_dim}: backward chosen {chosen:?}, fitting {:?} ({} bytes of shared \
             memory per cube on this device)",
            every_tiled_backward(&client, head_dim),
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
    // tile; head dimensions 32, 64 and 128.
    let cases = [
        case(1, 4, 4, 100, 32, true, false),
        case(2, 4, 2, 77, 64, false, true),
        case(1, 8, 2, 130, 128, true, true),
        case(1, 4, 1, 256, 64, true, false),
        case(1, 2, 2, 9, 128, false, false),
        case(1, 4, 1, 45, 32, false, true),
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
fn tiled_backward_matches_reference_at_every_tile_pair() {
    // Each tile pair that fits at head_dim 32 (on a 32 KiB device all
    // four), one below a multiple of every tile, causal with ALiBi and GQA.
    check_case_with(
        FloatDtype::F32,
        case(1, 4, 2, 63, 32, true, true),
        920,
        chosen_forward,
        every_tiled_backward,
    );
}

#[test]
fn tiled_backward_matches_reference_in_f16_and_bf16() {
    for dtype in common::low_precision_dtypes(&client()) {
        check_case_with(
            dtype,
            case(1, 4, 2, 70, 64, true, true),
            940,
            chosen_forward,
            chosen_backward,
        );
    }
}

#[test]
fn tiled_backward_is_deterministic() {
    let s = AttentionShape {
        batch: 1,
        n_heads: 4,
        n_kv_heads: 1,
        seq: 70,
        head_dim: 64,
    };
    let mut rng = Rng::new(12);
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
    let kernel = AttentionBackwardKernel::choose(&client, s.head_dim);
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
    assert_eq!(run(), run());
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
