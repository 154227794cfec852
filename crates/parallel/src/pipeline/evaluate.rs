//! The loss of one batch through the pipeline without gradients: the
//! virtual stages run one after another (embedding on stage 0, each
//! stage's blocks, the head and loss on the last stage), each sending its
//! hidden states to the next over the PP group; the last stage broadcasts
//! the loss. No schedule is needed: nothing overlaps, and each stage
//! waits for its input before it computes, so the order cannot deadlock.
//! The hidden states travel in the compute dtype, on the PP group's
//! device collectives when the pipeline has them, else as host f32 (see
//! `executor`).

use burn::tensor::backend::Backend;
use burn::tensor::ElementConversion;
use ferrotron_engine::data::Batch;
use ferrotron_engine::lm::LmUnits;

use super::Pipeline;
use crate::comm::nccl::device::wire::carried_in;
use crate::comm::nccl::device::Route;
use crate::comm::tensor::{from_host, host_f32};
use crate::comm::CommError;
use crate::micro_batch::batch_tensors;

impl Pipeline {
    /// The mean loss of `batch`, nats/token, computed by `model` (this
    /// stage's part, without autodiff) and every other stage's; the same
    /// on every stage. Collective over the PP group (each stage's TP group
    /// runs its blocks together).
    pub(crate) fn eval_loss<B: Backend, M: LmUnits<B>>(
        &self,
        model: &M,
        batch: &Batch,
        device: &B::Device,
    ) -> Result<f64, CommError> {
        let (stage, stages) = (self.pp.rank(), self.stages());
        let virtual_stages = stages * self.layout.chunks();
        let (inputs, targets) = batch_tensors::<B>(batch, device);
        let context = model.block_context(batch.seq_len, device);
        let dims = model.hidden_dims(batch.batch, batch.seq_len);
        let wire = carried_in(model.hidden_dtype().into());
        let mut loss = [0.0f32];
        for w in (stage..virtual_stages).step_by(stages) {
            let mut x = if w == 0 {
                model.embed(inputs.clone()).0
            } else {
                let from = Route {
                    peer: (w - 1) % stages,
                    tag: w as i32,
                };
                let n = dims.iter().product();
                let received = match self.device::<B>() {
                    Some(c) => c
                        .exchange(Vec::new(), &[(from, n)], wire, device)?
                        .remove(0),
                    None => {
                        let mut values = vec![0.0; n];
                        self.pp.recv(&mut values, from.peer, from.tag)?;
                        from_host(values, device)
                    }
                };
                received.reshape(dims).cast(model.hidden_dtype())
            };
            for i in self.layout.blocks(w) {
                x = model.block(i, x, &context);
            }
            if self.layout.is_last(w) {
                let value = model.head_loss(x, targets.clone()).into_scalar();
                loss[0] = value.elem::<f32>();
            } else {
                let to = Route {
                    peer: (w + 1) % stages,
                    tag: w as i32 + 1,
                };
                let n = x.shape().num_elements();
                match self.device::<B>() {
                    Some(c) => {
                        c.exchange(vec![(to, x.reshape([n]))], &[], wire, device)?;
                    }
                    None => self.pp.send(&host_f32(x), to.peer, to.tag)?,
                }
            }
        }
        self.pp.broadcast(&mut loss, stages - 1)?;
        Ok(f64::from(loss[0]))
    }
}
