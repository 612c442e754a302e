//! Decoder-side exports through the CLI (`milkit export --component decoder|crosskv|prefill|
//! mel|all`, `--recipe`, `milkit compress --head-only`): exact I/O ABIs (WhisperKit's), the
//! conformance validator's verdict, head-only compression touching nothing but the head, the
//! MelSpectrogram package run by milkit's interpreter against Hugging Face's features, the
//! WhisperKit folder (its decoder with the per-head alignment output unless told otherwise),
//! and the refusals.

mod common;

use common::milkit;
use milkit::ir::{Arg, ArrayDType, Model, Value};
use milkit::package::load_package;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn run(args: &[&str], paths: &[(&str, &Path)]) -> Output {
    run_loud(&[args, &["--quiet"]].concat(), paths)
}

/// `run` without --quiet: the reports people read on stderr.
fn run_loud(args: &[&str], paths: &[(&str, &Path)]) -> Output {
    let mut c = milkit();
    c.args(args);
    for (flag, p) in paths {
        c.arg(flag).arg(p);
    }
    c.output().unwrap()
}

fn ok(o: &Output) {
    assert!(
        o.status.success(),
        "failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// The command failed with exit code 2 and `want` in its message.
fn refused(o: &Output, want: &str) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "expected a refusal: {err}");
    assert!(err.contains(want), "expected `{want}` in: {err}");
}

fn export(model: &Path, out: &Path, args: &[&str]) -> Output {
    let mut a = vec!["export"];
    a.extend_from_slice(args);
    run(&a, &[("--model", model), ("--out", out)])
}

type Abi = Vec<(String, ArrayDType, Vec<usize>)>;

fn abi(fs: &[milkit::ir::Feature]) -> Abi {
    fs.iter()
        .map(|f| (f.name.clone(), f.dtype, f.shape.clone()))
        .collect()
}

fn f(n: &str, d: ArrayDType, s: &[usize]) -> (String, ArrayDType, Vec<usize>) {
    (n.to_string(), d, s.to_vec())
}

/// milkit's per-head alignment output.
const PER_HEAD: &str = milkit::whisper::decoder_spec::PER_HEAD_ALIGNMENT_OUTPUT;

fn outputs(m: &Model) -> Vec<String> {
    m.description
        .outputs
        .iter()
        .map(|f| f.name.clone())
        .collect()
}

/// Runs the validator; a stateful package may fail only its state-count comparison (the
/// validator counts states as function inputs but not as description inputs), exactly as
/// tests/decoder.rs accepts it.
fn validate_stateful(pkg: &Path, n_inputs: usize, n_states: usize) {
    let (Some(fx), Some(py)) = (common::fixtures(), common::python()) else {
        return;
    };
    let out = Command::new(py)
        .arg(fx.join("tools/validate_mlpackage.py"))
        .arg(pkg)
        .arg("--materialize")
        .output()
        .unwrap();
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).expect("validator JSON");
    if r["ok"] == true {
        return;
    }
    let known = format!(
        "AssertionError: {n_inputs} description inputs vs {} function inputs",
        n_inputs + n_states
    );
    assert_eq!(r["error"].as_str(), Some(known.as_str()), "{r}");
}

/// Every blob-bound constant of a model by op name: (shape, bytes).
fn consts(m: &Model) -> BTreeMap<String, (Vec<usize>, Vec<u8>)> {
    let mut out = BTreeMap::new();
    for op in m.program.main().unwrap().block.walk() {
        if let Some(Value::Tensor(t)) = op.const_val() {
            if t.num_elements() > 64 {
                out.insert(op.name.clone(), (t.shape.clone(), t.data.to_vec()));
            }
        }
    }
    out
}

/// The constexpr ops of a model: (name, consuming op names, inline bytes).
fn constexprs(m: &Model) -> Vec<(String, Vec<String>, usize)> {
    let ops = m.program.main().unwrap().block.walk();
    ops.iter()
        .filter(|o| o.op_type.starts_with("constexpr_"))
        .map(|o| {
            let out = &o.outputs[0].name;
            let users = ops
                .iter()
                .filter(|u| {
                    u.inputs
                        .values()
                        .flatten()
                        .any(|a| matches!(a, Arg::Var(v) if v == out))
                })
                .map(|u| u.name.clone())
                .collect();
            let bytes = o
                .inputs
                .values()
                .flatten()
                .filter_map(|a| match a {
                    Arg::Value(Value::Tensor(t)) => Some(t.data.len()),
                    _ => None,
                })
                .sum();
            (o.name.clone(), users, bytes)
        })
        .collect()
}

