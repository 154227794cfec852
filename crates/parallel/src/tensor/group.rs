//! The tensor-parallel group as the layers hold it.

use std::fmt;
use std::sync::Arc;

use crate::comm::{Communicator, SingleProcess};

/// The ranks that split one model's layers between them (the TP group of
/// [`crate::groups::ProcessGroups`]), cheap to clone into every layer.
///
/// A group of one rank makes every tensor-parallel operation the identity.
#[derive(Clone)]
pub struct TpGroup(Arc<dyn Communicator>);

impl TpGroup {
    /// The group of `comm`'s ranks.
    pub fn new(comm: Arc<dyn Communicator>) -> Self {
        Self(comm)
    }

    /// A group of this process alone (no tensor parallelism).
    pub fn single() -> Self {
        Self(Arc::new(SingleProcess))
    }

    /// Ranks in the group (the TP degree).
    pub fn size(&self) -> usize {
        self.0.world_size()
    }

    /// This rank's place in the group, `0..size()`.
    pub fn rank(&self) -> usize {
        self.0.rank()
    }

    /// The communicator of the group.
    pub fn comm(&self) -> &dyn Communicator {
        &*self.0
    }
}

impl Default for TpGroup {
    fn default() -> Self {
        Self::single()
    }
}

impl fmt::Debug for TpGroup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TpGroup(rank {} of {})", self.rank(), self.size())
    }
}
