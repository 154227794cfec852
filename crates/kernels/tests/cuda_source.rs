//! Every kernel, through its public launcher, compiled to CUDA C++ for
//! `sm_80` and `sm_90` on the recording runtime (`cuda_source`): no GPU,
//! no CUDA toolkit. Checks that CubeCL's CUDA compiler takes each kernel
//! the launchers pick for those architectures, and that the matrix-unit
//! kernels use the instructions they are written for.
//!
//! With `FERROTRON_CUDA_SOURCE_DIR` set, the sources are written there as
//! `ARCH/GROUP/NN-ENTRY.cu` for `scripts/cuda_compile_check.sh`, which
//! compiles them with NVRTC.

use std::path::PathBuf;

use cubecl::client::ComputeClient;
use cubecl::server::Handle;
use ferrotron_kernels::adamw::{adamw_update, AdamWScalars};
use ferrotron_kernels::attention::{
    attention_backward_typed, attention_forward_typed, AttentionInputs, AttentionKernel,
    AttentionOptions, AttentionShape, MatrixUnits,
};
use ferrotron_kernels::bias::{bias_add, bias_grad};
use ferrotron_kernels::cross_entropy::cross_entropy_forward_backward_typed;
use ferrotron_kernels::cuda_source::{client, recorded, CudaArch, CudaSourceRuntime, KernelSource};
use ferrotron_kernels::embedding::embedding_grad;
use ferrotron_kernels::gelu::{gelu_tanh_backward, gelu_tanh_forward};
use ferrotron_kernels::norm::layer::{layer_norm_backward_typed, layer_norm_forward_typed};
use ferrotron_kernels::norm::rms::{rms_norm_backward_typed, rms_norm_forward_typed};
use ferrotron_kernels::rope::{rope_backward_typed, rope_forward_typed, RopeShape};
use ferrotron_kernels::swiglu::{swiglu_backward_typed, swiglu_forward_typed};
use ferrotron_kernels::FloatDtype;

type Client = ComputeClient<CudaSourceRuntime>;

const DTYPES: [FloatDtype; 3] = [FloatDtype::F32, FloatDtype::F16, FloatDtype::Bf16];

/// The instruction the register kernels are built on.
const MMA: &str = "mma.sync.aligned.m16n8k16";

/// The fragment product the fragment kernels are built on (`mma.h`).
const WMMA: &str = "wmma::mma_sync";

/// The shared-memory load of the register kernels' operands.
const LDMATRIX: &str = "ldmatrix.sync.aligned.m8n8";

/// A buffer of `elems` values of `bytes` each (never stored).
fn buffer(client: &Client, elems: usize, bytes: usize) -> Handle {
    client.empty(elems * bytes)
}

/// Forward and backward of the attention kernel `units` selects, causal,
/// GQA 8/2 heads, 1024 rows.
fn launch_attention(client: &Client, dtype: FloatDtype, head_dim: usize, units: MatrixUnits) {
    let shape = AttentionShape {
        batch: 1,
        n_heads: 8,
        n_kv_heads: 2,
        seq: 1024,
        head_dim,
    };
    let size = dtype.size_bytes();
    let (q, d_out) = (
        buffer(client, shape.q_elems(), size),
        buffer(client, shape.q_elems(), size),
    );
    let (k, v) = (
        buffer(client, shape.kv_elems(), size),
        buffer(client, shape.kv_elems(), size),
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
        matrix_units: units,
    };
    let forward = attention_forward_typed(client, dtype, shape, options, inputs)
        .unwrap_or_else(|e| panic!("{dtype:?} d{head_dim} {units:?} forward: {e}"));
    attention_backward_typed(
        client,
        dtype,
        shape,
        options,
        inputs,
        &forward.out,
        &forward.lse,
        &d_out,
    )
    .unwrap_or_else(|e| panic!("{dtype:?} d{head_dim} {units:?} backward: {e}"));
}

