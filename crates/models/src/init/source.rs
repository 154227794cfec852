//! The initial values of a rank's part of a model, piece by piece: what a
//! ZeRO-3 rank draws its DP share from ([`ParamSource`]) when its model is
//! built of placeholders ([`crate::Decoder::placeholder_part`]), so it
//! never materialises the rest of its TP part.

use std::collections::HashMap;
use std::ops::Range;

use ferrotron_parallel::zero::ParamSource;

use super::Spec;

/// Every parameter of one rank's part (its TP block of each held
/// parameter), each drawable over any flat range alone: the values equal
/// the same elements of the part [`crate::Decoder::new_part`] builds.
#[derive(Clone, Debug)]
pub struct PartSource {
    seed: u64,
    specs: HashMap<String, Spec>,
}

impl PartSource {
    /// The parameters `specs` (by name) under `seed`.
    pub(crate) fn new(seed: u64, specs: Vec<(String, Spec)>) -> Self {
        Self {
            seed,
            specs: specs.into_iter().collect(),
        }
    }

    /// Parameter `name` of the part (its whole shape and the rank's block
    /// of it); `None`: the part does not hold it.
    pub(crate) fn spec(&self, name: &str) -> Option<&Spec> {
        self.specs.get(name)
    }
}

impl ParamSource for PartSource {
    fn shape(&self, name: &str) -> Option<Vec<usize>> {
        self.specs.get(name).map(Spec::block_shape)
    }

    /// # Panics
    /// `name` is not one of the part's parameters.
    fn values(&self, name: &str, range: Range<usize>) -> Vec<f32> {
        let spec = self
            .specs
            .get(name)
            .unwrap_or_else(|| panic!("'{name}' is not a parameter of the part"));
        spec.values(self.seed, name, range)
    }
}
