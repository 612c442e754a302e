//! Deterministic mutation replay over every reader of outside data: each target starts from
//! a valid file the test writes itself (a safetensors checkpoint, config.json,
//! generation_config.json, tokenizer.json, Manifest.json, model.mlmodel, weight.bin, a WAV
//! file, a recipe) and feeds its reader `MILKIT_MUTATIONS` (default 300) mutants — bit flips,
//! random bytes, interesting integers (0, -1, 2^31, 2^32 - 1, 2^40, u64::MAX) written over
//! the data, truncations, deleted and duplicated spans, and for text files huge or negative
//! numbers in place of numbers. A reader may accept or refuse a mutant; it must never panic
//! (caught and reported with the seed and the mutation) nor abort the process (which fails
//! the test binary). Not a coverage-guided fuzzer (none runs on stable Rust here without
//! building AFL++): a cheap, reproducible guard that runs in seconds with the other tests.

use milkit::ir::{ArrayDType, DType, Description, Feature, Model, Opset, Value, ValueType};
use milkit::ops::{Builder, In};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;

mod common;
use common::rng::Rng;

const INTERESTING: [u64; 8] = [
    0,
    1,
    u64::MAX,
    0x7fff_ffff,
    0x8000_0000,
    0xffff_ffff,
    1 << 40,
    0xdead_beef,
];

/// One mutant of `seed` and what was done (for the report).
fn mutate(seed: &[u8], r: &mut Rng, text: bool) -> (Vec<u8>, String) {
    let mut b = seed.to_vec();
    let mut what = Vec::new();
    for _ in 0..1 + r.below(3) {
        let len = b.len();
        let at = r.below(len.max(1));
        let kinds = if text { 8 } else { 6 };
        match r.below(kinds) {
            0 if len > 0 => {
                let bit = r.below(8);
                b[at] ^= 1 << bit;
                what.push(format!("flip bit {bit} at {at}"));
            }
            1 if len > 0 => {
                let v = r.next_u64() as u8;
                b[at] = v;
                what.push(format!("byte {v} at {at}"));
            }
            2 => {
                let v = INTERESTING[r.below(INTERESTING.len())];
                let w = [1usize, 2, 4, 8][r.below(4)];
                let bytes = v.to_le_bytes();
                for (k, x) in bytes.iter().take(w).enumerate() {
                    if at + k < len {
                        b[at + k] = *x;
                    }
                }
                what.push(format!("{w}-byte {v:#x} at {at}"));
            }
            3 => {
                b.truncate(at);
                what.push(format!("truncate at {at}"));
            }
            4 if len > 0 => {
                let n = 1 + r.below((len - at).min(64));
                b.drain(at..at + n);
                what.push(format!("delete {n} at {at}"));
            }
            5 if len > 0 => {
                let n = 1 + r.below((len - at).min(64));
                let span: Vec<u8> = b[at..at + n].to_vec();
                let to = r.below(len);
                b.splice(to..to, span);
                what.push(format!("copy {n} from {at} to {to}"));
            }
            _ => {
                // Text: replace the number starting at or after `at` by an extreme one.
                let Some(start) = b[at..].iter().position(|c| c.is_ascii_digit()) else {
                    continue;
                };
                let start = at + start;
                let end = start + b[start..].iter().take_while(|c| c.is_ascii_digit()).count();
                let v = [
                    "0",
                    "-1",
                    "4294967296",
                    "18446744073709551616",
                    "1000000000",
                    "1e309",
                    "99999999999999999999999",
                ][r.below(7)];
                b.splice(start..end, v.bytes());
                what.push(format!("number {v} at {start}"));
            }
        }
    }
    (b, what.join(", "))
}

