//! Parameters by name: listing a module's tensors and loading them back.
//!
//! A parameter's name is its path of field names and list indices, joined by
//! dots (`layers.3.attn.q.weight`), as Burn's module visitors report it.

use std::collections::BTreeMap;

use burn::module::{Module, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};

/// Errors when loading named tensors into a module.
#[derive(Debug, thiserror::Error)]
pub enum ParamError {
    /// A parameter of the module has no tensor of that name in the source.
    #[error("tensor '{name}' is missing from {source_name}")]
    Missing {
        /// Parameter name.
        name: String,
        /// Where the tensors came from (a file path).
        source_name: String,
    },
    /// A tensor has a different shape than the parameter it should fill.
    #[error(
        "tensor '{name}' in {source_name} has shape {found:?}, the model expects {expected:?}"
    )]
    Shape {
        /// Parameter name.
        name: String,
        /// Where the tensors came from.
        source_name: String,
        /// Shape in the source.
        found: Vec<usize>,
        /// Shape of the parameter.
        expected: Vec<usize>,
    },
    /// The source holds tensors that match no parameter.
    #[error("unexpected tensor(s) in {source_name}: {names}")]
    Unexpected {
        /// Comma-separated names.
        names: String,
        /// Where the tensors came from.
        source_name: String,
    },
}

/// Keeps the current path while walking a module.
#[derive(Default)]
struct Path(Vec<String>);

impl Path {
    fn enter(&mut self, name: &str) {
        self.0.push(name.to_string());
    }
    fn exit(&mut self) {
        self.0.pop();
    }
    fn name(&self) -> String {
        self.0.join(".")
    }
}

struct Collect {
    path: Path,
    out: Vec<(String, TensorData)>,
}

impl<B: Backend> ModuleVisitor<B> for Collect {
    fn enter_module(&mut self, name: &str, _: &str) {
        self.path.enter(name);
    }
    fn exit_module(&mut self, _: &str, _: &str) {
        self.path.exit();
    }
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        self.out.push((self.path.name(), param.val().into_data()));
    }
}

/// Collects the name of every parameter by id.
struct Names {
    path: Path,
    out: Vec<(ParamId, String)>,
}

impl<B: Backend> ModuleVisitor<B> for Names {
    fn enter_module(&mut self, name: &str, _: &str) {
        self.path.enter(name);
    }
    fn exit_module(&mut self, _: &str, _: &str) {
        self.path.exit();
    }
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        self.out.push((param.id, self.path.name()));
    }
}

/// The name of every float parameter of `module` (as [`named_tensors`]
/// names them), with its id, in module order.
pub fn param_names<B: Backend, M: Module<B>>(module: &M) -> Vec<(ParamId, String)> {
    let mut n = Names {
        path: Path::default(),
        out: Vec::new(),
    };
    module.visit(&mut n);
    n.out
}

/// Every float parameter of `module` with its name, in module order.
pub fn named_tensors<B: Backend, M: Module<B>>(module: &M) -> Vec<(String, TensorData)> {
    let mut c = Collect {
        path: Path::default(),
        out: Vec::new(),
    };
    module.visit(&mut c);
    c.out
}

struct Load {
    path: Path,
    tensors: BTreeMap<String, TensorData>,
    source_name: String,
    error: Option<ParamError>,
}

impl<B: Backend> ModuleMapper<B> for Load {
    fn enter_module(&mut self, name: &str, _: &str) {
        self.path.enter(name);
    }
    fn exit_module(&mut self, _: &str, _: &str) {
        self.path.exit();
    }
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let name = self.path.name();
        if self.error.is_some() {
            return param;
        }
        let (id, tensor, mapper) = param.consume();
        let expected = tensor.shape().to_vec();
        let Some(data) = self.tensors.remove(&name) else {
            self.error = Some(ParamError::Missing {
                name,
                source_name: self.source_name.clone(),
            });
            return Param::from_mapped_value(id, tensor, mapper);
        };
        if data.shape.to_vec() != expected {
            self.error = Some(ParamError::Shape {
                name,
                source_name: self.source_name.clone(),
                found: data.shape.to_vec(),
                expected,
            });
            return Param::from_mapped_value(id, tensor, mapper);
        }
        let loaded = Tensor::<B, D>::from_data(data, &tensor.device());
        let loaded = if tensor.is_require_grad() {
            loaded.require_grad()
        } else {
            loaded
        };
        Param::from_mapped_value(id, loaded, mapper)
    }
}

