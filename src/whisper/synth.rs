//! Synthetic Whisper checkpoints: a Hugging Face directory (`config.json`,
//! `generation_config.json`, `preprocessor_config.json`, `tokenizer.json` (see
//! `synth_tokenizer`), `model.safetensors`) with every tensor of the real model, filled with
//! deterministic, well-scaled pseudo-random values.
//!
//! The safetensors file is streamed: the header is computed from the shapes and written
//! first, then each tensor is generated in parallel chunks and appended, so even
//! large-v3-turbo (809 M parameters) needs only a few MB of memory. Values depend only on
//! (seed, tensor name, element index), never on chunking or thread count.

use super::config::{GenerationConfig, Preset, WhisperConfig};
use super::weights::{Component, WhisperWeights};
use anyhow::{bail, ensure, Context, Result};
use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};
use rayon::prelude::*;
use std::io::Write;
use std::path::{Path, PathBuf};

/// Element type of the synthetic `model.safetensors`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SynthDType {
    F16,
    F32,
    BF16,
}

impl SynthDType {
    pub fn size(self) -> usize {
        match self {
            SynthDType::F16 | SynthDType::BF16 => 2,
            SynthDType::F32 => 4,
        }
    }

    /// The dtype name in a safetensors header.
    fn header_name(self) -> &'static str {
        match self {
            SynthDType::F16 => "F16",
            SynthDType::F32 => "F32",
            SynthDType::BF16 => "BF16",
        }
    }
}

impl std::str::FromStr for SynthDType {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<SynthDType> {
        Ok(match s.to_ascii_lowercase().as_str() {
            "f16" | "fp16" | "float16" => SynthDType::F16,
            "f32" | "fp32" | "float32" => SynthDType::F32,
            "bf16" | "bfloat16" => SynthDType::BF16,
            _ => bail!("unknown dtype \"{s}\"; expected f16, f32 or bf16"),
        })
    }
}

/// How to write a synthetic checkpoint.
#[derive(Clone, Debug)]
pub struct SynthOptions {
    pub seed: u64,
    pub dtype: SynthDType,
    /// Show a progress bar on stderr.
    pub progress: bool,
    /// Replace an existing non-empty output directory (its whole content is replaced).
    pub force: bool,
}

/// Writes a synthetic checkpoint of a released model's shape into `out_dir` (created
/// atomically; an existing non-empty directory is refused unless `force`).
pub fn synthesize(
    preset: Preset,
    out_dir: &Path,
    seed: u64,
    dtype: SynthDType,
    progress: bool,
    force: bool,
) -> Result<()> {
    let opts = SynthOptions {
        seed,
        dtype,
        progress,
        force,
    };
    synthesize_with(
        &preset.config(),
        Some(&preset.generation_config()),
        out_dir,
        &opts,
    )
}

