//! The fused path: ferrotron-kernels launched on a cubecl runtime's buffers.

use std::time::Instant;

use anyhow::{bail, Context, Result};
use burn::tensor::bf16;
use cubecl::future::block_on;
use cubecl::prelude::*;
use cubecl::server::Handle;
use ferrotron_kernels::attention::{
    attention_backward_with, attention_forward_with, AttentionBackwardKernel, AttentionInputs,
    AttentionKernel, AttentionOptions, AttentionShape, MatrixUnits,
};
use ferrotron_kernels::cross_entropy::cross_entropy_forward_backward;
use ferrotron_kernels::norm::layer::{layer_norm_backward, layer_norm_forward};
use ferrotron_kernels::norm::rms::{rms_norm_backward, rms_norm_forward};
use ferrotron_kernels::rope::{rope_backward, rope_forward, RopeShape};
use ferrotron_kernels::swiglu::{swiglu_backward, swiglu_forward};
use ferrotron_kernels::FloatDtype;
use ferrotron_models::rope_scaling::inv_freq;

use super::cases::{pattern, targets, AttentionPath, Case, MmaTiles, NORM_EPS, ROPE_THETA};
use super::kernels::Sample;

/// Device bytes in active allocations (`MemoryUsage::bytes_in_use`).
pub fn in_use<R: Runtime>(client: &ComputeClient<R>) -> Result<u64> {
    Ok(client
        .memory_usage()
        .context("cubecl memory usage")?
        .bytes_in_use)
}

fn upload<R: Runtime>(client: &ComputeClient<R>, data: &[f32]) -> Handle {
    client.create_from_slice(f32::as_bytes(data))
}

/// Waits until every kernel submitted to `client` has finished.
pub fn sync<R: Runtime>(client: &ComputeClient<R>) -> Result<()> {
    block_on(client.sync()).context("cubecl device sync")
}

/// Runs forward + backward of `case` once. Inputs (and the upstream
/// gradient, all ones, as Burn's `backward()` seeds it) are uploaded before
/// the clock starts; the clock stops after `client.sync()`. Memory is the
/// device `bytes_in_use` after the backward, with every input, output and
/// saved tensor still alive, minus that before the inputs were uploaded.
/// Attention also times its forward alone (a sync after it), and runs one
/// untimed forward right before the clock starts.
pub fn run<R: Runtime>(client: &ComputeClient<R>, case: &Case) -> Result<Sample> {
    let base = in_use(client)?;
    match *case {
        Case::Attention {
            batch,
            heads,
            seq,
            head_dim,
            forward,
        } => {
            let shape = AttentionShape {
                batch,
                n_heads: heads,
                n_kv_heads: heads,
                seq,
                head_dim,
            };
            attention(client, base, shape, forward)
        }
        Case::Swiglu { rows, ffn } => swiglu(client, base, rows * ffn),
        Case::Norm {
            layer,
            batch,
            seq,
            hidden,
        } => norm(client, base, layer, batch * seq, hidden),
        Case::Rope {
            batch,
            heads,
            seq,
            head_dim,
        } => rope(
            client,
            base,
            RopeShape {
                batch,
                heads,
                seq,
                head_dim,
            },
        ),
        Case::CrossEntropy { rows, vocab } => cross_entropy(client, base, rows, vocab),
    }
}

/// Waits for the device, stops the clock and reads the memory in use; the
/// caller's buffers are still alive.
fn finish<R: Runtime>(client: &ComputeClient<R>, start: Instant, base: u64) -> Result<Sample> {
    sync(client)?;
    let elapsed = start.elapsed();
    Ok(Sample {
        elapsed,
        forward: None,
        peak_bytes: in_use(client)?.saturating_sub(base),
    })
}

fn rand<R: Runtime>(client: &ComputeClient<R>, n: usize, salt: u64) -> Handle {
    upload(client, &pattern(n, salt))
}

fn ones<R: Runtime>(client: &ComputeClient<R>, n: usize) -> Handle {
    upload(client, &vec![1.0; n])
}

