//! The one test support module: fixture lookup (MILKIT_FIXTURES, MILKIT_WHISPER_BASE,
//! MILKIT_REQUIRE_FIXTURES), the coremltools python and the conformance validator, the CLI,
//! the test RNG ([`rng::Rng`]); [`programs`] builds and runs small Builder programs,
//! [`encoders`] synthetic encoders and packages for the verify tests.
#![allow(dead_code)]

pub mod encoders;
pub mod programs;
pub mod rng;

use std::path::{Path, PathBuf};
use std::process::Command;

/// How many ops of type `op_type` `m`'s main function holds (nested blocks included).
pub fn count_ops(m: &milkit::ir::Model, op_type: &str) -> usize {
    m.program
        .main()
        .unwrap()
        .block
        .walk()
        .iter()
        .filter(|o| o.op_type == op_type)
        .count()
}

/// The shared fixtures directory, or None (after printing why) when it is absent and
/// fixtures are not required. Panics when MILKIT_REQUIRE_FIXTURES=1 and it is missing.
pub fn fixtures() -> Option<PathBuf> {
    let dir = std::env::var_os("MILKIT_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared"));
    if dir.join("models/whisper-tiny.en/config.json").exists() {
        return Some(dir);
    }
    if require() {
        panic!(
            "fixtures not found at {} and MILKIT_REQUIRE_FIXTURES=1",
            dir.display()
        );
    }
    eprintln!(
        "SKIP: fixtures not found at {} (set MILKIT_FIXTURES)",
        dir.display()
    );
    None
}

/// The multilingual whisper-base checkpoint (`MILKIT_WHISPER_BASE`, written by
/// ../shared/tools/get_whisper_base.sh), or None (after printing why) when it is absent and
/// fixtures are not required. Panics when MILKIT_REQUIRE_FIXTURES=1 and it is missing.
pub fn whisper_base() -> Option<PathBuf> {
    let dir = std::env::var_os("MILKIT_WHISPER_BASE").map(PathBuf::from);
    if let Some(d) = &dir {
        if d.join("model.safetensors").exists() && d.join("tokenizer.json").exists() {
            return dir;
        }
    }
    let why = match &dir {
        Some(d) => format!("MILKIT_WHISPER_BASE={} holds no checkpoint", d.display()),
        None => "MILKIT_WHISPER_BASE is not set".to_string(),
    };
    if require() {
        panic!("whisper-base: {why} and MILKIT_REQUIRE_FIXTURES=1");
    }
    eprintln!("SKIP: whisper-base: {why} (run ../shared/tools/get_whisper_base.sh DIR)");
    None
}

pub fn require() -> bool {
    std::env::var("MILKIT_REQUIRE_FIXTURES")
        .map(|v| v == "1")
        .unwrap_or(false)
}

/// A python that imports coremltools 9 and numpy: MILKIT_PYTHON, else .venv/bin/python,
/// else /work/venv (checked once per test binary).
pub fn python() -> Option<PathBuf> {
    static FOUND: std::sync::OnceLock<Option<PathBuf>> = std::sync::OnceLock::new();
    let found = FOUND.get_or_init(|| {
        let mut cands = vec![];
        if let Some(p) = std::env::var_os("MILKIT_PYTHON") {
            cands.push(PathBuf::from(p));
        }
        cands.push(Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/python"));
        cands.push(PathBuf::from("/work/venv/bin/python"));
        cands.into_iter().find(|c| {
            c.exists()
                && Command::new(c)
                    .args(["-c", "import coremltools, numpy"])
                    .output()
                    .is_ok_and(|o| o.status.success())
        })
    });
    if let Some(p) = found {
        return Some(p.clone());
    }
    if require() {
        panic!("no python with coremltools (set MILKIT_PYTHON) and MILKIT_REQUIRE_FIXTURES=1");
    }
    eprintln!("SKIP: no python with coremltools found (set MILKIT_PYTHON)");
    None
}

/// A Python with faster_whisper (`MILKIT_PYTHON`), or None after saying why.
pub fn faster_whisper_python() -> Option<PathBuf> {
    let p = std::env::var_os("MILKIT_PYTHON").map(PathBuf::from);
    if let Some(py) = &p {
        let ok = Command::new(py)
            .args(["-c", "import faster_whisper, numpy"])
            .output()
            .is_ok_and(|o| o.status.success());
        if ok {
            return p;
        }
    }
    assert!(
        !require(),
        "MILKIT_PYTHON is no Python with faster_whisper and MILKIT_REQUIRE_FIXTURES=1 \
         (.ci/run installs faster-whisper 1.2.1)"
    );
    eprintln!("SKIP: MILKIT_PYTHON is no Python with faster_whisper (pip install faster-whisper)");
    None
}

/// Runs ../shared/tools/validate_mlpackage.py on a package; returns its JSON report.
/// Panics with the validator's output when it rejects the package.
pub fn validate(pkg: &Path) -> Option<serde_json::Value> {
    let fx = fixtures()?;
    let py = python()?;
    let out = Command::new(py)
        .arg(fx.join("tools/validate_mlpackage.py"))
        .arg(pkg)
        .arg("--materialize")
        .output()
        .expect("run validator");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "validator rejected {}:\n{}\n{}",
        pkg.display(),
        stdout,
        String::from_utf8_lossy(&out.stderr)
    );
    Some(serde_json::from_str(&stdout).expect("validator JSON"))
}