/// Replaces every float parameter of `module` by the tensor of the same name.
///
/// Every parameter must be present with its exact shape, and every tensor
/// must be used; `source_name` (a file path) is named in errors.
pub fn load_named_tensors<B: Backend, M: Module<B>>(
    module: M,
    tensors: BTreeMap<String, TensorData>,
    source_name: &str,
) -> Result<M, ParamError> {
    let mut l = Load {
        path: Path::default(),
        tensors,
        source_name: source_name.to_string(),
        error: None,
    };
    let module = module.map(&mut l);
    if let Some(e) = l.error {
        return Err(e);
    }
    if !l.tensors.is_empty() {
        return Err(ParamError::Unexpected {
            names: l.tensors.keys().cloned().collect::<Vec<_>>().join(", "),
            source_name: source_name.to_string(),
        });
    }
    Ok(module)
}

struct MapNamed<F, E> {
    path: Path,
    f: F,
    error: Option<E>,
}

impl<B: Backend, F, E> ModuleMapper<B> for MapNamed<F, E>
where
    F: FnMut(&str, TensorData) -> Result<TensorData, E>,
{
    fn enter_module(&mut self, name: &str, _: &str) {
        self.path.enter(name);
    }
    fn exit_module(&mut self, _: &str, _: &str) {
        self.path.exit();
    }
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        if self.error.is_some() {
            return param;
        }
        let (id, tensor, mapper) = param.consume();
        let device = tensor.device();
        let grad = tensor.is_require_grad();
        match (self.f)(&self.path.name(), tensor.clone().into_data()) {
            Ok(data) => {
                let mapped = Tensor::<B, D>::from_data(data, &device);
                let mapped = if grad { mapped.require_grad() } else { mapped };
                Param::from_mapped_value(id, mapped, mapper)
            }
            Err(e) => {
                self.error = Some(e);
                Param::from_mapped_value(id, tensor, mapper)
            }
        }
    }
}

/// `module` with every float parameter replaced by `f(name, values)`,
/// whatever shape `f` returns (same rank); parameter ids are kept. The
/// first error of `f` is returned.
pub fn map_named_tensors<B, M, F, E>(module: M, f: F) -> Result<M, E>
where
    B: Backend,
    M: Module<B>,
    F: FnMut(&str, TensorData) -> Result<TensorData, E>,
{
    let mut m = MapNamed {
        path: Path::default(),
        f,
        error: None,
    };
    let module = module.map(&mut m);
    match m.error {
        Some(e) => Err(e),
        None => Ok(module),
    }
}

#[cfg(all(test, feature = "flex"))]
mod tests {
    use super::*;
    use burn::backend::Flex;

    #[derive(Module, Debug)]
    struct Inner<B: Backend> {
        weight: Param<Tensor<B, 2>>,
    }

    #[derive(Module, Debug)]
    struct Outer<B: Backend> {
        layers: Vec<Inner<B>>,
        bias: Param<Tensor<B, 1>>,
    }

    fn outer(v: f32) -> Outer<Flex> {
        let dev = Default::default();
        Outer {
            layers: (0..2)
                .map(|_| Inner {
                    weight: Param::from_tensor(Tensor::full([2, 3], v, &dev)),
                })
                .collect(),
            bias: Param::from_tensor(Tensor::full([3], v, &dev)),
        }
    }

    #[test]
    fn names_follow_fields_and_round_trip() {
        let names: Vec<String> = named_tensors(&outer(1.0))
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        assert_eq!(names, ["layers.0.weight", "layers.1.weight", "bias"]);
        let loaded = load_named_tensors(
            outer(0.0),
            named_tensors(&outer(2.0)).into_iter().collect(),
            "x",
        )
        .unwrap();
        let w: Vec<f32> = loaded.layers[1].weight.val().into_data().to_vec().unwrap();
        assert_eq!(w, vec![2.0; 6]);
    }

    #[test]
    fn missing_misshaped_and_unexpected_tensors_are_named() {
        let mut t: BTreeMap<_, _> = named_tensors(&outer(1.0)).into_iter().collect();
        t.remove("bias");
        let e = load_named_tensors(outer(0.0), t.clone(), "f.st").unwrap_err();
        assert_eq!(e.to_string(), "tensor 'bias' is missing from f.st");
        t.insert("bias".into(), TensorData::new(vec![0f32; 2], [2]));
        let e = load_named_tensors(outer(0.0), t.clone(), "f.st").unwrap_err();
        assert!(e.to_string().contains("'bias'") && e.to_string().contains("[3]"));
        t.insert("bias".into(), TensorData::new(vec![0f32; 3], [3]));
        t.insert("extra".into(), TensorData::new(vec![0f32; 3], [3]));
        let e = load_named_tensors(outer(0.0), t, "f.st").unwrap_err();
        assert!(e.to_string().contains("extra"));
    }
}
