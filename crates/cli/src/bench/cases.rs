//! The benchmarked ops and the shape sweep.

use std::fmt;

use ferrotron_kernels::attention::{
    AttentionBackwardKernel, AttentionKernel, MMA_BACKWARD_TILES, MMA_TILES,
};

/// One op at one shape; every op is timed forward + backward together.
#[derive(Clone, Copy, Debug)]
pub enum Case {
    /// Causal attention, q/k/v `[batch, heads, seq, head_dim]` (kv heads =
    /// heads). The fused path runs the forward kernel of `forward`, then
    /// its backward (`fused::attention_kernels`).
    Attention {
        /// Batch size.
        batch: usize,
        /// Query and key/value heads.
        heads: usize,
        /// Sequence length, tokens.
        seq: usize,
        /// Values per head.
        head_dim: usize,
        /// The fused forward kernel and storage type.
        forward: AttentionPath,
    },
    /// `silu(gate) * up`, gate and up `[rows, ffn]`.
    Swiglu {
        /// Token rows.
        rows: usize,
        /// FFN width.
        ffn: usize,
    },
    /// RMSNorm (or LayerNorm when `layer`) of `[batch, seq, hidden]` over `hidden`.
    Norm {
        /// LayerNorm if true, RMSNorm otherwise.
        layer: bool,
        /// Batch size.
        batch: usize,
        /// Sequence length, tokens.
        seq: usize,
        /// Normalised width.
        hidden: usize,
    },
    /// Rotary embedding of `[batch, heads, seq, head_dim]`.
    Rope {
        /// Batch size.
        batch: usize,
        /// Heads.
        heads: usize,
        /// Sequence length, tokens.
        seq: usize,
        /// Values per head (even).
        head_dim: usize,
    },
    /// Mean cross-entropy of logits `[rows, vocab]` against `[rows]` targets.
    CrossEntropy {
        /// Token rows.
        rows: usize,
        /// Vocabulary size.
        vocab: usize,
    },
}

/// The fused attention kernels a case runs (`fused::attention_kernels`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttentionPath {
    /// The row forward and backward kernels, f32.
    Row,
    /// The tiled forward and backward kernels (FlashAttention-2 tiles), f32.
    Tiled,
    /// The fragment forward and backward on matrix units (tensor cores),
    /// bf16: inputs, outputs and gradients bf16 (the
    /// kernels run 16-bit types only).
    CmmaBf16,
    /// The register forward and backward on the `mma` instruction (tensor
    /// cores), bf16 as [`Self::CmmaBf16`], at the tiles named.
    MmaBf16(MmaTiles),
}

/// The tiles the register kernels of an [`AttentionPath::MmaBf16`] case run
/// at (a tile pair that does not fit the device's shared memory does not
/// run there).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MmaTiles {
    /// Each kernel at the largest tiles that fit the device (what the
    /// launcher chooses).
    Largest,
    /// The forward at `(planes, keys)` of [`MMA_TILES`], the backward at
    /// its largest.
    Forward(usize, usize),
    /// The backward at `(planes, inner)` of [`MMA_BACKWARD_TILES`], the
    /// forward at its largest.
    Backward(usize, usize),
}

impl MmaTiles {
    /// [`Self::Largest`], then with `every` each tile pair of the forward
    /// ([`MMA_TILES`]) and each of the backward ([`MMA_BACKWARD_TILES`]).
    fn sweep(every: bool) -> Vec<Self> {
        let mut tiles = vec![Self::Largest];
        if every {
            tiles.extend(MMA_TILES.map(|(planes, keys)| Self::Forward(planes, keys)));
            tiles.extend(MMA_BACKWARD_TILES.map(|(planes, inner)| Self::Backward(planes, inner)));
        }
        tiles
    }

    /// The kernel named with its tiles, `None` for [`Self::Largest`]: e.g.
    /// `forward registers64x32-mma`.
    pub fn note(self) -> Option<String> {
        match self {
            Self::Largest => None,
            Self::Forward(planes, keys) => Some(format!(
                "forward {}",
                AttentionKernel::Registers {
                    planes,
                    keys,
                    matrix_units: true
                }
                .name()
            )),
            Self::Backward(planes, inner) => Some(format!(
                "backward {}",
                AttentionBackwardKernel::Registers {
                    planes,
                    inner,
                    matrix_units: true
                }
                .name()
            )),
        }
    }
}