fn tiny_en(fx: &Path) -> PathBuf {
    fx.join("models/whisper-tiny.en")
}

#[test]
fn tiny_en_decoder_crosskv_abis_and_validator() {
    let Some(fx) = common::fixtures() else { return };
    let model = tiny_en(&fx);
    let dir = tempfile::tempdir().unwrap();
    use ArrayDType::{F16, I32};
    let (dl, s) = (384 * 4, 448);

    let p = dir.path().join("decoder.mlpackage");
    ok(&export(&model, &p, &["--component", "decoder"]));
    let m = load_package(&p).unwrap();
    assert_eq!(m.spec_version, 9);
    assert_eq!(
        abi(&m.description.inputs),
        vec![
            f("input_ids", I32, &[1]),
            f("cache_length", I32, &[1]),
            f("key_cache", F16, &[1, dl, 1, s]),
            f("value_cache", F16, &[1, dl, 1, s]),
            f("kv_cache_update_mask", F16, &[1, s]),
            f("encoder_output_embeds", F16, &[1, 384, 1, 1500]),
            f("decoder_key_padding_mask", F16, &[1, s]),
        ]
    );
    assert_eq!(
        abi(&m.description.outputs),
        vec![
            f("logits", F16, &[1, 1, 51864]),
            f("key_cache_updates", F16, &[1, dl, 1, 1]),
            f("value_cache_updates", F16, &[1, dl, 1, 1]),
            f("alignment_heads_weights", F16, &[1, 1500]),
        ]
    );
    // The 8 alignment heads of generation_config.json, and the head op named in metadata.
    assert_eq!(
        m.description.user_defined["milkit.alignment_heads"],
        "[[1,0],[2,0],[2,5],[3,0],[3,1],[3,2],[3,3],[3,4]]"
    );
    assert_eq!(m.description.user_defined["milkit.head_ops"], "lm_head");
    // The positional table is found and untouched; its axis parameter is not mistaken for it.
    let pos = milkit::verify::analysis::positional_embedding(&m);
    assert_eq!(
        pos.status,
        milkit::report::PositionalStatus::Untouched,
        "{pos:?}"
    );
    assert!(pos.entries.iter().all(|e| e.shape.len() == 2), "{pos:?}");
    common::validate(&p);

    // Stateful: caches become states; the I/O loses them and the update mask.
    let p = dir.path().join("stateful.mlpackage");
    ok(&export(
        &model,
        &p,
        &["--component", "decoder", "--stateful"],
    ));
    let m = load_package(&p).unwrap();
    let names: Vec<String> = m
        .description
        .inputs
        .iter()
        .map(|f| f.name.clone())
        .collect();
    assert_eq!(
        names,
        [
            "input_ids",
            "cache_length",
            "encoder_output_embeds",
            "decoder_key_padding_mask"
        ]
    );
    assert_eq!(
        abi(&m.description.states),
        vec![
            f("key_cache", F16, &[1, dl, 1, s]),
            f("value_cache", F16, &[1, dl, 1, s]),
        ]
    );
    let outs: Vec<String> = m
        .description
        .outputs
        .iter()
        .map(|f| f.name.clone())
        .collect();
    assert_eq!(outs, ["logits", "alignment_heads_weights"]);
    assert_eq!(common::count_ops(&m, "write_state"), 2 * 4);
    validate_stateful(&p, 4, 2);

    // CrossKV and the decoder that takes its outputs.
    let p = dir.path().join("crosskv.mlpackage");
    ok(&export(&model, &p, &["--component", "crosskv"]));
    let m = load_package(&p).unwrap();
    assert_eq!(
        abi(&m.description.inputs),
        vec![f("encoder_output_embeds", F16, &[1, 384, 1, 1500])]
    );
    assert_eq!(
        abi(&m.description.outputs),
        vec![
            f("encoder_attn_key_cache", F16, &[1, dl, 1, 1500]),
            f("encoder_attn_value_cache", F16, &[1, dl, 1, 1500]),
        ]
    );
    common::validate(&p);
    let p = dir.path().join("decoder-precomputed.mlpackage");
    ok(&export(
        &model,
        &p,
        &["--component", "decoder", "--cross-kv", "precomputed"],
    ));
    let m = load_package(&p).unwrap();
    let names: Vec<String> = m
        .description
        .inputs
        .iter()
        .map(|f| f.name.clone())
        .collect();
    assert_eq!(
        names[5..7],
        ["encoder_attn_key_cache", "encoder_attn_value_cache"]
    );
    assert!(!names.contains(&"encoder_output_embeds".to_string()));
    common::validate(&p);

    // Refusals: states below iOS18, decoder flags on the encoder, prefill on an .en model.
    let p = dir.path().join("x.mlpackage");
    let o = export(
        &model,
        &p,
        &["--component", "decoder", "--stateful", "--target", "ios17"],
    );
    refused(&o, "--target ios18");
    let o = export(
        &model,
        &p,
        &["--component", "encoder", "--head-chunks", "4"],
    );
    refused(&o, "--component decoder or all");
    let o = export(&model, &p, &["--component", "prefill"]);
    refused(&o, "English-only");
    assert!(!p.exists());
}

