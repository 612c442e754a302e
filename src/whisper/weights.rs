//! Hugging Face Whisper checkpoints: opening `model.safetensors` (single or sharded with an
//! index) or `pytorch_model.bin`, the list of tensors each component needs, checking a
//! checkpoint against it, and reading tensors as little-endian fp16.
//!
//! safetensors files are memory-mapped: fp16 tensors come back as windows into the map (no
//! copy); fp32/bf16/f64 ones are converted one tensor at a time on access, so a checkpoint is
//! never materialised as a whole (the large-v3-turbo encoder alone is 1.3 GB of fp16).
//! `pytorch_model.bin` is read with candle's pickle reader, which interprets the pickle as
//! data and never executes it.

use super::config::WhisperConfig;
use super::graph::WeightSource;
use crate::ir::Bytes;
use anyhow::{anyhow, bail, ensure, Context, Result};
use half::{bf16, f16};
use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

mod formats;
use formats::{check_pickled, convert, f64_to_f32, map_safetensors, read_pickled, release_pages};

/// The two networks of a Whisper checkpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Component {
    Encoder,
    Decoder,
}

impl Component {
    pub fn name(self) -> &'static str {
        match self {
            Component::Encoder => "encoder",
            Component::Decoder => "decoder",
        }
    }
}

/// A tensor as little-endian fp16, row-major.
#[derive(Clone, Debug, PartialEq)]
pub struct F16Tensor {
    pub shape: Vec<usize>,
    pub data: Bytes,
}

impl F16Tensor {
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    pub fn to_f32_vec(&self) -> Vec<f32> {
        self.data
            .to_f16_vec()
            .into_iter()
            .map(f16::to_f32)
            .collect()
    }
}

/// Element type of a tensor as stored in the checkpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoredDType {
    F16,
    BF16,
    F32,
    F64,
    /// Anything else (integers, fp8, ...), by its name in the file; not readable as fp16.
    Other(String),
}

impl StoredDType {
    fn from_safetensors(d: safetensors::Dtype) -> StoredDType {
        match d {
            safetensors::Dtype::F16 => StoredDType::F16,
            safetensors::Dtype::BF16 => StoredDType::BF16,
            safetensors::Dtype::F32 => StoredDType::F32,
            safetensors::Dtype::F64 => StoredDType::F64,
            other => StoredDType::Other(format!("{other:?}")),
        }
    }

    fn from_candle(d: candle_core::DType) -> StoredDType {
        match d {
            candle_core::DType::F16 => StoredDType::F16,
            candle_core::DType::BF16 => StoredDType::BF16,
            candle_core::DType::F32 => StoredDType::F32,
            candle_core::DType::F64 => StoredDType::F64,
            other => StoredDType::Other(format!("{other:?}")),
        }
    }

    fn is_float(&self) -> bool {
        !matches!(self, StoredDType::Other(_))
    }
}

enum SourceFile {
    Safetensors {
        path: PathBuf,
        map: Arc<memmap2::Mmap>,
    },
    Pth {
        path: PathBuf,
        pth: candle_core::pickle::PthTensors,
    },
}

impl SourceFile {
    fn path(&self) -> &Path {
        match self {
            SourceFile::Safetensors { path, .. } | SourceFile::Pth { path, .. } => path,
        }
    }
}

enum Location {
    /// Absolute byte range inside the mapped file.
    Mapped(Range<usize>),
    /// Key in the pickled state dict.
    Pickled(String),
}

struct Entry {
    file: usize,
    shape: Vec<usize>,
    dtype: StoredDType,
    location: Location,
}

/// An opened checkpoint: an index of tensor names over one or more files.
pub struct WhisperWeights {
    /// The file errors are reported against: the weights file, or the shard index.
    origin: PathBuf,
    files: Vec<SourceFile>,
    entries: BTreeMap<String, Entry>,
}

/// `dir/config.json` of a checkpoint directory, or an error saying which of the two is
/// missing.
pub(crate) fn config_path(dir: &Path) -> Result<PathBuf> {
    ensure!(
        dir.is_dir(),
        "checkpoint directory {} does not exist",
        dir.display()
    );
    let config_path = dir.join("config.json");
    ensure!(
        config_path.is_file(),
        "{}: missing config.json (a Hugging Face checkpoint has it next to the weights)",
        config_path.display()
    );
    Ok(config_path)
}