/// Name of the rows of the fragment attention on the matrix units, and the
/// `--only` value that adds them to the sweep.
pub const CMMA_KERNEL: &str = "attention_cmma_bf16";

/// Name of the rows of the register kernels on the `mma` instruction, and
/// the `--only` value that adds them to the sweep.
pub const MMA_KERNEL: &str = "attention_mma_bf16";

/// Norm epsilon of both paths.
pub const NORM_EPS: f32 = 1e-5;
/// RoPE base of both paths.
pub const ROPE_THETA: f64 = 10_000.0;
/// Attention sequence lengths of the default sweep, tokens.
pub const ATTENTION_SEQS: [usize; 6] = [256, 512, 1024, 2048, 4096, 8192];

impl Case {
    /// Kernel name, as in the table and the JSON.
    pub fn kernel(&self) -> &'static str {
        match self {
            Case::Attention { forward, .. } => match forward {
                AttentionPath::Row => "attention",
                AttentionPath::Tiled => "attention_tiled",
                AttentionPath::CmmaBf16 => CMMA_KERNEL,
                AttentionPath::MmaBf16(_) => MMA_KERNEL,
            },
            Case::Swiglu { .. } => "swiglu",
            Case::Norm { layer: false, .. } => "rms_norm",
            Case::Norm { layer: true, .. } => "layer_norm",
            Case::Rope { .. } => "rope",
            Case::CrossEntropy { .. } => "cross_entropy",
        }
    }

    /// Storage type of the fused attention kernels' inputs and outputs
    /// (`bf16` on the matrix units, else `f32`); `None` for the other ops.
    pub fn attention_dtype(&self) -> Option<&'static str> {
        match self {
            Case::Attention { forward, .. } => Some(match forward {
                AttentionPath::Row | AttentionPath::Tiled => "f32",
                AttentionPath::CmmaBf16 | AttentionPath::MmaBf16(_) => "bf16",
            }),
            _ => None,
        }
    }

    /// The register kernels' tiles where the case names them
    /// ([`MmaTiles::note`]), for the row's note.
    pub fn tiles_note(&self) -> Option<String> {
        match self {
            Case::Attention {
                forward: AttentionPath::MmaBf16(tiles),
                ..
            } => tiles.note(),
            _ => None,
        }
    }

    /// The op whatever the fused kernel: `attention` for every attention
    /// kernel (they share the reference), else [`Case::kernel`].
    pub fn op(&self) -> &'static str {
        match self {
            Case::Attention { .. } => "attention",
            _ => self.kernel(),
        }
    }

    /// Floating-point operations of the attention forward by the
    /// FlashAttention-2 paper's count: `4 * batch * heads * seq^2 *
    /// head_dim` (the two matrix products), halved for the causal mask;
    /// `None` for the other ops.
    pub fn forward_flops(&self) -> Option<f64> {
        match *self {
            Case::Attention {
                batch,
                heads,
                seq,
                head_dim,
                ..
            } => Some(4.0 * (batch * heads) as f64 * (seq * seq) as f64 * head_dim as f64 / 2.0),
            _ => None,
        }
    }

    /// Floating-point operations of the backward by the same count: 2.5
    /// times [`Case::forward_flops`] (five matrix products instead of two).
    pub fn backward_flops(&self) -> Option<f64> {
        self.forward_flops().map(|f| 2.5 * f)
    }

    /// Floating-point operations of forward + backward by the same count:
    /// the backward is 2.5 forwards (five matrix products instead of two),
    /// so 3.5 times [`Case::forward_flops`].
    pub fn flops(&self) -> Option<f64> {
        self.forward_flops().map(|f| 3.5 * f)
    }

    /// Bytes the reference attention keeps in `[batch, heads, seq, seq]`
    /// f32 tensors during forward + backward, estimated as eight of them
    /// (scores, scaled, masked, softmax and their gradients); 0 for the
    /// other ops, whose reference never holds more than a few inputs' worth.
    pub fn reference_bytes_estimate(&self) -> u64 {
        match *self {
            Case::Attention {
                batch, heads, seq, ..
            } => 8 * (batch * heads * seq * seq * 4) as u64,
            _ => 0,
        }
    }
}

