//! Where a ZeRO-3 rank's parameter pieces come from when its model is
//! built of placeholders: a [`ParamSource`] knows the shape of every
//! parameter of the rank's (TP) part and can draw any flat range of it
//! alone, so [`super::Zero::from_source`] materialises only the rank's
//! pieces and never the part (see `ferrotron_models`' counter-based
//! initialisation, which implements it).

use std::ops::Range;

/// The values of a model whose tensors are one-element placeholders, by
/// parameter name (the dotted names of
/// [`ferrotron_engine::params::param_names`]).
pub trait ParamSource {
    /// The shape of parameter `name` as this rank's part of the model
    /// holds it (its TP block); `None`: a name the source does not know.
    fn shape(&self, name: &str) -> Option<Vec<usize>>;

    /// Elements `range` of the flat (row-major) view of this rank's part
    /// of parameter `name` (of shape [`ParamSource::shape`]); `range` lies
    /// within it.
    fn values(&self, name: &str, range: Range<usize>) -> Vec<f32>;
}

/// A model of placeholders whose source does not know one of its
/// parameters.
#[derive(Debug, thiserror::Error)]
#[error("the parameter source does not know the model's parameter '{0}'")]
pub struct UnknownParam(pub String);