#[test]
fn head_only_compression_touches_only_the_head() {
    let Some(fx) = common::fixtures() else { return };
    let model = tiny_en(&fx);
    let dir = tempfile::tempdir().unwrap();
    let lut4 = [
        "--palettize",
        "kmeans",
        "--nbits",
        "4",
        "--granularity",
        "per-grouped-channel",
    ];

    // Export + compress in one go: one head, group 8.
    let plain = dir.path().join("plain.mlpackage");
    ok(&export(&model, &plain, &["--component", "decoder"]));
    let p = dir.path().join("head.mlpackage");
    let mut args = vec!["--component", "decoder", "--head-only", "--group-size", "8"];
    args.extend_from_slice(&lut4);
    ok(&export(&model, &p, &args));
    check_head_only(
        &load_package(&plain).unwrap(),
        &load_package(&p).unwrap(),
        1,
    );
    common::validate(&p);

    // `milkit compress --head-only` on a 4-chunk decoder (12,966 rows per chunk: group 6).
    let plain4 = dir.path().join("plain4.mlpackage");
    ok(&export(
        &model,
        &plain4,
        &["--component", "decoder", "--head-chunks", "4"],
    ));
    let m4 = load_package(&plain4).unwrap();
    assert_eq!(
        m4.description.user_defined["milkit.head_ops"],
        "lm_head_0,lm_head_1,lm_head_2,lm_head_3"
    );
    // `milkit inspect` shows the head ops.
    let o = milkit().arg("inspect").arg(&plain4).output().unwrap();
    ok(&o);
    assert!(String::from_utf8_lossy(&o.stdout).contains("milkit.head_ops"));
    let p4 = dir.path().join("head4.mlpackage");
    let mut args = vec!["compress", "--head-only", "--group-size", "6"];
    args.extend_from_slice(&lut4);
    let o = milkit()
        .args(args)
        .arg(&plain4)
        .arg("--out")
        .arg(&p4)
        .arg("--quiet")
        .output()
        .unwrap();
    ok(&o);
    check_head_only(&m4, &load_package(&p4).unwrap(), 4);
    common::validate(&p4);

    // Group 8 does not divide 12,966 rows: each chunk is padded to 12,968 rows in the graph
    // and sliced back (tests/checkpoints.rs checks the logits), the ABI unchanged.
    let padded = dir.path().join("padded.mlpackage");
    let mut args = vec!["compress", "--head-only", "--group-size", "8"];
    args.extend_from_slice(&lut4);
    let o = milkit()
        .args(args)
        .arg(&plain4)
        .arg("--out")
        .arg(&padded)
        .arg("--quiet")
        .output()
        .unwrap();
    ok(&o);
    let mp = load_package(&padded).unwrap();
    assert!(mp.description.user_defined["milkit.head_padding"]
        .contains("lm_head_0: 12966 rows + 2 zero rows = 12968"));
    assert_eq!(mp.description.outputs, m4.description.outputs);
    common::validate(&padded);
    let bad = dir.path().join("bad.mlpackage");

    // --head-only on a package without a head (the encoder) is refused.
    let enc = dir.path().join("enc.mlpackage");
    ok(&export(&model, &enc, &["--component", "encoder"]));
    let mut args = vec!["compress", "--head-only"];
    args.extend_from_slice(&lut4);
    let o = milkit()
        .args(args)
        .arg(&enc)
        .arg("--out")
        .arg(&bad)
        .output()
        .unwrap();
    refused(&o, "milkit.head_ops");
}