/// Writes a synthetic checkpoint for any valid config (e.g. a very small one for tests);
/// `generation_config.json` is written when `generation` is given.
pub fn synthesize_with(
    cfg: &WhisperConfig,
    generation: Option<&GenerationConfig>,
    out_dir: &Path,
    opts: &SynthOptions,
) -> Result<()> {
    cfg.validate().context("synthetic model config")?;
    if let Some(g) = generation {
        g.validate(cfg).context("synthetic generation config")?;
    }
    let staging = Staging::new(out_dir, opts.force)?;
    let write_json = |name: &str, value: &serde_json::Value| -> Result<()> {
        let path = staging.dir.join(name);
        let text = serde_json::to_string_pretty(value)?;
        std::fs::write(&path, text + "\n")
            .with_context(|| format!("cannot write {}", path.display()))
    };
    write_json("config.json", &cfg.to_json())?;
    if let Some(g) = generation {
        write_json("generation_config.json", &g.to_json())?;
    }
    write_json("preprocessor_config.json", &preprocessor_json(cfg))?;
    // Every Whisper vocabulary has a layout to build a tokenizer from; a test config with
    // another vocabulary gets none.
    if let Ok(tok) = super::synth_tokenizer::synth_tokenizer_json(cfg, generation) {
        let path = staging.dir.join("tokenizer.json");
        std::fs::write(&path, serde_json::to_string(&tok)? + "\n")
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    let model = staging.dir.join("model.safetensors");
    write_safetensors(cfg, &model, opts)
        .with_context(|| format!("cannot write {}", model.display()))?;
    staging.commit()
}

/// Every tensor a synthetic checkpoint holds, in file order: encoder, then decoder.
pub fn tensor_list(cfg: &WhisperConfig) -> Vec<(String, Vec<usize>)> {
    let mut all = WhisperWeights::expected(cfg, Component::Encoder);
    all.extend(WhisperWeights::expected(cfg, Component::Decoder));
    all
}

fn preprocessor_json(cfg: &WhisperConfig) -> serde_json::Value {
    serde_json::json!({
        "chunk_length": 30,
        "feature_extractor_type": "WhisperFeatureExtractor",
        "feature_size": cfg.num_mel_bins,
        "hop_length": 160,
        "n_fft": 400,
        "n_samples": 480000,
        "nb_max_frames": 3000,
        "padding_side": "right",
        "padding_value": 0.0,
        "processor_class": "WhisperProcessor",
        "return_attention_mask": false,
        "sampling_rate": 16000
    })
}

/// A temporary sibling directory that becomes `out_dir` on `commit` and is removed otherwise.
struct Staging {
    dir: PathBuf,
    out_dir: PathBuf,
    committed: bool,
}

impl Staging {
    fn new(out_dir: &Path, force: bool) -> Result<Staging> {
        if out_dir.exists() {
            ensure!(
                out_dir.is_dir(),
                "{} exists and is not a directory",
                out_dir.display()
            );
            let non_empty = std::fs::read_dir(out_dir)
                .with_context(|| format!("cannot list {}", out_dir.display()))?
                .next()
                .is_some();
            ensure!(
                !non_empty || force,
                "{} exists and is not empty; use force to replace it",
                out_dir.display()
            );
        }
        let parent = match out_dir.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        std::fs::create_dir_all(&parent)
            .with_context(|| format!("cannot create {}", parent.display()))?;
        let name = out_dir
            .file_name()
            .with_context(|| format!("{} has no directory name", out_dir.display()))?
            .to_string_lossy()
            .into_owned();
        let dir = parent.join(format!(".{name}.synth-{}", std::process::id()));
        if dir.exists() {
            std::fs::remove_dir_all(&dir)
                .with_context(|| format!("cannot remove stale {}", dir.display()))?;
        }
        std::fs::create_dir(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
        Ok(Staging {
            dir,
            out_dir: out_dir.to_path_buf(),
            committed: false,
        })
    }

    fn commit(mut self) -> Result<()> {
        let out = &self.out_dir;
        if out.exists() {
            // Move the old directory aside first so that out_dir is never half-written.
            let mut old = self.dir.clone().into_os_string();
            old.push(".old");
            let old = PathBuf::from(old);
            std::fs::rename(out, &old)
                .with_context(|| format!("cannot move {} aside", out.display()))?;
            std::fs::rename(&self.dir, out)
                .with_context(|| format!("cannot rename into {}", out.display()))?;
            std::fs::remove_dir_all(&old)
                .with_context(|| format!("cannot remove {}", old.display()))?;
        } else {
            std::fs::rename(&self.dir, out)
                .with_context(|| format!("cannot rename into {}", out.display()))?;
        }
        self.committed = true;
        Ok(())
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        if !self.committed {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// How the values of one tensor are drawn.
#[derive(Clone, Copy)]
enum Fill {
    /// mean + std · z, z ≈ N(0, 1).
    Normal { mean: f32, std: f32 },
    /// amp · sinusoid(position, channel) + noise · z, rows of `width` channels (Whisper's
    /// encoder positions are exactly such sinusoids).
    Sinusoid { width: usize, amp: f32, noise: f32 },
}

fn fill_for(name: &str, shape: &[usize]) -> Fill {
    let fan_in: usize = shape[1..].iter().product();
    if name.ends_with("embed_positions.weight") {
        let width = shape[1];
        // Decoder positions are learned and small in real checkpoints; encoder ones are not.
        let amp = if name.contains(".decoder.") {
            0.05
        } else {
            1.0
        };
        Fill::Sinusoid {
            width,
            amp,
            noise: 0.01,
        }
    } else if name.ends_with("layer_norm.weight") {
        Fill::Normal {
            mean: 1.0,
            std: 0.05,
        }
    } else if name.ends_with(".bias") {
        Fill::Normal {
            mean: 0.0,
            std: 0.02,
        }
    } else if name.ends_with("embed_tokens.weight") || name == "proj_out.weight" {
        // Logits are layer-normed states · embeddings: std ≈ 0.05·sqrt(d), i.e. 1–2.
        Fill::Normal {
            mean: 0.0,
            std: 0.05,
        }
    } else {
        // Linear and conv weights: 1/sqrt(fan_in) keeps activations O(1) layer to layer.
        Fill::Normal {
            mean: 0.0,
            std: 1.0 / (fan_in.max(1) as f32).sqrt(),
        }
    }
}

/// SplitMix64's finaliser: a strong 64-bit mix (used once per tensor for its key).
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A per-tensor key from the seed and the tensor name (FNV-1a, then mixed).
fn tensor_key(seed: u64, name: &str) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for b in name.bytes() {
        h = (h ^ b as u64).wrapping_mul(0x0100_0000_01b3);
    }
    mix(h ^ mix(seed))
}

/// "lowbias32" (C. Wellons): a 32-bit bijective hash. 32-bit lanes vectorise (AVX2 has no
/// 64-bit multiply), which makes per-element hashing several times cheaper than SplitMix64.
fn hash32(mut x: u32) -> u32 {
    x ^= x >> 16;
    x = x.wrapping_mul(0x7feb_352d);
    x ^= x >> 15;
    x = x.wrapping_mul(0x846c_a68b);
    x ^ (x >> 16)
}

/// Approximately standard normal values for elements `base..base + out.len()` of the tensor
/// with `key`: a keyed two-round hash of the element index gives four uniform bytes whose
/// sum (Irwin–Hall: mean 510, std 147.8) is standardised; 1021 levels within ±3.45σ, finer
/// than fp16 needs. Counters are 32-bit, so a tensor above 2^32 elements would repeat
/// itself (Whisper's largest has 66 M).
fn normals(out: &mut [f32], key: u64, base: usize) {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2 (checked just above).
        return unsafe { normals_avx2(out, key, base) };
    }
    normals_body(out, key, base)
}

/// The same loop compiled for AVX2: 8-lane 32-bit multiplies make it ~3x faster than the
/// SSE2 baseline build.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn normals_avx2(out: &mut [f32], key: u64, base: usize) {
    normals_body(out, key, base)
}

#[inline(always)]
fn normals_body(out: &mut [f32], key: u64, base: usize) {
    let (k1, k2) = (key as u32, (key >> 32) as u32);
    // A u32 counter and an i32 → f32 conversion keep every step in 8-lane AVX2 instructions
    // (u32 → f32 and usize arithmetic would not vectorise).
    let start = base as u32;
    for (j, o) in (0u32..).zip(out.iter_mut()) {
        let a = hash32(hash32(start.wrapping_add(j) ^ k1) ^ k2);
        let sum = (a & 0xff) + ((a >> 8) & 0xff) + ((a >> 16) & 0xff) + (a >> 24);
        *o = (sum as i32 - 510) as f32 * (1.0 / 147.8);
    }
}

/// Whisper's sinusoid table: channel c < width/2 is sin(pos · 10000^(-c/(width/2 - 1))),
/// the second half the matching cos.
fn sinusoid(width: usize, i: usize) -> f32 {
    let (pos, ch) = (i / width, i % width);
    let half = (width / 2).max(1);
    let inc = (10000f32).ln() / (half.max(2) - 1) as f32;
    let angle = pos as f32 * (-inc * (ch % half) as f32).exp();
    if ch < half {
        angle.sin()
    } else {
        angle.cos()
    }
}

/// Fills `dst` with elements `base..` of one tensor: values in f32 first (vectorised
/// hashing), then one bulk conversion (F16C/SIMD in `half`). This is the whole cost of
/// synthesis: ~800 M elements for large-v3-turbo.
fn fill_chunk(dst: &mut [u8], dtype: SynthDType, fill: Fill, key: u64, base: usize) {
    let mut vals = vec![0f32; dst.len() / dtype.size()];
    normals(&mut vals, key, base);
    match fill {
        Fill::Normal { mean, std } => vals.iter_mut().for_each(|v| *v = mean + std * *v),
        Fill::Sinusoid { width, amp, noise } => {
            for (j, v) in vals.iter_mut().enumerate() {
                *v = amp * sinusoid(width, base + j) + noise * *v;
            }
        }
    }
    match dtype {
        SynthDType::F32 => encode(dst, &vals, |v: &f32| v.to_le_bytes()),
        SynthDType::F16 => {
            let mut h = vec![f16::ZERO; vals.len()];
            h.convert_from_f32_slice(&vals);
            encode(dst, &h, |v: &f16| v.to_le_bytes());
        }
        SynthDType::BF16 => {
            let mut h = vec![bf16::ZERO; vals.len()];
            h.convert_from_f32_slice(&vals);
            encode(dst, &h, |v: &bf16| v.to_le_bytes());
        }
    }
}

/// Little-endian bytes of `vals` into `dst`: one memcpy on little-endian machines (a
/// per-element copy was the single largest cost of synthesis), swapped elsewhere.
fn encode<T: bytemuck::Pod, const N: usize>(
    dst: &mut [u8],
    vals: &[T],
    le: impl Fn(&T) -> [u8; N],
) {
    if cfg!(target_endian = "little") {
        dst.copy_from_slice(bytemuck::cast_slice(vals));
    } else {
        for (d, v) in dst.chunks_exact_mut(N).zip(vals) {
            d.copy_from_slice(&le(v));
        }
    }
}

/// Writes the header, then every tensor in chunks generated in parallel. No fsync: the data
/// can be regenerated, syncing 1.6 GB takes tens of seconds on slow disks, and the final
/// rename already makes the directory appear whole to readers.
fn write_safetensors(cfg: &WhisperConfig, path: &Path, opts: &SynthOptions) -> Result<()> {
    let tensors = tensor_list(cfg);
    let esize = opts.dtype.size();
    let mut header = serde_json::Map::new();
    header.insert("__metadata__".into(), serde_json::json!({ "format": "pt" }));
    let mut offset = 0usize;
    for (name, shape) in &tensors {
        let bytes = shape.iter().product::<usize>() * esize;
        header.insert(
            name.clone(),
            serde_json::json!({
                "dtype": opts.dtype.header_name(),
                "shape": shape,
                "data_offsets": [offset, offset + bytes],
            }),
        );
        offset += bytes;
    }
    let total = offset;
    let mut header = serde_json::to_string(&header)?.into_bytes();
    // Pad with spaces so the data starts 8-byte aligned, as the reference writer does.
    while (8 + header.len()) % 8 != 0 {
        header.push(b' ');
    }
    let mut file = std::fs::File::create(path)?;
    file.write_all(&(header.len() as u64).to_le_bytes())?;
    file.write_all(&header)?;

    let bar = if opts.progress {
        let bar = indicatif::ProgressBar::new(total as u64);
        if let Ok(style) = indicatif::ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {wide_bar} {bytes}/{total_bytes} {msg}",
        ) {
            bar.set_style(style);
        }
        bar
    } else {
        indicatif::ProgressBar::hidden()
    };
    // 4 Mi elements per write (≤ 16 MB), 64 Ki per parallel task.
    const GROUP: usize = 1 << 22;
    const CHUNK: usize = 1 << 16;
    let mut buf = vec![0u8; GROUP * esize];
    for (name, shape) in &tensors {
        bar.set_message(name.clone());
        let fill = fill_for(name, shape);
        let key = tensor_key(opts.seed, name);
        let n: usize = shape.iter().product();
        let mut start = 0;
        while start < n {
            let len = GROUP.min(n - start);
            let out = &mut buf[..len * esize];
            out.par_chunks_mut(CHUNK * esize)
                .enumerate()
                .for_each(|(c, dst)| fill_chunk(dst, opts.dtype, fill, key, start + c * CHUNK));
            file.write_all(out)?;
            bar.inc(out.len() as u64);
            start += len;
        }
    }
    bar.finish_and_clear();
    Ok(())
}