/// The norms, RoPE, SwiGLU, GELU, the bias kernels and the cross-entropy
/// in `dtype`, at GPT-2 small's widths.
fn launch_ops(client: &Client, dtype: FloatDtype) {
    let (rows, hidden, size) = (256, 768, dtype.size_bytes());
    let x = buffer(client, rows * hidden, size);
    let y = buffer(client, rows * hidden, size);
    let d_x = buffer(client, rows * hidden, size);
    let weight = buffer(client, hidden, size);
    let d_weight = buffer(client, hidden, size);
    let stats = buffer(client, rows, 4);
    let mean = buffer(client, rows, 4);
    rms_norm_forward_typed(client, dtype, &x, &weight, &y, &stats, rows, hidden, 1e-5).unwrap();
    rms_norm_backward_typed(
        client, dtype, &x, &weight, &stats, &y, &d_x, &d_weight, rows, hidden,
    )
    .unwrap();
    let bias = buffer(client, hidden, size);
    layer_norm_forward_typed(
        client, dtype, &x, &weight, &bias, &y, &mean, &stats, rows, hidden, 1e-5,
    )
    .unwrap();
    layer_norm_backward_typed(
        client, dtype, &x, &weight, &mean, &stats, &y, &d_x, &d_weight, &bias, rows, hidden,
    )
    .unwrap();
    let rope = RopeShape {
        batch: 1,
        heads: 6,
        seq: rows,
        head_dim: 128,
    };
    let inv_freq = buffer(client, 64, 4);
    rope_forward_typed(client, dtype, &x, &inv_freq, rope, 0).unwrap();
    rope_backward_typed(client, dtype, &d_x, &inv_freq, rope, 0).unwrap();
    let len = rows * hidden;
    swiglu_forward_typed(client, dtype, &x, &y, &d_x, len).unwrap();
    let (d_gate, d_up) = (buffer(client, len, size), buffer(client, len, size));
    swiglu_backward_typed(client, dtype, &x, &y, &d_x, &d_gate, &d_up, len).unwrap();
    gelu_tanh_forward(client, dtype, &x, &y, len).unwrap();
    gelu_tanh_backward(client, dtype, &x, &y, &d_x, len).unwrap();
    let linear_bias = buffer(client, hidden, 4);
    bias_add(client, dtype, &y, &linear_bias, rows, hidden).unwrap();
    bias_grad(client, dtype, &y, &linear_bias, rows, hidden).unwrap();
    let vocab = 50_257;
    let logits = buffer(client, rows * vocab, size);
    let targets = buffer(client, rows, 4);
    let (row_loss, mean_loss) = (buffer(client, rows, 4), buffer(client, 1, 4));
    cross_entropy_forward_backward_typed(
        client, dtype, &logits, &targets, &row_loss, &mean_loss, rows, vocab, 1.0,
    )
    .unwrap();
}

/// The f32-only kernels: the embedding gradient and AdamW's update.
fn launch_f32_only(client: &Client) {
    let (tokens, dim, vocab) = (1024, 768, 50_257);
    let ids = buffer(client, tokens, 4);
    let d_rows = buffer(client, tokens * dim, 4);
    let d_table = buffer(client, vocab * dim, 4);
    embedding_grad(client, &ids, &d_rows, &d_table, tokens, dim, vocab).unwrap();
    let len = 4096;
    let [p, g, m, v] = [0; 4].map(|_| buffer(client, len, 4));
    let scalars = AdamWScalars {
        beta1: 0.9,
        one_minus_beta1: 0.1,
        beta2: 0.999,
        one_minus_beta2: 0.001,
        bias2_sqrt: 1.0,
        eps: 1e-8,
        step_size: 1e-3,
        decay: Some(0.999),
    };
    adamw_update(client, &p, &g, &m, &v, len, scalars).unwrap();
}