impl WhisperWeights {
    /// Opens a Hugging Face checkpoint directory: `config.json` plus `model.safetensors`,
    /// `model.safetensors.index.json` with shards, `pytorch_model.bin` or
    /// `pytorch_model.bin.index.json` (tried in that order).
    pub fn open(dir: &Path) -> Result<(WhisperConfig, WhisperWeights)> {
        let config_path = config_path(dir)?;
        let cfg = WhisperConfig::from_file(&config_path)?;
        Ok((cfg, Self::open_weights(dir)?))
    }

    /// Opens only the tensors of a checkpoint directory (see [`WhisperWeights::open`]).
    pub fn open_weights(dir: &Path) -> Result<WhisperWeights> {
        for name in ["model.safetensors", "pytorch_model.bin"] {
            let path = dir.join(name);
            if path.is_file() {
                return Self::open_file(&path);
            }
            let index = dir.join(format!("{name}.index.json"));
            if index.is_file() {
                return Self::open_index(&index);
            }
        }
        bail!(
            "{}: no model.safetensors, model.safetensors.index.json, pytorch_model.bin or \
             pytorch_model.bin.index.json",
            dir.display()
        )
    }

    /// Opens one weights file: `*.safetensors`, or anything else as a PyTorch zip checkpoint.
    pub fn open_file(path: &Path) -> Result<WhisperWeights> {
        super::file_reads::note(path);
        let mut w = WhisperWeights {
            origin: path.to_path_buf(),
            files: Vec::new(),
            entries: BTreeMap::new(),
        };
        w.add_file(path)?;
        Ok(w)
    }

    /// Opens a sharded checkpoint from its `*.index.json` (`{"weight_map": {name: shard}}`).
    pub fn open_index(index: &Path) -> Result<WhisperWeights> {
        super::file_reads::note(index);
        let text = std::fs::read_to_string(index)
            .with_context(|| format!("cannot read shard index {}", index.display()))?;
        let json: serde_json::Value = serde_json::from_str(&text)
            .with_context(|| format!("shard index {}: malformed JSON", index.display()))?;
        let map = json
            .get("weight_map")
            .and_then(|m| m.as_object())
            .with_context(|| format!("shard index {}: missing \"weight_map\"", index.display()))?;
        let mut weight_map = BTreeMap::new();
        for (name, shard) in map {
            let shard = shard.as_str().with_context(|| {
                format!(
                    "shard index {}: \"{name}\" maps to a non-string",
                    index.display()
                )
            })?;
            // Shards live next to the index; refuse paths that would leave the directory.
            ensure!(
                Path::new(shard).file_name() == Some(shard.as_ref()),
                "shard index {}: shard name \"{shard}\" is not a plain file name",
                index.display()
            );
            weight_map.insert(canonical_name(name), shard.to_string());
        }
        let dir = index.parent().unwrap_or(Path::new("."));
        let mut w = WhisperWeights {
            origin: index.to_path_buf(),
            files: Vec::new(),
            entries: BTreeMap::new(),
        };
        let shards: BTreeSet<&String> = weight_map.values().collect();
        for shard in shards {
            let path = dir.join(shard);
            ensure!(
                path.is_file(),
                "shard index {} names {shard}, which does not exist",
                index.display()
            );
            w.add_file(&path)?;
        }
        for (name, shard) in &weight_map {
            let found = w.entries.get(name).map(|e| w.files[e.file].path());
            ensure!(
                found.and_then(|p| p.file_name()) == Some(shard.as_ref()),
                "shard index {} puts {name} in {shard}, which does not contain it",
                index.display()
            );
        }
        Ok(w)
    }

