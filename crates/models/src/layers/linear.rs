//! A dense layer `y = x W + b`, computed in the dtype of its input: the
//! f32 weight is cast to it (mixed precision; the cast's backward brings
//! its gradient back to f32), and the f32 bias is added by the model's
//! bias add ([`OpsChoice::bias_add`]).

use burn::module::{Module, Param};
use burn::tensor::backend::Backend;
use burn::tensor::Tensor;

use ferrotron_parallel::tensor::{row_output, ShardError, TpGroup};

use crate::init::Init;
use crate::ops::{KernelBackend, OpsChoice};

/// Weight `[d_in, d_out]` and optional bias `[d_out]`.
#[derive(Module, Debug)]
pub struct Linear<B: Backend> {
    /// `[d_in, d_out]`.
    pub weight: Param<Tensor<B, 2>>,
    /// `[d_out]`, when the family uses biases.
    pub bias: Option<Param<Tensor<B, 1>>>,
    #[module(skip)]
    ops: OpsChoice,
}

impl<B: Backend> Linear<B> {
    /// The layer named `name` (`layers.0.attn.q`): this rank's part (see
    /// [`Init`]) of `N(0, std^2)` weights `[d_in, d_out]` and a zero bias,
    /// computed with `ops` (a model's [`OpsChoice`], or a `Kernels` value).
    ///
    /// # Errors
    /// A parameter the shard plan cannot cut.
    pub fn new(
        init: &Init<B>,
        name: &str,
        [d_in, d_out]: [usize; 2],
        bias: bool,
        std: f64,
        ops: impl Into<OpsChoice>,
    ) -> Result<Self, ShardError> {
        Ok(Self {
            weight: init.normal(&format!("{name}.weight"), [d_in, d_out], std)?,
            bias: bias
                .then(|| init.constant(&format!("{name}.bias"), [d_out], 0.0))
                .transpose()?,
            ops: ops.into(),
        })
    }

    /// The layer of the given parameters, computed with `ops`.
    pub fn from_params(
        weight: Param<Tensor<B, 2>>,
        bias: Option<Param<Tensor<B, 1>>>,
        ops: impl Into<OpsChoice>,
    ) -> Self {
        Self {
            weight,
            bias,
            ops: ops.into(),
        }
    }
}

impl<B: KernelBackend> Linear<B> {
    /// `[batch, seq, d_in]` to `[batch, seq, d_out]`, in `x`'s dtype.
    pub fn forward(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        let [b, t, _] = x.dims();
        let y = self.add_bias(self.matmul(x));
        let d_out = y.dims()[1];
        y.reshape([b, t, d_out])
    }

    /// `x W` for `x` `[batch, seq, d_in]`, as `[batch * seq, d_out]`.
    fn matmul(&self, x: Tensor<B, 3>) -> Tensor<B, 2> {
        let [b, t, d_in] = x.dims();
        let dtype = x.dtype();
        x.reshape([b * t, d_in])
            .matmul(self.weight.val().cast(dtype))
    }

    fn add_bias(&self, y: Tensor<B, 2>) -> Tensor<B, 2> {
        match &self.bias {
            Some(bias) => self.ops.bias_add(y, bias.val()),
            None => y,
        }
    }

    /// A row-parallel layer (Megatron-LM): this rank's rows of `W` `[d_in /
    /// tp, d_out]` applied to its block of the input `x` `[batch, seq, d_in
    /// / tp]`, the partial products summed over `tp` (under sequence
    /// parallelism reduce-scattered: `seq / tp` positions remain), then
    /// the (replicated) bias added once. `[batch, seq or seq / tp, d_out]`;
    /// [`Linear::forward`] on one rank.
    pub fn forward_row_parallel(&self, x: Tensor<B, 3>, tp: &TpGroup) -> Tensor<B, 3> {
        let [b, t, _] = x.dims();
        let partial = self.matmul(x);
        let d_out = partial.dims()[1];
        let y = row_output(partial.reshape([b, t, d_out]), tp);
        let rows = y.dims()[1];
        self.add_bias(y.reshape([b * rows, d_out]))
            .reshape([b, rows, d_out])
    }
}
