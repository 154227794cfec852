//! Where a ZeRO-3 rank's parameter pieces come from when its model is
//! built of placeholders: a [`ParamSource`] knows the shape of every
//! parameter of the rank's (TP) part and can draw any flat range of it
//! alone, so [`super::Zero::from_source`] materialises only the rank's
//! pieces and never the part (see `ferrotron_models`' counter-based
//! initialisation, which implements it). A trainer whose values a
//! checkpoint gives next takes its shapes from such a source and draws
//! nothing ([`ToBeLoaded`]).

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

/// The shapes of another source, with every value 0: the pieces of a
/// ZeRO-3 trainer that a checkpoint fills next (a resumed run, whose
/// `Trainer::load` replaces every piece this rank owns), so nothing is
/// drawn only to be overwritten.
pub struct ToBeLoaded<'a>(pub &'a dyn ParamSource);

impl ParamSource for ToBeLoaded<'_> {
    fn shape(&self, name: &str) -> Option<Vec<usize>> {
        self.0.shape(name)
    }

    fn values(&self, _name: &str, range: Range<usize>) -> Vec<f32> {
        vec![0.0; range.len()]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A source that fails the test if a value is drawn from it.
    struct MustNotDraw;

    impl ParamSource for MustNotDraw {
        fn shape(&self, name: &str) -> Option<Vec<usize>> {
            (name == "w").then(|| vec![3, 4])
        }

        fn values(&self, name: &str, range: Range<usize>) -> Vec<f32> {
            panic!("drew {name}[{range:?}] from a source whose values are to be loaded")
        }
    }

    #[test]
    fn a_source_to_be_loaded_keeps_the_shapes_and_draws_nothing() {
        let source = ToBeLoaded(&MustNotDraw);
        assert_eq!(source.shape("w"), Some(vec![3, 4]));
        assert_eq!(source.shape("b"), None);
        assert_eq!(source.values("w", 5..9), vec![0.0; 4]);
    }
}