/// Runs `script` (Python source) with `args`; panics with its stderr on failure, returns
/// its stdout.
pub fn run_python(python: &Path, script: &str, args: &[&std::ffi::OsStr]) -> String {
    let out = Command::new(python)
        .arg("-c")
        .arg(script)
        .args(args)
        .output()
        .expect("cannot run python");
    assert!(
        out.status.success(),
        "python failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn milkit() -> Command {
    Command::new(env!("CARGO_BIN_EXE_milkit"))
}

/// Writes a one-component recipe (the encoder for `abi`, iOS18, LUT4 k-means per 16 output
/// channels plus the compress-table line `extra`) into `dir`, exports it from `model` with
/// `milkit export --recipe`, asserts success and returns the folder.
pub fn export_encoder_recipe(dir: &Path, abi: &str, extra: &str, model: &Path) -> PathBuf {
    let recipe = dir.join("recipe.toml");
    std::fs::write(
        &recipe,
        format!(
            "name = \"test\"\n\n[[component]]\ncomponent = \"encoder\"\nabi = \"{abi}\"\n\
             target = \"ios18\"\nfile = \"encoder.mlpackage\"\n\n[component.compress]\n\
             palettize = \"kmeans\"\nnbits = 4\ngroup_size = 16\n{extra}\n"
        ),
    )
    .unwrap();
    let out = dir.join("folder");
    let o = milkit()
        .args(["export", "--quiet", "--recipe"])
        .arg(&recipe)
        .arg("--model")
        .arg(model)
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "recipe export failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    out
}

/// A tiny-shaped but much smaller Whisper config (d_model 64, 2 + 2 layers, 4 heads, ffn 128)
/// for self-contained tests on random checkpoints.
pub fn micro_config() -> milkit::whisper::config::WhisperConfig {
    let mut c = milkit::whisper::config::Preset::Tiny.config();
    c.d_model = 64;
    c.encoder_layers = 2;
    c.decoder_layers = 2;
    c.encoder_attention_heads = 4;
    c.decoder_attention_heads = 4;
    c.encoder_ffn_dim = 128;
    c.decoder_ffn_dim = 128;
    c
}

/// `alignment_heads` of a checkpoint's generation_config.json, read through the library's one
/// generation-config type.
pub fn alignment_heads(ckpt: &Path) -> Vec<(usize, usize)> {
    milkit::whisper::config::GenerationConfig::from_file(&ckpt.join("generation_config.json"))
        .unwrap()
        .alignment_heads
        .unwrap_or_default()
        .into_iter()
        .map(|[l, h]| (l, h))
        .collect()
}

/// milkit's fp16 tiny.en packages in two WhisperKit-style models folders, (cache-I/O
/// decoder, stateful decoder), built with the library once per test binary under
/// `CARGO_TARGET_TMPDIR/<name>`; the decoders have WhisperKit's mean alignment output.
pub fn tiny_en_folders(fx: &Path, name: &str) -> &'static (PathBuf, PathBuf) {
    use milkit::convert::export::export_encoder;
    use milkit::ir::Opset;
    use milkit::package::save_package;
    use milkit::whisper::checkpoint::Checkpoint;
    use milkit::whisper::decoder::{
        build_decoder, min_head_chunks, CrossKv, DecoderDims, DecoderOptions, KvCache,
    };
    use milkit::whisper::encoder::EncoderAbi;
    use milkit::whisper::weights::WhisperWeights;
    use std::sync::OnceLock;
    static DIRS: OnceLock<(PathBuf, PathBuf)> = OnceLock::new();
    DIRS.get_or_init(|| {
        let ckpt = fx.join("models/whisper-tiny.en");
        // Under target/ (rebuilt by every run) rather than a temporary directory the static
        // would never remove.
        let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
        let _ = std::fs::remove_dir_all(&root);
        let enc = export_encoder(
            &Checkpoint::open(&ckpt).unwrap(),
            EncoderAbi::WhisperKit,
            Opset::Ios18,
            &mut |_, _| {},
        )
        .unwrap();
        let (cfg, w) = WhisperWeights::open(&ckpt).unwrap();
        let dims = DecoderDims::from_config(&cfg);
        let mut dirs = vec![];
        for (name, kv) in [("io", KvCache::Io), ("state", KvCache::State)] {
            let dir = root.join(name);
            std::fs::create_dir_all(&dir).unwrap();
            let opts = DecoderOptions {
                alignment_heads: alignment_heads(&ckpt),
                per_head_alignment: false,
                head_chunks: min_head_chunks(dims.vocab),
                kv_cache: kv,
                cross_kv: CrossKv::InGraph,
            };
            let dec = build_decoder(&dims, &w, &opts, Opset::Ios18).unwrap();
            save_package(
                &enc,
                &dir.join("AudioEncoder.mlpackage"),
                false,
                &mut |_| {},
            )
            .unwrap();
            save_package(&dec, &dir.join("TextDecoder.mlpackage"), false, &mut |_| {}).unwrap();
            for f in [
                "config.json",
                "generation_config.json",
                "tokenizer.json",
                "preprocessor_config.json",
            ] {
                std::fs::copy(ckpt.join(f), dir.join(f)).unwrap();
            }
            dirs.push(dir);
        }
        (dirs[0].clone(), dirs[1].clone())
    })
}
