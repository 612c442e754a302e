//! Fuzz harnesses: one function per hostile-input class (safetensors header, shard index,
//! config.json, generation_config.json, Manifest.json, model.mlmodel, model.mil,
//! coremldata.bin, weight.bin,
//! WAV, FLAC, MP3, Ogg (Vorbis, Opus, FLAC), M4A (AAC, ALAC), WebM, tokenizer.json, recipe,
//! pytorch_model.bin), each feeding arbitrary bytes to milkit's
//! real parsing entry point. The `fuzz/` crate's libFuzzer targets and the corpus replay test
//! (`tests/fuzz_corpus.rs`) call the same functions, so a crash the fuzzer finds is a test
//! failure once its reproducer is committed.
//!
//! A harness returns `Ok` or the entry point's error (both are fine: errors are the expected
//! answer to bad bytes); a panic, abort or hang is the finding. Entry points that read paths
//! get the bytes through a file in a per-process scratch directory.
use crate::convert::recipe::Recipe;
use crate::package::blob::BlobReader;
use crate::package::manifest::Manifest;
use crate::whisper::audio::load_audio;
use crate::whisper::config::{GenerationConfig, WhisperConfig};
use crate::whisper::tokenizer::Tokenizer;
use crate::whisper::weights::WhisperWeights;
use anyhow::{Context, Result};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

/// A harness: arbitrary bytes in, the entry point's verdict out.
pub type Harness = fn(&[u8]) -> Result<()>;

/// Every harness by its target name (the names of `fuzz/fuzz_targets/*.rs` and of the corpus
/// folders under `fuzz/corpus/`).
pub const TARGETS: &[(&str, Harness)] = &[
    ("safetensors", safetensors),
    ("shard_index", shard_index),
    ("config", config),
    ("generation_config", generation_config),
    ("manifest", manifest),
    ("mlmodel", mlmodel),
    ("model_mil", model_mil),
    ("coremldata", coremldata),
    ("weight_bin", weight_bin),
    ("wav", wav),
    ("flac", flac),
    ("mp3", mp3),
    ("ogg", ogg),
    ("m4a", m4a),
    ("webm", webm),
    ("tokenizer", tokenizer),
    ("recipe", recipe),
    ("pytorch", pytorch),
];

/// The harness of a target name.
pub fn harness(name: &str) -> Option<Harness> {
    TARGETS.iter().find(|(n, _)| *n == name).map(|(_, f)| *f)
}

/// This thread's scratch directory (created on first use, under the system temp dir): one
/// per thread, so that harnesses run from parallel tests never rewrite a file another
/// thread has mapped.
fn scratch() -> PathBuf {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static DIR: PathBuf = {
            let n = NEXT.fetch_add(1, Ordering::Relaxed);
            std::env::temp_dir().join(format!("milkit-fuzz-{}-{n}", std::process::id()))
        };
    }
    DIR.with(|d| d.clone())
}

/// Removes this thread's scratch directory (the replay test's tidy-up; a fuzzing process
/// leaves its one folder behind).
pub fn remove_scratch() {
    let _ = std::fs::remove_dir_all(scratch());
}

/// Writes `data` to `name` in a fresh subfolder `sub` of the scratch directory.
fn put(sub: &str, name: &str, data: &[u8]) -> Result<PathBuf> {
    let dir = scratch().join(sub);
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let path = dir.join(name);
    std::fs::write(&path, data).with_context(|| format!("cannot write {}", path.display()))?;
    Ok(path)
}

/// The smallest config.json the generation-config and tokenizer checks are measured against.
fn small_config() -> WhisperConfig {
    WhisperConfig::from_json_str(
        r#"{"d_model":64,"encoder_layers":1,"decoder_layers":1,"encoder_attention_heads":2,
            "decoder_attention_heads":2,"encoder_ffn_dim":128,"decoder_ffn_dim":128,
            "num_mel_bins":80,"vocab_size":51864,"max_source_positions":1500,
            "max_target_positions":448}"#,
    )
    .expect("the built-in fuzz config is valid")
}

/// A `model.safetensors` file: header and data as bytes; every tensor read back as fp16.
pub fn safetensors(data: &[u8]) -> Result<()> {
    let path = put("safetensors", "model.safetensors", data)?;
    let w = WhisperWeights::open_file(&path)?;
    let names: Vec<String> = w.names().iter().map(|s| s.to_string()).collect();
    for name in names.iter().take(16) {
        // Reading converts every element; a wrong size must be an error, not a slice panic.
        let _ = w.tensor_f16(name);
    }
    Ok(())
}

