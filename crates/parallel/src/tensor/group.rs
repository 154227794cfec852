//! The tensor-parallel group as the layers hold it.

use std::fmt;
use std::sync::Arc;

use burn::tensor::backend::Backend;

use crate::comm::nccl::device::{AnyCollectives, SharedCollectives};
use crate::comm::{Communicator, SingleProcess};

/// The ranks that split one model's layers between them (the TP group of
/// [`crate::groups::ProcessGroups`]), cheap to clone into every layer.
///
/// A group of one rank makes every tensor-parallel operation the identity.
/// With sequence parallelism the activations outside the column- and
/// row-parallel layers (norms, residual stream) are split along the
/// sequence over the same group.
///
/// The operators' collectives go through the communicator's host path,
/// or with [`TpGroup::with_device`] on collectives over the same ranks
/// that take the tensors themselves (NCCL on device buffers).
#[derive(Clone)]
pub struct TpGroup {
    comm: Arc<dyn Communicator>,
    sequence: bool,
    /// A `SharedCollectives<B>` for the backend `B` the layers compute on.
    device: AnyCollectives,
}

impl TpGroup {
    /// The group of `comm`'s ranks, without sequence parallelism.
    pub fn new(comm: Arc<dyn Communicator>) -> Self {
        Self {
            comm,
            sequence: false,
            device: AnyCollectives::none(),
        }
    }

    /// The group whose collectives run on `collectives` (over the same
    /// ranks, in the same order), for the tensors of backend `B` the
    /// layers compute on (the inner backend under autodiff).
    pub fn with_device<B: Backend>(self, collectives: SharedCollectives<B>) -> Self {
        assert_eq!(
            collectives.world_size(),
            self.size(),
            "device collectives over another group than the TP group"
        );
        Self {
            device: AnyCollectives::new::<B>(collectives),
            ..self
        }
    }

    /// The device collectives, if the group has them
    /// ([`TpGroup::with_device`]).
    ///
    /// # Panics
    /// If they were given for another backend than `B` (a caller bug:
    /// the operators would otherwise fall back to the host path unseen).
    pub(crate) fn device<B: Backend>(&self) -> Option<&SharedCollectives<B>> {
        self.device.get::<B>(self)
    }

    /// A group of this process alone (no tensor parallelism).
    pub fn single() -> Self {
        Self::new(Arc::new(SingleProcess))
    }

    /// The group with sequence parallelism on or off (Korthikanti et al.
    /// 2022; meaningful on more than one rank).
    pub fn with_sequence_parallel(self, on: bool) -> Self {
        Self {
            sequence: on && self.size() > 1,
            ..self
        }
    }

    /// Whether activations outside the split layers are split along the
    /// sequence.
    pub fn sequence_parallel(&self) -> bool {
        self.sequence
    }

    /// Ranks in the group (the TP degree).
    pub fn size(&self) -> usize {
        self.comm.world_size()
    }

    /// This rank's place in the group, `0..size()`.
    pub fn rank(&self) -> usize {
        self.comm.rank()
    }

    /// The communicator of the group.
    pub fn comm(&self) -> &dyn Communicator {
        &*self.comm
    }
}

impl Default for TpGroup {
    fn default() -> Self {
        Self::single()
    }
}

impl fmt::Debug for TpGroup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sp = if self.sequence {
            ", sequence parallel"
        } else {
            ""
        };
        write!(f, "TpGroup(rank {} of {}{sp})", self.rank(), self.size())
    }
}