/// The kernels of `path`: the forward kernel, the backward kernels and the
/// storage type. The row forward with the row backward (f32); the tiled
/// forward (f32) at the largest tile that fits the device with the
/// backward the launcher chooses (tiled where it fits); the fragment
/// forward (bf16) and backward on the matrix units, each at the largest
/// tiles that fit, else the backward the launcher chooses; the register
/// forward and backward on the `mma` instruction (bf16), each at the
/// largest tiles that fit (else the backward the launcher chooses) or at
/// the tiles the path names. `None` when the device cannot run the
/// forward, or the tiles named do not fit its shared memory.
pub fn attention_kernels<R: Runtime>(
    client: &ComputeClient<R>,
    head_dim: usize,
    path: AttentionPath,
) -> Option<(AttentionKernel, AttentionBackwardKernel, FloatDtype)> {
    let max_shared = client.properties().hardware.max_shared_memory_size;
    let chosen_backward = AttentionBackwardKernel::choose(client, head_dim);
    match path {
        AttentionPath::Row => Some((
            AttentionKernel::Row,
            AttentionBackwardKernel::Row,
            FloatDtype::F32,
        )),
        AttentionPath::Tiled => match AttentionKernel::for_shared_memory(max_shared, head_dim) {
            AttentionKernel::Row => None,
            kernel => Some((kernel, chosen_backward, FloatDtype::F32)),
        },
        // The forward on the matrix units implies that they run bf16.
        AttentionPath::CmmaBf16 => {
            AttentionKernel::on_matrix_units(client, head_dim, FloatDtype::Bf16).map(|forward| {
                let backward = AttentionBackwardKernel::fragment_for(max_shared, head_dim, true)
                    .unwrap_or(chosen_backward);
                (forward, backward, FloatDtype::Bf16)
            })
        }
        AttentionPath::MmaBf16(tiles) => {
            if !AttentionKernel::mma_runs(client, FloatDtype::Bf16) {
                return None;
            }
            // The largest forward also says whether head_dim runs at all.
            let largest = AttentionKernel::registers_for(max_shared, head_dim, true)?;
            let largest_backward =
                AttentionBackwardKernel::registers_for(max_shared, head_dim, true);
            let (forward, backward) = match tiles {
                MmaTiles::Largest => (largest, largest_backward.unwrap_or(chosen_backward)),
                MmaTiles::Forward(planes, keys) => (
                    AttentionKernel::Registers {
                        planes,
                        keys,
                        matrix_units: true,
                    },
                    largest_backward.unwrap_or(chosen_backward),
                ),
                MmaTiles::Backward(planes, inner) => (
                    largest,
                    AttentionBackwardKernel::Registers {
                        planes,
                        inner,
                        matrix_units: true,
                    },
                ),
            };
            // The launcher's choices fit by construction; named tiles may not.
            let fits = forward.shared_bytes(head_dim) <= max_shared
                && backward.shared_bytes(head_dim) <= max_shared;
            fits.then_some((forward, backward, FloatDtype::Bf16))
        }
    }
}

/// Uploads `data` as `dtype` (f32 or bf16).
fn upload_as<R: Runtime>(client: &ComputeClient<R>, dtype: FloatDtype, data: &[f32]) -> Handle {
    match dtype {
        FloatDtype::Bf16 => {
            let values: Vec<bf16> = data.iter().map(|&x| bf16::from_f32(x)).collect();
            client.create_from_slice(bf16::as_bytes(&values))
        }
        _ => upload(client, data),
    }
}