fn iterations() -> usize {
    std::env::var("MILKIT_MUTATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300)
}

/// Feeds `iterations()` mutants of `seed` to `target` (which writes them where its reader
/// looks); fails listing every mutant that panicked.
fn replay(name: &str, seed: &[u8], text: bool, target: &dyn Fn(&[u8])) {
    // The unmutated seed must be readable, or the mutants test nothing.
    target(seed);
    // The panic hook is process-wide: one replay at a time swaps it.
    static HOOK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _guard = HOOK.lock().unwrap_or_else(|e| e.into_inner());
    let prev = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let mut panics = Vec::new();
    for i in 0..iterations() {
        let mut r = Rng(0x5eed ^ (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let (m, what) = mutate(seed, &mut r, text);
        if let Err(p) = catch_unwind(AssertUnwindSafe(|| target(&m))) {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            panics.push(format!("{name} mutant {i} ({what}): {msg}"));
        }
    }
    std::panic::set_hook(prev);
    assert!(panics.is_empty(), "{}", panics.join("\n"));
}

fn small_package(path: &Path) {
    let mut b = Builder::new(Opset::Ios17);
    let x = b.input("x", ValueType::tensor(DType::F16, &[2, 16]));
    let w: Vec<half::f16> = (0..16 * 16)
        .map(|i| half::f16::from_f32(i as f32 / 64.0))
        .collect();
    let y = b
        .op1(
            "linear",
            "y",
            vec![
                ("x", In::V(x)),
                (
                    "weight",
                    In::C(Value::Tensor(milkit::ir::Tensor::f16(&[16, 16], &w))),
                ),
            ],
        )
        .unwrap();
    let z = b
        .op1(
            "reduce_sum",
            "z",
            vec![
                ("x", In::V(y)),
                ("axes", In::C(Value::i32s(&[1]))),
                ("keep_dims", In::C(Value::bool_scalar(false))),
            ],
        )
        .unwrap();
    let (inputs, block) = b.finish(&[(z, "z")]).unwrap();
    let m = Model::single(
        Opset::Ios17,
        inputs,
        block,
        Description {
            inputs: vec![Feature::new("x", ArrayDType::F16, &[2, 16])],
            outputs: vec![Feature::new("z", ArrayDType::F16, &[2])],
            ..Default::default()
        },
    );
    milkit::package::save_package(&m, path, false, &mut |_| {}).unwrap();
}

/// Loads a package and, when it loads, compiles it under a 64 MiB cap.
fn load_and_compile(pkg: &Path) {
    if let Ok(m) = milkit::package::load_package(pkg) {
        let opts = milkit::runtime::Options {
            max_memory: Some(64 << 20),
            ..Default::default()
        };
        let _ = milkit::runtime::Session::from_model_with(m, &opts);
    }
}

#[test]
fn package_files_model_mlmodel_weight_bin_and_manifest_never_panic() {
    let tmp = tempfile::tempdir().unwrap();
    let pkg = tmp.path().join("p.mlpackage");
    small_package(&pkg);
    let data = pkg.join("Data/com.apple.CoreML");
    for (name, file, text) in [
        ("model.mlmodel", data.join("model.mlmodel"), false),
        ("weight.bin", data.join("weights/weight.bin"), false),
        ("Manifest.json", pkg.join("Manifest.json"), true),
    ] {
        let seed = std::fs::read(&file).unwrap();
        replay(name, &seed, text, &|bytes| {
            std::fs::write(&file, bytes).unwrap();
            load_and_compile(&pkg);
        });
        std::fs::write(&file, &seed).unwrap();
    }
    milkit::package::load_package(&pkg).unwrap();
}

#[test]
fn blob_reader_records_never_panic() {
    let tmp = tempfile::tempdir().unwrap();
    let pkg = tmp.path().join("p.mlpackage");
    small_package(&pkg);
    let file = pkg.join("Data/com.apple.CoreML/weights/weight.bin");
    let seed = std::fs::read(&file).unwrap();
    let path = tmp.path().join("w.bin");
    replay("weight.bin records", &seed, false, &|bytes| {
        std::fs::write(&path, bytes).unwrap();
        if let Ok(r) = milkit::package::blob::BlobReader::open(&path) {
            if let Ok(offsets) = r.offsets() {
                for o in offsets {
                    let _ = r.read_blob(o);
                }
            }
            for o in [0u64, 64, 128, u64::MAX - 63] {
                let _ = r.read_blob(o);
            }
        }
    });
}

#[test]
fn checkpoint_configs_and_tokenizer_never_panic() {
    use milkit::whisper::config::{GenerationConfig, WhisperConfig};
    let cfg = {
        let mut c = milkit::whisper::config::Preset::Tiny.config();
        c.d_model = 64;
        c.encoder_ffn_dim = 128;
        c.decoder_ffn_dim = 128;
        c
    };
    let text = serde_json::to_string_pretty(&cfg.to_json()).unwrap();
    replay("config.json", text.as_bytes(), true, &|b| {
        if let Ok(s) = std::str::from_utf8(b) {
            let _ = WhisperConfig::from_json_str(s);
        }
    });
    let gen = serde_json::json!({
        "alignment_heads": [[2, 0], [3, 1]],
        "begin_suppress_tokens": [220, 50256],
        "bos_token_id": 50257, "decoder_start_token_id": 50257, "eos_token_id": 50256,
        "pad_token_id": 50256, "max_initial_timestamp_index": 50, "max_length": 448,
        "no_timestamps_token_id": 50362, "suppress_tokens": [1, 2, 7, 8, 50256],
        "forced_decoder_ids": [[1, 50362]], "is_multilingual": false
    })
    .to_string();
    replay("generation_config.json", gen.as_bytes(), true, &|b| {
        if let Ok(g) = serde_json::from_slice::<GenerationConfig>(b) {
            let _ = g.validate(&cfg);
        }
    });
    let tok = serde_json::json!({
        "model": {"vocab": {"a": 0, "b": 1, "Ġthe": 2, "ab": 3}},
        "added_tokens": [
            {"id": 50256, "content": "<|endoftext|>", "special": true},
            {"id": 50257, "content": "<|startoftranscript|>", "special": true}
        ]
    })
    .to_string();
    replay("tokenizer.json", tok.as_bytes(), true, &|b| {
        if let Ok(s) = std::str::from_utf8(b) {
            if let Ok(t) = milkit::whisper::tokenizer::Tokenizer::from_json(s) {
                let _ = t.decode(&[0, 1, 2, 3, 50256, 50257, 51000, u32::MAX], false);
            }
        }
    });
}

#[test]
fn safetensors_checkpoints_never_panic() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("model.safetensors");
    let a: Vec<u8> = (0..64u16)
        .flat_map(|v| half::f16::from_f32(v as f32).to_le_bytes())
        .collect();
    let b: Vec<u8> = (0..12).flat_map(|v| (v as f32).to_le_bytes()).collect();
    let views = vec![
        (
            "model.encoder.conv1.bias",
            safetensors::tensor::TensorView::new(safetensors::Dtype::F16, vec![8, 8], &a).unwrap(),
        ),
        (
            "model.encoder.layer_norm.weight",
            safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![3, 4], &b).unwrap(),
        ),
    ];
    safetensors::serialize_to_file(views, None, &path).unwrap();
    let seed = std::fs::read(&path).unwrap();
    replay("model.safetensors", &seed, false, &|bytes| {
        std::fs::write(&path, bytes).unwrap();
        if let Ok(w) = milkit::whisper::weights::WhisperWeights::open_file(&path) {
            for n in w.names() {
                let _ = w.tensor_f16(n);
            }
        }
    });
    // The shard index of a sharded checkpoint.
    std::fs::write(&path, &seed).unwrap();
    let index = tmp.path().join("model.safetensors.index.json");
    let text = serde_json::json!({"metadata": {"total_size": 152}, "weight_map": {
        "model.encoder.conv1.bias": "model.safetensors",
        "model.encoder.layer_norm.weight": "model.safetensors"}})
    .to_string();
    replay("shard index", text.as_bytes(), true, &|bytes| {
        std::fs::write(&index, bytes).unwrap();
        let _ = milkit::whisper::weights::WhisperWeights::open_index(&index);
    });
}

#[test]
fn wav_files_and_recipes_never_panic() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("a.wav");
    let spec = hound::WavSpec {
        channels: 2,
        sample_rate: 22_050,
        bits_per_sample: 16,
        sample_format: hound::SampleFormat::Int,
    };
    let mut w = hound::WavWriter::create(&path, spec).unwrap();
    for i in 0..400 {
        w.write_sample(((i * 37) % 2000) as i16 - 1000).unwrap();
    }
    w.finalize().unwrap();
    let seed = std::fs::read(&path).unwrap();
    replay("wav", &seed, false, &|bytes| {
        std::fs::write(&path, bytes).unwrap();
        let _ = milkit::whisper::audio::load_audio(&path);
    });
    let recipe = tmp.path().join("r.toml");
    let seed = std::fs::read(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("models/whisperkit-tiny-lut4.toml"),
    )
    .unwrap();
    replay("recipe", &seed, true, &|bytes| {
        std::fs::write(&recipe, bytes).unwrap();
        let _ = milkit::convert::recipe::Recipe::from_file(&recipe);
    });
}