impl Case {
    /// Bytes of the largest single f32 tensor the reference allocates: the
    /// `[batch, heads, seq, seq]` scores for attention, the largest input
    /// (or its gradient) for the other ops.
    pub fn largest_reference_tensor_bytes(&self) -> u64 {
        let elems = match *self {
            Case::Attention {
                batch, heads, seq, ..
            } => batch * heads * seq * seq,
            Case::Swiglu { rows, ffn } => rows * ffn,
            Case::Norm {
                batch, seq, hidden, ..
            } => batch * seq * hidden,
            Case::Rope {
                batch,
                heads,
                seq,
                head_dim,
            } => batch * heads * seq * head_dim,
            Case::CrossEntropy { rows, vocab } => rows * vocab,
        };
        elems as u64 * 4
    }
}

impl fmt::Display for Case {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Case::Attention {
                batch,
                heads,
                seq,
                head_dim,
                ..
            }
            | Case::Rope {
                batch,
                heads,
                seq,
                head_dim,
            } => write!(f, "[{batch}, {heads}, {seq}, {head_dim}]"),
            Case::Swiglu { rows, ffn } => write!(f, "[{rows}, {ffn}]"),
            Case::Norm {
                batch, seq, hidden, ..
            } => write!(f, "[{batch}, {seq}, {hidden}]"),
            Case::CrossEntropy { rows, vocab } => write!(f, "[{rows}, {vocab}]"),
        }
    }
}

/// The sweep: attention (the row and the tiled kernel, and with
/// `matrix_units` the fragment kernels and the register kernels on the
/// matrix units too, the latter with `every_mma_tile` at each of their
/// tile pairs as well, [`MmaTiles`]) at every sequence length from
/// `min_seq` to `max_seq`, then one shape of each other op; attention and
/// RoPE with `head_dim` values per head; `quick` shrinks everything to a
/// smoke test (attention at 64 and 128 tokens, whatever the bounds).
pub fn sweep(
    quick: bool,
    min_seq: usize,
    max_seq: usize,
    head_dim: usize,
    matrix_units: bool,
    every_mma_tile: bool,
) -> Vec<Case> {
    let (batch, heads) = if quick { (1, 2) } else { (4, 8) };
    let seqs: &[usize] = if quick { &[64, 128] } else { &ATTENTION_SEQS };
    let mut paths = vec![AttentionPath::Row, AttentionPath::Tiled];
    if matrix_units {
        paths.push(AttentionPath::CmmaBf16);
        paths.extend(
            MmaTiles::sweep(every_mma_tile)
                .into_iter()
                .map(AttentionPath::MmaBf16),
        );
    }
    let mut cases: Vec<Case> = seqs
        .iter()
        .filter(|&&seq| (min_seq..=max_seq).contains(&seq) || quick)
        .flat_map(|&seq| {
            paths.iter().map(move |&forward| Case::Attention {
                batch,
                heads,
                seq,
                head_dim,
                forward,
            })
        })
        .collect();
    // 512 x 50257 f32 logits are 98 MiB: 1024 rows (196 MiB) exceed the
    // largest buffer lavapipe's wgpu adapter allocates.
    let (seq, hidden, ffn, ce_rows, vocab) = if quick {
        (32, 256, 512, 64, 1000)
    } else {
        (1024, 1024, 2816, 2 * 256, 50257)
    };
    cases.push(Case::Swiglu {
        rows: batch * seq,
        ffn,
    });
    for layer in [false, true] {
        cases.push(Case::Norm {
            layer,
            batch,
            seq,
            hidden,
        });
    }
    cases.push(Case::Rope {
        batch,
        heads,
        seq,
        head_dim,
    });
    cases.push(Case::CrossEntropy {
        rows: ce_rows,
        vocab,
    });
    cases
}

/// Deterministic input values in `[-1, 1)`, different per `salt`.
pub fn pattern(n: usize, salt: u64) -> Vec<f32> {
    (0..n as u64)
        .map(|i| {
            let h = (i ^ (salt << 40)).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40;
            h as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

/// Deterministic class ids in `[0, vocab)`.
pub fn targets(rows: usize, vocab: usize) -> Vec<u32> {
    (0..rows).map(|r| ((r * 7919) % vocab) as u32).collect()
}
