//! The resolved implementation of every operation per backend, precision
//! and `kernels` setting, as `OpsChoice::resolve` and docs/kernels.md
//! state them (the models tests check that each runs as chosen).

use super::*;
use crate::presets::preset;

/// llama-mini (RMSNorm, SwiGLU, RoPE) with `kernels` in `precision`.
fn config(kernels: Option<Kernels>, precision: Precision) -> DecoderConfig {
    DecoderConfig {
        kernels,
        precision,
        ..preset("llama-mini").unwrap()
    }
}

/// Every operation `elementwise` (the norms, GELU, SwiGLU, RoPE), attention
/// `attention`, cross-entropy, the bias add and the embedding
/// `by_kernels`.
fn expect(
    kernels: Kernels,
    [attention, elementwise, by_kernels]: [OpImpl; 3],
    head_loss: HeadLoss,
) -> OpsChoice {
    OpsChoice {
        kernels,
        attention: attention.into(),
        rope: elementwise,
        rms_norm: elementwise,
        layer_norm: elementwise,
        swiglu: elementwise,
        gelu: elementwise,
        bias: by_kernels,
        embedding: by_kernels,
        cross_entropy: by_kernels,
        head_loss,
    }
}

#[cfg(feature = "flex")]
#[test]
fn flex_runs_its_cpu_operations_in_f32_and_the_reference_otherwise() {
    use burn::backend::{Autodiff, Flex};
    use OpImpl::{Cpu, Reference};
    let cases = [
        // The default in f32: every CPU operation, the chunked head.
        (
            None,
            Precision::Fp32,
            [Cpu, Cpu, Reference],
            HeadLoss::Chunked,
        ),
        // bf16 and f16: the host attention node (which runs the reference
        // in those dtypes), Burn's operations elsewhere, the whole logits.
        (
            None,
            Precision::Bf16,
            [Cpu, Reference, Reference],
            HeadLoss::Logits,
        ),
        (
            None,
            Precision::Fp16,
            [Cpu, Reference, Reference],
            HeadLoss::Logits,
        ),
        // kernels = "reference": Burn's operations only.
        (
            Some(Kernels::Reference),
            Precision::Fp32,
            [Reference; 3],
            HeadLoss::Logits,
        ),
    ];
    for (kernels, precision, ops, head) in cases {
        let c = config(kernels, precision);
        let want = expect(Kernels::Reference, ops, head);
        assert_eq!(OpsChoice::resolve::<Flex>(&c).unwrap(), want, "{c:?}");
        let autodiff = OpsChoice::resolve::<Autodiff<Flex>>(&c).unwrap();
        assert_eq!(autodiff, want, "autodiff {kernels:?} {precision:?}");
    }
}

#[cfg(feature = "wgpu")]
#[test]
fn cubecl_backends_run_the_fused_kernels_in_every_precision() {
    use super::super::Wgpu;
    use OpImpl::{Fused, Reference};
    for precision in [Precision::Fp32, Precision::Bf16, Precision::Fp16] {
        for kernels in [None, Some(Kernels::Fused)] {
            let got = OpsChoice::resolve::<Wgpu>(&config(kernels, precision)).unwrap();
            let want = expect(Kernels::Fused, [Fused; 3], HeadLoss::Chunked);
            assert_eq!(got, want, "{kernels:?} {precision:?}");
            // Decoding with a KV cache: attention and RoPE by the reference.
            let decoding = OpsChoice {
                attention: AttentionImpl::Reference,
                rope: Reference,
                ..want
            };
            assert_eq!(got.decoding(), decoding);
        }
        // backend.attention_kernel = matrix-units reaches the attention.
        let fragments = crate::MatrixUnits::Fragments;
        let matrix_units = DecoderConfig {
            attention_matrix_units: fragments,
            ..config(None, precision)
        };
        let got = OpsChoice::resolve::<Wgpu>(&matrix_units).unwrap();
        let on_units = AttentionImpl::Fused {
            matrix_units: fragments,
        };
        assert_eq!(got.attention_impl(), on_units, "{precision:?}");
        let reference = config(Some(Kernels::Reference), precision);
        let got = OpsChoice::resolve::<Wgpu>(&reference).unwrap();
        let want = expect(Kernels::Reference, [Reference; 3], HeadLoss::Logits);
        assert_eq!(got, want, "reference {precision:?}");
    }
}
