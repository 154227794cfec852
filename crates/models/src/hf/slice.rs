//! Reading only a rank's part of a Hugging Face directory. The weight
//! files are memory-mapped and only their headers parsed; each parameter
//! of ours that the rank's part holds (its TP block, its pipeline stage's
//! units: the parameters [`Decoder::placeholder_part`] records) is read
//! element by element from its place in the Hugging Face tensor
//! ([`Rule::hf_index`]) over the rank's block only. A fused GPT-2
//! `c_attn` or BLOOM `query_key_value` thus gives each of q, k and v its
//! block without the rest of the fused tensor being materialised, and the
//! rank holds at most its part (plus the pages the kernel maps in).

use std::collections::BTreeMap;
use std::fs::File;
use std::ops::Range;
use std::path::Path;

use burn::tensor::{bf16, f16, TensorData};
use ferrotron_engine::params::map_named_tensors;
use ferrotron_parallel::zero::ParamSource;
use memmap2::Mmap;
use safetensors::{Dtype, SafeTensors};

use super::config::{from_hf_config, Family};
use super::import::{io, match_names, weight_files};
use super::names::{rules, Rule};
use super::HfError;
use crate::config::DecoderConfig;
use crate::init::{block_values, PartSource};
use crate::ops::KernelBackend;
use crate::{Decoder, ModelPart};

/// One tensor of a mapped weight file.
struct Located {
    /// Index of its file's map.
    map: usize,
    dtype: Dtype,
    shape: Vec<usize>,
    /// Byte offset of its first element in the map.
    start: usize,
}

/// The weight files of a directory, memory-mapped, and where each tensor
/// lies in them (by its name in the file).
pub(super) struct Mapped {
    maps: Vec<Mmap>,
    tensors: BTreeMap<String, Located>,
    /// The file (or the directory, for shards) errors name.
    source: String,
}

impl Mapped {
    /// Maps the weight files of `dir` and parses their headers.
    ///
    /// # Errors
    /// [`HfError::Io`]: an unreadable file or header, a tensor in two
    /// shards, a dtype other than F32, F16 or BF16.
    pub(super) fn open(dir: &Path) -> Result<Self, HfError> {
        let (files, source) = weight_files(dir)?;
        let mut maps = Vec::new();
        let mut tensors = BTreeMap::new();
        for path in files {
            let file = File::open(&path).map_err(|e| io(&path, e))?;
            // SAFETY: a model directory's weights are not written while a
            // run reads them (as for `safetensors`' own memory-mapped loads).
            let map = unsafe { Mmap::map(&file) }.map_err(|e| io(&path, e))?;
            let (header, meta) = SafeTensors::read_metadata(&map).map_err(|e| io(&path, e))?;
            for (name, info) in meta.tensors() {
                if !matches!(info.dtype, Dtype::F32 | Dtype::F16 | Dtype::BF16) {
                    let dtype = info.dtype;
                    return Err(io(
                        &path,
                        format!("tensor '{name}' has dtype {dtype:?}; expected F32, F16 or BF16"),
                    ));
                }
                let located = Located {
                    map: maps.len(),
                    dtype: info.dtype,
                    shape: info.shape.clone(),
                    start: 8 + header + info.data_offsets.0,
                };
                if tensors.insert(name.clone(), located).is_some() {
                    return Err(io(&path, format!("tensor '{name}' appears in two shards")));
                }
            }
            maps.push(map);
        }
        Ok(Self {
            maps,
            tensors,
            source,
        })
    }

    /// Each tensor a model of `family` and shape `config` reads, by full
    /// Hugging Face name, to its name in the files (see
    /// [`match_names`]: every tensor present, in its shape, none left over).
    pub(super) fn match_names(
        &self,
        family: Family,
        config: &DecoderConfig,
    ) -> Result<BTreeMap<String, String>, HfError> {
        let found = self
            .tensors
            .iter()
            .map(|(n, t)| (n.clone(), t.shape.clone()))
            .collect();
        match_names(family, config, found, &self.source)
    }

