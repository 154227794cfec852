//! The decoder's building blocks. Each file holds one layer.

mod attention;
mod linear;
mod mlp;
mod norm;
pub mod position;

pub use attention::{Attention, LayerKv};
pub use linear::Linear;
pub use mlp::Mlp;
pub use norm::Norm;