    fn add_file(&mut self, path: &Path) -> Result<()> {
        let file = self.files.len();
        let is_safetensors = path.extension().is_some_and(|e| e == "safetensors");
        let (source, tensors) = if is_safetensors {
            let (map, tensors) = map_safetensors(path)?;
            let tensors = tensors
                .into_iter()
                .map(|(name, dtype, shape, range)| (name, dtype, shape, Location::Mapped(range)))
                .collect::<Vec<_>>();
            (
                SourceFile::Safetensors {
                    path: path.to_path_buf(),
                    map,
                },
                tensors,
            )
        } else {
            // candle's pickle reader panics on some malformed pickles (a LONG1 of more than 8
            // bytes overflows its shift): that is an error about the file, not a crash.
            let pth = std::panic::catch_unwind(|| candle_core::pickle::PthTensors::new(path, None))
                .map_err(|_| {
                    anyhow!(
                        "{}: malformed pickle in the PyTorch checkpoint (candle's reader gave up)",
                        path.display()
                    )
                })?
                .with_context(|| {
                    format!(
                        "{}: not a readable PyTorch checkpoint (zip + pickle)",
                        path.display()
                    )
                })?;
            check_pickled(path, pth.tensor_infos())?;
            let tensors = pth
                .tensor_infos()
                .iter()
                .map(|(name, info)| {
                    let dtype = StoredDType::from_candle(info.dtype);
                    let shape = info.layout.dims().to_vec();
                    (name.clone(), dtype, shape, Location::Pickled(name.clone()))
                })
                .collect::<Vec<_>>();
            ensure!(
                !tensors.is_empty(),
                "{}: no tensors found in the state dict",
                path.display()
            );
            (
                SourceFile::Pth {
                    path: path.to_path_buf(),
                    pth,
                },
                tensors,
            )
        };
        self.files.push(source);
        for (stored, dtype, shape, location) in tensors {
            let name = canonical_name(&stored);
            let entry = Entry {
                file,
                shape,
                dtype,
                location,
            };
            if let Some(old) = self.entries.insert(name.clone(), entry) {
                if old.file == file {
                    bail!(
                        "{}: tensor {name} is stored twice, with and without the `model.` \
                         prefix ({stored} and {name}); save the checkpoint with one naming \
                         (WhisperForConditionalGeneration's `model.` or WhisperModel's bare one)",
                        path.display()
                    );
                }
                bail!(
                    "tensor {name} is in both {} and {}",
                    self.files[old.file].path().display(),
                    path.display()
                );
            }
        }
        Ok(())
    }

    /// The file errors are reported against (the weights file or the shard index).
    pub fn origin(&self) -> &Path {
        &self.origin
    }

    /// All tensor names, sorted, in Hugging Face `WhisperForConditionalGeneration` naming.
    pub fn names(&self) -> Vec<&str> {
        self.entries.keys().map(String::as_str).collect()
    }

    pub fn has(&self, name: &str) -> bool {
        self.entries.contains_key(name)
    }

    pub fn shape(&self, name: &str) -> Option<&[usize]> {
        self.entries.get(name).map(|e| e.shape.as_slice())
    }

    pub fn stored_dtype(&self, name: &str) -> Option<&StoredDType> {
        self.entries.get(name).map(|e| &e.dtype)
    }

    /// The file that holds `name`.
    pub fn file_of(&self, name: &str) -> Option<&Path> {
        self.entries.get(name).map(|e| self.files[e.file].path())
    }

    /// Reads a tensor as fp16. Stored fp16 is returned without copying; other float types are
    /// converted (round to nearest), failing if a finite value overflows fp16.
    pub fn tensor_f16(&self, name: &str) -> Result<F16Tensor> {
        let entry = self.entries.get(name).with_context(|| {
            format!(
                "tensor {name} is not in checkpoint {}",
                self.origin.display()
            )
        })?;
        let file = &self.files[entry.file];
        let what = || format!("tensor {name} in {}", file.path().display());
        ensure!(
            entry.dtype.is_float(),
            "{}: dtype {:?} is not a float type",
            what(),
            entry.dtype
        );
        let data = match (&entry.location, file) {
            (Location::Mapped(range), SourceFile::Safetensors { map, .. }) => {
                let raw = &map[range.clone()];
                let data = match entry.dtype {
                    StoredDType::F16 => Bytes::from_mmap(map.clone(), range.clone()),
                    StoredDType::F32 => convert::<4>(raw, f32::from_le_bytes),
                    StoredDType::BF16 => convert::<2>(raw, |b| bf16::from_le_bytes(b).to_f32()),
                    StoredDType::F64 => convert::<8>(raw, |b| f64_to_f32(f64::from_le_bytes(b))),
                    StoredDType::Other(_) => unreachable!("checked above"),
                };
                // fp16 data is the map itself; converted data is a copy, so its source
                // pages can go.
                if entry.dtype != StoredDType::F16 {
                    release_pages(map, range);
                }
                data
            }
            (Location::Pickled(key), SourceFile::Pth { pth, .. }) => {
                read_pickled(pth, key, &entry.dtype)
            }
            _ => unreachable!("entries point at their own kind of file"),
        };
        let data = data.with_context(what)?;
        check_finite(&data, &what)?;
        Ok(F16Tensor {
            shape: entry.shape.clone(),
            data,
        })
    }