/// `after` = `before` with exactly its `chunks` head weights compressed: one constexpr per
/// head conv, ≥ 3.5× fewer head bytes, every other constant byte-identical.
fn check_head_only(before: &Model, after: &Model, chunks: usize) {
    let cx = constexprs(after);
    assert_eq!(cx.len(), chunks, "{cx:?}");
    let heads = if chunks == 1 {
        vec!["lm_head".to_string()]
    } else {
        (0..chunks).map(|c| format!("lm_head_{c}")).collect()
    };
    let mut users: Vec<String> = cx.iter().flat_map(|c| c.1.clone()).collect();
    users.sort();
    assert_eq!(users, heads, "each constexpr feeds exactly one head conv");
    let b = consts(before);
    let a = consts(after);
    let head_before: usize = heads
        .iter()
        .map(|h| b[&format!("{h}_weight")].1.len())
        .sum();
    let head_after: usize = cx.iter().map(|c| c.2).sum();
    let ratio = head_before as f64 / head_after as f64;
    eprintln!("head bytes {head_before} → {head_after} ({ratio:.2}×)");
    assert!(ratio >= 3.5, "head bytes drop only {ratio:.2}×");
    for (name, v) in &b {
        if heads.iter().any(|h| *name == format!("{h}_weight")) {
            assert!(!a.contains_key(name), "{name} still dense");
        } else {
            assert_eq!(a.get(name), Some(v), "{name} changed");
        }
    }
    assert_eq!(a.len() + chunks, b.len());
    assert_eq!(
        a["embed_tokens"].0,
        vec![51864, 384],
        "gather table stays fp16"
    );
}

#[test]
fn mel_package_matches_hugging_face_features() {
    let Some(fx) = common::fixtures() else { return };
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("mel.mlpackage");
    ok(&export(&tiny_en(&fx), &p, &["--component", "mel"]));
    let m = load_package(&p).unwrap();
    use ArrayDType::F16;
    assert_eq!(abi(&m.description.inputs), vec![f("audio", F16, &[480000])]);
    assert_eq!(
        abi(&m.description.outputs),
        vec![f("melspectrogram_features", F16, &[1, 80, 1, 3000])]
    );
    common::validate(&p);

    let mut audio = milkit::whisper::audio::load_audio(fx.join("audio/jfk.wav")).unwrap();
    audio.resize(480000, 0.0);
    let refs = fx.join("reference/tiny.en-jfk.safetensors");
    let want = common::programs::f32s(
        &milkit::runtime::io::read_safetensors(&refs, "input_features").unwrap(),
    );
    let mut s = milkit::runtime::Session::load(&p).unwrap();
    let x = common::programs::host(&audio, &[480000])
        .to_dtype(candle_core::DType::F16)
        .unwrap();
    let out = s.predict(&[("audio", x)]).unwrap();
    let got = common::programs::f32s(&out[0].1);
    assert_eq!(got.len(), want.len());
    let psnr = common::programs::psnr(&want, &got);
    let max_err = want
        .iter()
        .zip(&got)
        .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    eprintln!("MelSpectrogram (interpreter, fp16 STFT) vs HF features: PSNR {psnr:.1} dB, max |err| {max_err:.4}");
    assert!(psnr >= 35.0, "PSNR {psnr:.1} dB");
    // fp16 audio, DFT basis and STFT output (~3 significant digits each): measured 0.047 at
    // worst (68 dB overall); 0.08 leaves room for another summation order.
    assert!(max_err <= 0.08, "max abs error {max_err}");
}