    /// Element `i` (flat, row-major) of tensor `t`, as f32.
    fn value(&self, t: &Located, i: usize) -> f32 {
        let map = &self.maps[t.map];
        match t.dtype {
            Dtype::F32 => {
                let b = &map[t.start + 4 * i..t.start + 4 * i + 4];
                f32::from_le_bytes([b[0], b[1], b[2], b[3]])
            }
            Dtype::BF16 => {
                let b = &map[t.start + 2 * i..t.start + 2 * i + 2];
                bf16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32()
            }
            _ => {
                let b = &map[t.start + 2 * i..t.start + 2 * i + 2];
                f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32()
            }
        }
    }
}

/// The values of a rank's part of a Hugging Face directory, drawable over
/// any flat range of any parameter alone (from the mapped files): what a
/// ZeRO-3 rank draws only its DP pieces from ([`ParamSource`]), and what
/// [`load_hf_part`] reads whole blocks from.
pub struct HfPartSource {
    mapped: Mapped,
    /// Each of our parameters the part holds: its rule, and its
    /// Hugging Face tensor's name in the files.
    rules: BTreeMap<String, (Rule, String)>,
    /// The part's parameters: whole shapes and the rank's blocks.
    part: PartSource,
}

impl HfPartSource {
    /// The source of `part` of the Hugging Face model in `dir` (shape
    /// `config`), and the part as placeholders: a ZeRO-3 rank hands both
    /// to `Trainer::parallel_from_source` and reads only its DP pieces.
    ///
    /// # Errors
    /// As [`load_hf_part`].
    pub fn open<B: KernelBackend>(
        dir: &Path,
        config: &DecoderConfig,
        part: &ModelPart,
        device: &B::Device,
    ) -> Result<(Decoder<B>, Self), HfError> {
        let (family, _) = from_hf_config(&dir.join("config.json"))?;
        let mapped = Mapped::open(dir)?;
        let names = mapped.match_names(family, config)?;
        let (model, part) = Decoder::<B>::placeholder_part(config, 0, device, part)
            .map_err(|e| HfError::Layout(e.to_string()))?;
        let rules = rules(family, config)
            .into_iter()
            .map(|r| {
                let file_name = names[&r.hf].clone();
                (r.ours.clone(), (r, file_name))
            })
            .collect();
        Ok((
            model,
            Self {
                mapped,
                rules,
                part,
            },
        ))
    }
}

impl ParamSource for HfPartSource {
    fn shape(&self, name: &str) -> Option<Vec<usize>> {
        self.part.shape(name)
    }

    /// # Panics
    /// `name` is not one of the part's parameters.
    fn values(&self, name: &str, range: Range<usize>) -> Vec<f32> {
        let spec = self
            .part
            .spec(name)
            .unwrap_or_else(|| panic!("'{name}' is not a parameter of the part"));
        let (rule, file_name) = &self.rules[name];
        let t = &self.mapped.tensors[file_name];
        block_values(&spec.shape, spec.block.clone(), range, |i| {
            self.mapped.value(t, rule.hf_index(i as usize))
        })
    }
}

/// This rank's `part` of the Hugging Face model in `dir`, whose shape is
/// `config` (ours, as [`super::read_hf_dir`] gives it, with the run's
/// settings): the part's tensors hold the directory's values in our
/// layout, cut as [`Decoder::shard`] cuts the whole model (the vocabulary
/// padded with zero rows), the others are one-element placeholders.
/// Only the part's blocks are read; no Hugging Face tensor is read whole.
///
/// # Errors
/// As [`super::read_hf_dir`]; [`HfError::Layout`] if the part does not
/// fit `config`.
pub fn load_hf_part<B: KernelBackend>(
    dir: &Path,
    config: &DecoderConfig,
    part: &ModelPart,
    device: &B::Device,
) -> Result<Decoder<B>, HfError> {
    let (model, source) = HfPartSource::open(dir, config, part, device)?;
    // Each block is read when the mapper reaches its parameter, so the
    // rank holds its part and one block in flight.
    map_named_tensors(model, |name, placeholder| {
        let Some(shape) = source.shape(name) else {
            return Ok::<_, HfError>(placeholder);
        };
        let values = source.values(name, 0..shape.iter().product());
        Ok(TensorData::new(values, shape))
    })
}