/// The one valid shard the shard index target's indices point at.
const SHARD_NAME: &str = "model-00001-of-00001.safetensors";

fn tiny_safetensors() -> Vec<u8> {
    // Two tensors: model.encoder.conv1.bias f16 [2], proj_out.weight f32 [1].
    let header = br#"{"model.encoder.conv1.bias":{"dtype":"F16","shape":[2],"data_offsets":[0,4]},"proj_out.weight":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}"#;
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header);
    out.extend_from_slice(&[0, 60, 0, 188, 0, 0, 128, 63]);
    out
}

/// A `model.safetensors.index.json` next to one small valid shard.
pub fn shard_index(data: &[u8]) -> Result<()> {
    let dir = scratch().join("shard_index");
    let shard = dir.join(SHARD_NAME);
    if !shard.exists() {
        put("shard_index", SHARD_NAME, &tiny_safetensors())?;
    }
    let path = put("shard_index", "model.safetensors.index.json", data)?;
    let w = WhisperWeights::open_index(&path)?;
    for name in w.names().iter().take(16) {
        let _ = w.tensor_f16(name);
    }
    Ok(())
}

/// A `config.json` (dimensions validated), then the tensor list it implies.
pub fn config(data: &[u8]) -> Result<()> {
    let text = std::str::from_utf8(data).context("config.json is not UTF-8")?;
    let cfg = WhisperConfig::from_json_str(text)?;
    let _ = cfg.to_json();
    Ok(())
}

/// A `generation_config.json`, validated against a small model.
pub fn generation_config(data: &[u8]) -> Result<()> {
    let path = put("generation_config", "generation_config.json", data)?;
    let g = GenerationConfig::from_file(&path)?;
    let cfg = small_config();
    g.validate(&cfg)?;
    let _ = g.split_alignment_heads(&cfg);
    let _ = g.to_json();
    Ok(())
}

/// A package's `Manifest.json`.
pub fn manifest(data: &[u8]) -> Result<()> {
    let text = std::str::from_utf8(data).context("Manifest.json is not UTF-8")?;
    let m = Manifest::parse(text, Path::new("Manifest.json"))?;
    let _ = m.root_item();
    let _ = m.to_json()?;
    Ok(())
}

/// The manifest of the package the mlmodel target loads (model.mlmodel and weight.bin).
const MLMODEL_MANIFEST: &str = r#"{
  "fileFormatVersion": "1.0.0",
  "itemInfoEntries": {
    "A": {"author": "com.apple.CoreML", "description": "CoreML Model Specification",
          "name": "model.mlmodel", "path": "com.apple.CoreML/model.mlmodel"},
    "B": {"author": "com.apple.CoreML", "description": "CoreML Model Weights",
          "name": "weights", "path": "com.apple.CoreML/weights"}
  },
  "rootModelIdentifier": "A"
}"#;

/// The weight.bin of the mlmodel target's package: set once per process by the fuzz target
/// (or the replay test) to the seed package's weights, empty otherwise.
pub static MLMODEL_WEIGHTS: OnceLock<Vec<u8>> = OnceLock::new();

/// A `model.mlmodel` (protobuf) loaded as a package with a fixed weight.bin: decoded,
/// converted to IR and every op's types re-inferred.
pub fn mlmodel(data: &[u8]) -> Result<()> {
    let pkg = scratch().join("mlmodel.mlpackage");
    let weights = pkg.join("Data/com.apple.CoreML/weights");
    if !weights.join("weight.bin").exists() {
        std::fs::create_dir_all(&weights)?;
        let blob = MLMODEL_WEIGHTS.get().map(Vec::as_slice).unwrap_or(&[]);
        std::fs::write(weights.join("weight.bin"), blob)?;
        std::fs::write(pkg.join("Manifest.json"), MLMODEL_MANIFEST)?;
    }
    std::fs::write(pkg.join("Data/com.apple.CoreML/model.mlmodel"), data)?;
    crate::package::load_package(&pkg)?;
    Ok(())
}

/// A compiled model's `coremldata.bin`: the header followed, the `ModelDescription`
/// decoded and turned into the IR's description.
pub fn coremldata(data: &[u8]) -> Result<()> {
    let c = crate::package::coremldata::parse_coremldata(data)?;
    crate::package::load::description_from_proto(&c.description)?;
    Ok(())
}