fn attention<R: Runtime>(
    client: &ComputeClient<R>,
    base: u64,
    shape: AttentionShape,
    path: AttentionPath,
) -> Result<Sample> {
    let Some((kernel, backward, dtype)) = attention_kernels(client, shape.head_dim, path) else {
        bail!("{path:?}: the attention kernel does not run on this device")
    };
    let q = upload_as(client, dtype, &pattern(shape.q_elems(), 1));
    let k = upload_as(client, dtype, &pattern(shape.kv_elems(), 2));
    let v = upload_as(client, dtype, &pattern(shape.kv_elems(), 3));
    let d_out = upload_as(client, dtype, &vec![1.0; shape.q_elems()]);
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
    // An untimed forward first, so that the timed one starts as in a run
    // of back-to-back calls: on a device that was just busy (not idle
    // since the inputs' upload from the host) with the inputs in its
    // caches, as PyTorch's are timed (scripts/bench_torch_attention.py).
    drop(attention_forward_with(
        client, kernel, dtype, shape, options, inputs,
    )?);
    sync(client)?;
    let start = Instant::now();
    let fwd = attention_forward_with(client, kernel, dtype, shape, options, inputs)?;
    sync(client)?;
    let forward = start.elapsed();
    let _grads = attention_backward_with(
        client, backward, dtype, shape, options, inputs, &fwd.out, &fwd.lse, &d_out,
    )?;
    let mut sample = finish(client, start, base)?;
    sample.forward = Some(forward);
    Ok(sample)
}

fn swiglu<R: Runtime>(client: &ComputeClient<R>, base: u64, len: usize) -> Result<Sample> {
    let (gate, up, d_out) = (
        rand(client, len, 1),
        rand(client, len, 2),
        ones(client, len),
    );
    sync(client)?;
    let start = Instant::now();
    let [out, d_gate, d_up] = [(); 3].map(|_| client.empty(len * 4));
    swiglu_forward(client, &gate, &up, &out, len)?;
    swiglu_backward(client, &gate, &up, &d_out, &d_gate, &d_up, len)?;
    finish(client, start, base)
}

fn norm<R: Runtime>(
    client: &ComputeClient<R>,
    base: u64,
    layer: bool,
    rows: usize,
    hidden: usize,
) -> Result<Sample> {
    let n = rows * hidden;
    let (x, dy) = (rand(client, n, 1), ones(client, n));
    let (weight, bias) = (ones(client, hidden), upload(client, &vec![0.0; hidden]));
    sync(client)?;
    let start = Instant::now();
    let [y, dx] = [(); 2].map(|_| client.empty(n * 4));
    let [d_weight, d_bias] = [(); 2].map(|_| client.empty(hidden * 4));
    let [mean, rstd] = [(); 2].map(|_| client.empty(rows * 4));
    if layer {
        layer_norm_forward(
            client, &x, &weight, &bias, &y, &mean, &rstd, rows, hidden, NORM_EPS,
        )?;
        layer_norm_backward(
            client, &x, &weight, &mean, &rstd, &dy, &dx, &d_weight, &d_bias, rows, hidden,
        )?;
    } else {
        rms_norm_forward(client, &x, &weight, &y, &rstd, rows, hidden, NORM_EPS)?;
        rms_norm_backward(
            client, &x, &weight, &rstd, &dy, &dx, &d_weight, rows, hidden,
        )?;
    }
    finish(client, start, base)
}

fn rope<R: Runtime>(client: &ComputeClient<R>, base: u64, shape: RopeShape) -> Result<Sample> {
    let n = shape.batch * shape.heads * shape.seq * shape.head_dim;
    let (x, d_x) = (rand(client, n, 1), ones(client, n));
    let freqs = upload(client, &inv_freq(ROPE_THETA, None, shape.head_dim));
    sync(client)?;
    let start = Instant::now();
    rope_forward(client, &x, &freqs, shape, 0)?;
    rope_backward(client, &d_x, &freqs, shape, 0)?;
    finish(client, start, base)
}

fn cross_entropy<R: Runtime>(
    client: &ComputeClient<R>,
    base: u64,
    rows: usize,
    vocab: usize,
) -> Result<Sample> {
    let logits = rand(client, rows * vocab, 1);
    let targets = client.create_from_slice(u32::as_bytes(&targets(rows, vocab)));
    sync(client)?;
    let start = Instant::now();
    let [row_loss, mean_loss] = [rows, 1].map(|n| client.empty(n * 4));
    cross_entropy_forward_backward(
        client, &logits, &targets, &row_loss, &mean_loss, rows, vocab, 1.0,
    )?;
    finish(client, start, base)
}