#[test]
fn whisperkit_folder_and_recipe() {
    let Some(fx) = common::fixtures() else { return };
    let model = tiny_en(&fx);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("whisperkit");
    ok(&export(&model, &out, &["--component", "all"]));
    let mut files: Vec<String> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();
    assert_eq!(
        files,
        [
            "AudioEncoder.mlpackage",
            "MelSpectrogram.mlpackage",
            "TextDecoder.mlpackage",
            "config.json",
            "generation_config.json",
            "preprocessor_config.json",
            "tokenizer.json",
        ]
    );
    for j in ["config.json", "generation_config.json", "tokenizer.json"] {
        assert_eq!(
            std::fs::read(out.join(j)).unwrap(),
            std::fs::read(model.join(j)).unwrap()
        );
    }
    let enc = load_package(&out.join("AudioEncoder.mlpackage")).unwrap();
    assert_eq!(enc.description.inputs[0].name, "melspectrogram_features");
    assert_eq!(enc.description.outputs[0].name, "encoder_output_embeds");
    let mel = load_package(&out.join("MelSpectrogram.mlpackage")).unwrap();
    assert_eq!(mel.description.outputs[0].name, "melspectrogram_features");
    // The folder's decoder carries each alignment head's row by default (word timestamps
    // use it; WhisperKit reads outputs by name); --no-per-head-alignment leaves it out.
    let dl = 384 * 4;
    let dec = load_package(&out.join("TextDecoder.mlpackage")).unwrap();
    assert_eq!(
        abi(&dec.description.outputs),
        vec![
            f("logits", ArrayDType::F16, &[1, 1, 51864]),
            f("key_cache_updates", ArrayDType::F16, &[1, dl, 1, 1]),
            f("value_cache_updates", ArrayDType::F16, &[1, dl, 1, 1]),
            f("alignment_heads_weights", ArrayDType::F16, &[1, 1500]),
            f(
                "alignment_heads_weights_per_head",
                ArrayDType::F16,
                &[1, 8, 1500]
            ),
        ]
    );
    // Beside, not in, the folder's directory (its leftovers are counted below).
    let other = tempfile::tempdir().unwrap();
    let plain = other.path().join("plain");
    ok(&export(
        &model,
        &plain,
        &["--component", "all", "--no-per-head-alignment"],
    ));
    let dec = load_package(&plain.join("TextDecoder.mlpackage")).unwrap();
    assert_eq!(
        outputs(&dec),
        [
            "logits",
            "key_cache_updates",
            "value_cache_updates",
            "alignment_heads_weights"
        ]
    );
    // A lone decoder keeps WhisperKit's outputs unless asked.
    let lone = other.path().join("decoder.mlpackage");
    ok(&export(&model, &lone, &["--component", "decoder"]));
    assert!(!outputs(&load_package(&lone).unwrap()).contains(&PER_HEAD.to_string()));
    // Contradictory or misplaced choices are refused before anything is written.
    let nowhere = other.path().join("nowhere");
    let o = export(
        &model,
        &nowhere,
        &[
            "--component",
            "all",
            "--per-head-alignment",
            "--no-per-head-alignment",
        ],
    );
    assert_eq!(o.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("cannot be used with"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let o = export(
        &model,
        &nowhere,
        &["--component", "encoder", "--no-per-head-alignment"],
    );
    refused(&o, "use them with --component decoder or all");
    assert!(!nowhere.exists());

    // An existing folder is refused without --force and left as it was; --force replaces it.
    let o = export(&model, &out, &["--component", "all"]);
    refused(&o, "--force");
    assert!(out.join("TextDecoder.mlpackage").exists());
    let o = export(
        &model,
        &out,
        &["--component", "all", "--force", "--cross-kv", "precomputed"],
    );
    ok(&o);
    assert!(out.join("CrossKV.mlpackage").exists());
    let leftovers: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert_eq!(
        leftovers.len(),
        1,
        "no temporary folders left beside the output"
    );

    // The WhisperKit recipe: encoder LUT4 g16 (26 tables), decoder with only its head LUT4.
    let recipe = Path::new(env!("CARGO_MANIFEST_DIR")).join("models/whisperkit-tiny-lut4.toml");
    let out = dir.path().join("recipe");
    let o = run_loud(
        &["export"],
        &[("--recipe", &recipe), ("--model", &model), ("--out", &out)],
    );
    ok(&o);
    // One summary line per compressed package by default, not a row per weight.
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("AudioEncoder.mlpackage: 26 weights lut4-kmeans-g16 at 4.031 bits")
            && err.contains("TextDecoder.mlpackage: 1 weights lut4-kmeans-g8 at 4.083 bits"),
        "{err}"
    );
    assert!(
        !err.contains("rel.rms"),
        "per-weight rows by default: {err}"
    );
    let enc = load_package(&out.join("AudioEncoder.mlpackage")).unwrap();
    assert_eq!(common::count_ops(&enc, "constexpr_lut_to_dense"), 26);
    let dec = load_package(&out.join("TextDecoder.mlpackage")).unwrap();
    assert_eq!(common::count_ops(&dec, "constexpr_lut_to_dense"), 1);
    // Recipes follow the folder's default: the per-head output unless they say otherwise.
    assert!(outputs(&dec).contains(&PER_HEAD.to_string()));
    let mel = load_package(&out.join("MelSpectrogram.mlpackage")).unwrap();
    assert_eq!(common::count_ops(&mel, "constexpr_lut_to_dense"), 0);
    assert!(out.join("tokenizer.json").exists());
    common::validate(&out.join("TextDecoder.mlpackage"));
    // `per_head_alignment = false` in the decoder's component leaves it out; the flags are
    // the recipe's to set, not the command line's.
    let text = std::fs::read_to_string(&recipe).unwrap().replace(
        "head_chunks = 1",
        "head_chunks = 1\nper_head_alignment = false",
    );
    let plain_recipe = dir.path().join("plain.toml");
    std::fs::write(&plain_recipe, text).unwrap();
    let out = dir.path().join("recipe-plain");
    let o = run_loud(
        &["export", "--verbose"],
        &[
            ("--recipe", &plain_recipe),
            ("--model", &model),
            ("--out", &out),
        ],
    );
    ok(&o);
    // --verbose lists every compressed weight: 26 in the encoder, the head in the decoder.
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(err.matches("rel.rms").count(), 27, "{err}");
    let dec = load_package(&out.join("TextDecoder.mlpackage")).unwrap();
    assert!(!outputs(&dec).contains(&PER_HEAD.to_string()));
    let o = run(
        &["export", "--no-per-head-alignment"],
        &[
            ("--recipe", &recipe),
            ("--model", &model),
            ("--out", &dir.path().join("refused")),
        ],
    );
    refused(&o, "per_head_alignment = false");
}

/// A synthetic multilingual tiny checkpoint: the prefill package, and a full folder with
/// TextDecoderContextPrefill and CrossKV.
#[test]
fn multilingual_prefill_and_folder() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("tiny");
    let o = run(
        &["synth", "--preset", "tiny", "--seed", "3"],
        &[("--out", &model)],
    );
    ok(&o);
    let p = dir.path().join("prefill.mlpackage");
    ok(&export(&model, &p, &["--component", "prefill"]));
    let m = load_package(&p).unwrap();
    use ArrayDType::{F16, I32};
    assert_eq!(
        abi(&m.description.inputs),
        vec![f("task", I32, &[1]), f("language", I32, &[1])]
    );
    assert_eq!(
        abi(&m.description.outputs),
        vec![
            f("key_cache_prefill", F16, &[1, 384 * 4, 1, 3]),
            f("value_cache_prefill", F16, &[1, 384 * 4, 1, 3]),
        ]
    );
    common::validate(&p);

    // The folder needs tokenizer.json: refused without one, accepted with synth's.
    let out = dir.path().join("wk");
    let tok = model.join("tokenizer.json");
    std::fs::rename(&tok, dir.path().join("tokenizer.json")).unwrap();
    let o = export(
        &model,
        &out,
        &["--component", "all", "--cross-kv", "precomputed"],
    );
    refused(&o, "tokenizer.json");
    assert!(!out.exists());
    std::fs::rename(dir.path().join("tokenizer.json"), &tok).unwrap();
    ok(&export(
        &model,
        &out,
        &["--component", "all", "--cross-kv", "precomputed"],
    ));
    for f in [
        "MelSpectrogram.mlpackage",
        "AudioEncoder.mlpackage",
        "TextDecoder.mlpackage",
        "TextDecoderContextPrefill.mlpackage",
        "CrossKV.mlpackage",
        "preprocessor_config.json",
    ] {
        assert!(out.join(f).exists(), "{f} missing");
    }
    let dec = load_package(&out.join("TextDecoder.mlpackage")).unwrap();
    assert!(dec
        .description
        .inputs
        .iter()
        .any(|f| f.name == "encoder_attn_key_cache"));
}