    /// Drops the resident pages behind a memory-mapped tensor, e.g. once its fp16 data has
    /// been written out, so that a whole-model export does not keep the checkpoint resident
    /// (the turbo encoder is 1.3 GB). Data still referenced stays valid: the pages are
    /// clean and are read back from the file on the next access. No-op for other storage.
    pub fn release(&self, name: &str) {
        if let Some(Entry {
            file,
            location: Location::Mapped(range),
            ..
        }) = self.entries.get(name)
        {
            if let SourceFile::Safetensors { map, .. } = &self.files[*file] {
                release_pages(map, range);
            }
        }
    }

    /// Every tensor `component` needs, with its shape, in Hugging Face naming. With tied word
    /// embeddings `proj_out.weight` is optional and not listed.
    pub fn expected(cfg: &WhisperConfig, component: Component) -> Vec<(String, Vec<usize>)> {
        let d = cfg.d_model;
        let mut out: Vec<(String, Vec<usize>)> = Vec::new();
        let mut push = |name: String, shape: &[usize]| out.push((name, shape.to_vec()));
        let (p, layers, ffn) = match component {
            Component::Encoder => ("model.encoder", cfg.encoder_layers, cfg.encoder_ffn_dim),
            Component::Decoder => ("model.decoder", cfg.decoder_layers, cfg.decoder_ffn_dim),
        };
        match component {
            Component::Encoder => {
                push(format!("{p}.conv1.weight"), &[d, cfg.num_mel_bins, 3]);
                push(format!("{p}.conv1.bias"), &[d]);
                push(format!("{p}.conv2.weight"), &[d, d, 3]);
                push(format!("{p}.conv2.bias"), &[d]);
                push(
                    format!("{p}.embed_positions.weight"),
                    &[cfg.max_source_positions, d],
                );
            }
            Component::Decoder => {
                push(format!("{p}.embed_tokens.weight"), &[cfg.vocab_size, d]);
                push(
                    format!("{p}.embed_positions.weight"),
                    &[cfg.max_target_positions, d],
                );
            }
        }
        for i in 0..layers {
            let l = format!("{p}.layers.{i}");
            let mut attention = |a: &str| {
                for proj in ["q_proj", "k_proj", "v_proj", "out_proj"] {
                    push(format!("{l}.{a}.{proj}.weight"), &[d, d]);
                    // Whisper's key projection has no bias.
                    if proj != "k_proj" {
                        push(format!("{l}.{a}.{proj}.bias"), &[d]);
                    }
                }
                push(format!("{l}.{a}_layer_norm.weight"), &[d]);
                push(format!("{l}.{a}_layer_norm.bias"), &[d]);
            };
            attention("self_attn");
            if component == Component::Decoder {
                attention("encoder_attn");
            }
            push(format!("{l}.fc1.weight"), &[ffn, d]);
            push(format!("{l}.fc1.bias"), &[ffn]);
            push(format!("{l}.fc2.weight"), &[d, ffn]);
            push(format!("{l}.fc2.bias"), &[d]);
            push(format!("{l}.final_layer_norm.weight"), &[d]);
            push(format!("{l}.final_layer_norm.bias"), &[d]);
        }
        push(format!("{p}.layer_norm.weight"), &[d]);
        push(format!("{p}.layer_norm.bias"), &[d]);
        if component == Component::Decoder && !cfg.tie_word_embeddings {
            push("proj_out.weight".into(), &[cfg.vocab_size, d]);
        }
        out
    }

