//! The CPU attention core (`cpu_kernel::attention_forward_lse` and
//! `attention_backward_lse`) as the per-block kernel of ring attention
//! (`ferrotron_parallel::context`): a ring step is the decoder's own
//! attention, on a block of queries and keys at their global positions.
//!
//! The block's additive bias `[1, 1 or heads, len_q, len_k]` carries the
//! causal mask on global positions (`-inf` where a key follows the
//! query) and ALiBi as `slope_h * (k_pos - q_pos)`, a function of the two
//! global positions alone, so every block of a row uses the same bias the
//! whole sequence would and the blocks' log-sum-exps merge exactly.

use burn::backend::flex::FlexTensor;
use burn::backend::Flex;
use burn::tensor::{Tensor, TensorData, TensorPrimitive};
use ferrotron_parallel::context::{Block, BlockAttention, HeadBuf, WholeRows};

use crate::ops::attention::cpu_kernel::{attention_backward_lse, attention_forward_lse};

/// The host attention core over one block of a ring.
#[derive(Clone, Debug, Default)]
pub struct HostBlockAttention {
    /// ALiBi slope of each query head of the block (`None`: no ALiBi).
    slopes: Option<Vec<f32>>,
}

impl HostBlockAttention {
    /// The kernel for a model whose query heads have ALiBi slopes
    /// `slopes` (one per head this rank computes: see
    /// `layers::position::alibi_slopes`), or no ALiBi (`None`).
    pub fn new(slopes: Option<Vec<f32>>) -> Self {
        Self { slopes }
    }

    /// The bias of `heads` query heads at `q_pos` against keys at `k_pos`:
    /// `[1, heads or 1, len_q, len_k]`.
    fn bias(&self, heads: usize, q_pos: &[usize], k_pos: &[usize]) -> FlexTensor {
        let slopes = match &self.slopes {
            Some(s) => {
                assert_eq!(s.len(), heads, "{} ALiBi slopes for {heads} heads", s.len());
                s.as_slice()
            }
            None => &[0.0f32][..],
        };
        let values: Vec<f32> = slopes
            .iter()
            .flat_map(|&s| {
                q_pos.iter().flat_map(move |&i| {
                    k_pos.iter().map(move |&j| {
                        if j > i {
                            f32::NEG_INFINITY
                        } else {
                            -s * (i - j) as f32
                        }
                    })
                })
            })
            .collect();
        flex(HeadBuf::new(
            [1, slopes.len(), q_pos.len(), k_pos.len()],
            values,
        ))
    }
}

/// A host buffer as a flex tensor of its shape.
fn flex(x: HeadBuf) -> FlexTensor {
    Tensor::<Flex, 4>::from_data(TensorData::new(x.data, x.dims), &Default::default())
        .into_primitive()
        .tensor()
}

/// A flex tensor's values in logical order `[batch, heads, len, width]`.
fn host(t: FlexTensor) -> HeadBuf {
    let t = Tensor::<Flex, 4>::from_primitive(TensorPrimitive::Float(t));
    let dims = t.dims();
    let data = t
        .into_data()
        .into_vec::<f32>()
        .expect("the attention core computes in f32");
    HeadBuf::new(dims, data)
}

impl BlockAttention for HostBlockAttention {
    fn forward(&self, block: Block<'_>) -> (HeadBuf, HeadBuf) {
        let [batch, heads, len, _] = block.q.dims;
        let bias = self.bias(heads, block.q_pos, block.k_pos);
        let (out, lse) = attention_forward_lse(
            flex(block.q.clone()),
            flex(block.k.clone()),
            flex(block.v.clone()),
            bias,
        );
        (host(out), HeadBuf::new([batch, heads, len, 1], lse))
    }

    fn backward(&self, block: Block<'_>, whole: WholeRows<'_>) -> [HeadBuf; 3] {
        let bias = self.bias(block.q.dims[1], block.q_pos, block.k_pos);
        attention_backward_lse(
            flex(block.q.clone()),
            flex(block.k.clone()),
            flex(block.v.clone()),
            bias,
            flex(whole.d_out.clone()),
            &whole.lse.data,
            &whole.delta.data,
        )
        .map(host)
    }
}