/// A compiled model's `model.mil` (program text) in an `.mlmodelc` folder whose
/// `weights/weight.bin` is the mlmodel target's: parsed, every op's types re-inferred, the
/// description built; then printed back as text, which must read back as the same program.
pub fn model_mil(data: &[u8]) -> Result<()> {
    use crate::package::mil_text::{parse_program, Weights};
    use crate::package::mil_write::{write_program, Dialect, OffsetCounter};
    let dir = scratch().join("model_mil.mlmodelc");
    let weights = dir.join("weights");
    if !weights.join("weight.bin").exists() {
        std::fs::create_dir_all(&weights)?;
        let blob = MLMODEL_WEIGHTS.get().map(Vec::as_slice).unwrap_or(&[]);
        std::fs::write(weights.join("weight.bin"), blob)?;
    }
    std::fs::write(dir.join("model.mil"), data)?;
    let c = crate::package::compiled::open_compiled(&dir)?;
    // Printed back with every constant inline, the text must be read as the same program.
    let text = write_program(
        &c.model.program,
        Dialect::for_program(&c.model.program),
        None,
    )?;
    let none = Weights::Absent("inline".into());
    let back = parse_program(&text, "printed", &none, None)?;
    anyhow::ensure!(
        back.program == c.model.program,
        "the printed program reads back differently"
    );
    let mut offsets = OffsetCounter::default();
    let _ = write_program(&c.model.program, Dialect::V1_0, Some(&mut offsets))?;
    Ok(())
}

/// A `weight.bin` blob storage file: the header, then every record walked and validated.
pub fn weight_bin(data: &[u8]) -> Result<()> {
    let path = put("weight_bin", "weight.bin", data)?;
    let r = BlobReader::open(&path)?;
    for offset in r.offsets()? {
        let b = r.read_blob(offset)?;
        let _ = b.num_elements();
    }
    Ok(())
}

/// `data` saved as `audio.<ext>` (the extension is the decoders' first hint), decoded and
/// resampled to 16 kHz mono: the harness of every audio format.
fn audio_file(ext: &str, data: &[u8]) -> Result<()> {
    load_audio(&put(ext, &format!("audio.{ext}"), data)?)?;
    Ok(())
}

/// A WAV file (PCM, float, extensible, µ-law, A-law, ADPCM).
pub fn wav(data: &[u8]) -> Result<()> {
    audio_file("wav", data)
}

/// A FLAC file.
pub fn flac(data: &[u8]) -> Result<()> {
    audio_file("flac", data)
}

/// An MP3 file (with or without ID3 tags and a Xing/LAME header).
pub fn mp3(data: &[u8]) -> Result<()> {
    audio_file("mp3", data)
}

/// An Ogg file (Vorbis, Opus or FLAC inside).
pub fn ogg(data: &[u8]) -> Result<()> {
    audio_file("ogg", data)
}

/// An MP4/M4A file (AAC or ALAC inside).
pub fn m4a(data: &[u8]) -> Result<()> {
    audio_file("m4a", data)
}

/// A WebM/Matroska file (Opus, Vorbis, FLAC, AAC or MP3 inside).
pub fn webm(data: &[u8]) -> Result<()> {
    audio_file("webm", data)
}

/// A `tokenizer.json`, then a round trip of a short text through it.
pub fn tokenizer(data: &[u8]) -> Result<()> {
    let text = std::str::from_utf8(data).context("tokenizer.json is not UTF-8")?;
    let tok = Tokenizer::from_json(text)?;
    let ids = tok.encode(" And so my fellow Americans, ask not.")?;
    let _ = tok.decode(&ids, false);
    let all: Vec<u32> = (0..tok.len().min(4096) as u32).collect();
    let _ = tok.decode(&all, true);
    Ok(())
}

/// A conversion recipe (`models/*.toml`).
pub fn recipe(data: &[u8]) -> Result<()> {
    let path = put("recipe", "recipe.toml", data)?;
    Recipe::from_file(&path)?;
    Ok(())
}

/// A `pytorch_model.bin` (zip + pickle): opened, every tensor read back as fp16.
pub fn pytorch(data: &[u8]) -> Result<()> {
    let path = put("pytorch", "pytorch_model.bin", data)?;
    let w = WhisperWeights::open_file(&path)?;
    let names: Vec<String> = w.names().iter().map(|s| s.to_string()).collect();
    for name in names.iter().take(16) {
        let _ = w.tensor_f16(name);
    }
    Ok(())
}