    /// Checks that every tensor `component` needs is present, float and of the right shape;
    /// the error lists every problem at once and names the checkpoint.
    pub fn check(&self, cfg: &WhisperConfig, component: Component) -> Result<()> {
        self.check_layer_count(cfg, component)?;
        let mut missing = Vec::new();
        let mut wrong = Vec::new();
        for (name, shape) in Self::expected(cfg, component) {
            match self.entries.get(&name) {
                None => missing.push(name),
                Some(e) if e.shape != shape => wrong.push(format!(
                    "{name} has shape {:?}, expected {shape:?} (in {})",
                    e.shape,
                    self.files[e.file].path().display()
                )),
                Some(e) if !e.dtype.is_float() => wrong.push(format!(
                    "{name} has dtype {:?}, expected a float type (in {})",
                    e.dtype,
                    self.files[e.file].path().display()
                )),
                Some(_) => {}
            }
        }
        if missing.is_empty() && wrong.is_empty() {
            return Ok(());
        }
        let mut msg = format!(
            "checkpoint {} does not fit the {} of this config (d_model {}, {} layers):",
            self.origin.display(),
            component.name(),
            cfg.d_model,
            match component {
                Component::Encoder => cfg.encoder_layers,
                Component::Decoder => cfg.decoder_layers,
            }
        );
        if !missing.is_empty() {
            msg += &format!(
                "\n  {} missing tensor(s): {}",
                missing.len(),
                missing.join(", ")
            );
        }
        for w in &wrong {
            msg += &format!("\n  {w}");
        }
        if missing.iter().any(|n| n == "proj_out.weight") {
            msg += "\n  config.json says tie_word_embeddings: false, so the vocabulary head \
                    proj_out.weight must be stored; if the head is tied to \
                    model.decoder.embed_tokens.weight, set tie_word_embeddings to true";
        }
        Err(anyhow!(msg))
    }
}

impl WhisperWeights {
    /// The config's layer count against the layers the checkpoint holds, before anything is
    /// listed per layer (a config claiming 1,000,000,000 layers must not make milkit build a
    /// list of 16 billion names): the first layer with no tensor at all is an error naming
    /// its first tensor. Takes at most one lookup per tensor present.
    fn check_layer_count(&self, cfg: &WhisperConfig, component: Component) -> Result<()> {
        let (p, layers, key) = match component {
            Component::Encoder => ("model.encoder", cfg.encoder_layers, "encoder_layers"),
            Component::Decoder => ("model.decoder", cfg.decoder_layers, "decoder_layers"),
        };
        for i in 0..layers {
            let prefix = format!("{p}.layers.{i}.");
            let present = self
                .entries
                .range(prefix.clone()..)
                .next()
                .is_some_and(|(k, _)| k.starts_with(&prefix));
            if !present {
                bail!(
                    "checkpoint {} does not fit the {} of this config: config.json says \
                     {key} = {layers}, but the checkpoint has no tensor of layer {i} (first \
                     missing tensor: {prefix}self_attn.q_proj.weight)",
                    self.origin.display(),
                    component.name(),
                );
            }
        }
        Ok(())
    }
}

/// Whether non-finite weights are let through with a warning (`--allow-nonfinite`) instead of
/// refused. Process-wide: the exports open their checkpoints deep inside the library.
static ALLOW_NONFINITE: AtomicBool = AtomicBool::new(false);

/// Lets tensors holding NaN or ±Inf through [`WhisperWeights::tensor_f16`] with a warning on
/// stderr (`true`), or refuses them (`false`, the default).
pub fn set_allow_nonfinite(allow: bool) {
    ALLOW_NONFINITE.store(allow, Ordering::Relaxed);
}

/// Refuses (or, with [`set_allow_nonfinite`], warns about) a tensor holding NaN or ±Inf: a
/// package built from it could only compute NaN.
fn check_finite(data: &Bytes, what: &dyn Fn() -> String) -> Result<()> {
    let bad = crate::passes::finite::count_nonfinite_f16(data.as_slice());
    if bad == 0 {
        return Ok(());
    }
    let total = data.len() / 2;
    if ALLOW_NONFINITE.load(Ordering::Relaxed) {
        eprintln!(
            "warning: {}: {bad} of {total} values are not finite (NaN or ±Inf); going on \
             (--allow-nonfinite)",
            what()
        );
        return Ok(());
    }
    bail!(
        "{}: {bad} of {total} values are not finite (NaN or ±Inf); a package built from it \
         could only compute NaN (pass --allow-nonfinite to export anyway)",
        what()
    )
}

/// Hugging Face's `WhisperModel` saves without the `model.` prefix that
/// `WhisperForConditionalGeneration` uses, and HF loads either; we index the latter form.
fn canonical_name(name: &str) -> String {
    if name.starts_with("encoder.") || name.starts_with("decoder.") {
        format!("model.{name}")
    } else {
        name.to_string()
    }
}

/// The graph builders read a checkpoint's tensors through [`WeightSource`].
impl WeightSource for WhisperWeights {
    fn f16(&self, name: &str) -> Result<(Vec<usize>, Bytes)> {
        let t = self.tensor_f16(name)?;
        Ok((t.shape, t.data))
    }
}