/// Every group of launches of one architecture, with its recorded sources.
fn compile_all(arch: CudaArch) -> Vec<(String, Vec<KernelSource>)> {
    let client = client(arch);
    let mut groups = Vec::new();
    let take = |name: String, groups: &mut Vec<_>| groups.push((name, recorded(&client)));
    for dtype in DTYPES {
        for head_dim in [64, 128] {
            let mut choices = vec![MatrixUnits::Off];
            if dtype != FloatDtype::F32 {
                choices.extend([MatrixUnits::Fragments, MatrixUnits::Registers]);
            }
            for units in choices {
                launch_attention(&client, dtype, head_dim, units);
                take(
                    format!("attention-{}-d{head_dim}-{units:?}", dtype.name()),
                    &mut groups,
                );
            }
        }
        launch_ops(&client, dtype);
        take(format!("ops-{}", dtype.name()), &mut groups);
    }
    launch_f32_only(&client);
    take("ops-f32-only".to_string(), &mut groups);
    groups
}

/// Writes each source as `ROOT/ARCH/GROUP/NN-ENTRY.cu` and one line of
/// `ROOT/manifest.jsonl` for it (its cube and shared memory, which NVRTC's
/// report does not give).
fn write_sources(arch: CudaArch, groups: &[(String, Vec<KernelSource>)]) {
    let Some(root) = std::env::var_os("FERROTRON_CUDA_SOURCE_DIR") else {
        return;
    };
    let mut manifest = String::new();
    for (group, sources) in groups {
        let dir = PathBuf::from(&root).join(arch.nvrtc_arch()).join(group);
        std::fs::create_dir_all(&dir).unwrap();
        for (index, source) in sources.iter().enumerate() {
            let file = format!("{index:02}-{}.cu", source.entry);
            std::fs::write(dir.join(&file), &source.source).unwrap();
            let (x, y, z) = source.cube_dim;
            manifest += &format!(
                "{{\"arch\": \"{}\", \"group\": \"{group}\", \"file\": \"{file}\", \
                 \"cube_dim\": [{x}, {y}, {z}], \"shared_bytes\": {}}}\n",
                arch.nvrtc_arch(),
                source.shared_bytes
            );
        }
    }
    let path = PathBuf::from(&root).join("manifest.jsonl");
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap();
    std::io::Write::write_all(&mut file, manifest.as_bytes()).unwrap();
}

#[test]
fn every_kernel_compiles_to_cuda_source_for_ampere_and_hopper() {
    for arch in [CudaArch::Sm80, CudaArch::Sm90] {
        let groups = compile_all(arch);
        for (group, sources) in &groups {
            assert!(!sources.is_empty(), "{arch:?} {group}: nothing recorded");
            // The three matrix-unit kernels (forward, dK/dV, dQ) where the
            // group asks for them, each on its instructions; none elsewhere.
            let (family, instructions) = match group {
                g if g.ends_with("-Registers") => ("_mma_kernel", &[MMA, LDMATRIX][..]),
                g if g.ends_with("-Fragments") => ("_fragment_kernel", &[WMMA][..]),
                _ => ("", &[][..]),
            };
            let on_units: Vec<_> = sources
                .iter()
                .filter(|s| s.source.contains(MMA) || s.source.contains(WMMA))
                .collect();
            let expected = if family.is_empty() { 0 } else { 3 };
            assert_eq!(
                on_units.len(),
                expected,
                "{arch:?} {group}: matrix-unit kernels"
            );
            for source in on_units {
                assert!(
                    source.entry.contains(family),
                    "{arch:?} {group}: {}",
                    source.entry
                );
                for instruction in instructions {
                    assert!(
                        source.source.contains(instruction),
                        "{arch:?} {group}: {} lacks {instruction}",
                        source.entry
                    );
                }
            }
        }
        write_sources(arch, &groups);
    }
}

#[test]
fn hopper_runs_the_largest_register_tiles_on_its_matrix_units() {
    let client = client(CudaArch::Sm90);
    let options = AttentionOptions {
        causal: true,
        scale: None,
        matrix_units: MatrixUnits::Registers,
    };
    let kernel = AttentionKernel::for_call(&client, 128, FloatDtype::Bf16, options);
    assert_eq!(
        kernel,
        AttentionKernel::Registers {
            planes: 4,
            keys: 64,
            matrix_units: true
        }
    );
}
