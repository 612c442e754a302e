//! The shipped 4-bit recipes (issue 17 item 4): `models/whisperkit-4bit-encoder.toml` and
//! `models/whisperkit-4bit.toml` export with the statistics of `milkit calibrate` (each
//! component taking the file measured on it), stay within their 4.25-bit budgets by
//! `milkit eval --models DIR` (stored bytes of every constexpr op, tables and scales
//! included), and the folders transcribe — on tiny.en and on a small multilingual synth
//! checkpoint, whose compressed packages also pass the conformance validator.

mod common;

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Output;

fn milkit(args: &[&str], paths: &[&Path]) -> Output {
    let mut c = common::milkit();
    c.args(args);
    for p in paths {
        c.arg(p);
    }
    c.output().unwrap()
}

fn ok(o: &Output) {
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

fn recipe(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("models")
        .join(name)
}

/// Statistics of `model` on the clips, for `component`, with the Gram matrices that error
/// feedback (the whole-model recipe) needs.
fn calibrate(model: &Path, clips: &[PathBuf], component: &str, out: &Path) {
    let mut c = common::milkit();
    c.args([
        "calibrate",
        "--quiet",
        "--gram",
        "--component",
        component,
        "--model",
    ])
    .arg(model)
    .arg("--out")
    .arg(out)
    .arg("--audio");
    for clip in clips {
        c.arg(clip);
    }
    ok(&c.output().unwrap());
}

/// (package → avg bits) of a folder, from `milkit eval --models DIR --json`.
fn bits(dir: &Path) -> Vec<(String, Option<f64>)> {
    let o = milkit(&["eval", "--json", "--models"], &[dir]);
    ok(&o);
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    v["packages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["package"].as_str().unwrap().to_string(),
                p["avg_bits"].as_f64(),
            )
        })
        .collect()
}

fn bits_of(b: &[(String, Option<f64>)], package: &str) -> Option<f64> {
    b.iter().find(|(p, _)| p == package).and_then(|(_, b)| *b)
}

fn export_recipe(name: &str, model: &Path, stats: &[&Path], out: &Path) {
    let mut c = common::milkit();
    c.args(["export", "--quiet", "--recipe"])
        .arg(recipe(name))
        .arg("--model")
        .arg(model)
        .arg("--out")
        .arg(out);
    for s in stats {
        c.arg("--calibration").arg(s);
    }
    ok(&c.output().unwrap());
}

/// tiny.en: the encoder recipe with both statistics files given (the encoder takes the one
/// measured on it) holds its budget and transcribes.
#[test]
fn the_4bit_encoder_recipe_holds_its_budget_on_tiny_en_and_transcribes() {
    let Some(fx) = common::fixtures() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let hf = fx.join("models/whisper-tiny.en");
    let clips = [
        fx.join("audio/fleurs_en_000.wav"),
        fx.join("audio/fleurs_en_001.wav"),
    ];
    let (enc, dec) = (tmp.path().join("enc.st"), tmp.path().join("dec.st"));
    calibrate(&hf, &clips, "encoder", &enc);
    calibrate(&hf, &clips[..1], "decoder", &dec);
    let e4 = tmp.path().join("enc4");
    export_recipe("whisperkit-4bit-encoder.toml", &hf, &[&enc, &dec], &e4);
    let b = bits(&e4);
    let eb = bits_of(&b, "AudioEncoder.mlpackage").expect("a compressed encoder");
    println!("whisperkit-4bit-encoder on tiny.en: encoder {eb:.3} bits");
    // Measured 4.245 (tables, channel scales and mixed bits included).
    assert!(eb > 3.9 && eb <= 4.25 + 1e-9, "{eb}");
    assert_eq!(bits_of(&b, "TextDecoder.mlpackage"), None, "decoder fp16");
    let o = milkit(
        &["transcribe", "--models"],
        &[&e4, &fx.join("audio/jfk.wav")],
    );
    ok(&o);
    let text = String::from_utf8_lossy(&o.stdout).to_lowercase();
    assert!(text.contains("your country"), "{text}");
}

/// Both recipes on a small multilingual synth checkpoint (whisper-tiny's vocabulary and
/// layout, d_model 256 and one layer each, so the decoder's mixed-bit plan over its
/// 51,865-row head stays quick; narrower rows would make the 4-bit tables and channel
/// scales alone cost more than 4.25 bits): each component within 4.25 bits, and the folders
/// transcribe (random weights: any text, no error).
#[test]
fn both_4bit_recipes_hold_their_budgets_on_a_multilingual_checkpoint() {
    let Some(fx) = common::fixtures() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let synth = small_multilingual(tmp.path());
    let clip = [fx.join("audio/multilingual/fleurs_de_000.wav")];
    let (enc, dec) = (tmp.path().join("enc.st"), tmp.path().join("dec.st"));
    calibrate(&synth, &clip, "encoder", &enc);
    calibrate(&synth, &clip, "decoder", &dec);
    for (name, stats, decoder_compressed) in [
        ("whisperkit-4bit-encoder.toml", vec![enc.as_path()], false),
        (
            "whisperkit-4bit.toml",
            vec![enc.as_path(), dec.as_path()],
            true,
        ),
    ] {
        let out = tmp.path().join(format!("{name}-{}", stats.len()));
        export_recipe(name, &synth, &stats, &out);
        let b = bits(&out);
        let eb = bits_of(&b, "AudioEncoder.mlpackage").expect("a compressed encoder");
        assert!(eb <= 4.25 + 1e-9, "{name}: encoder {eb}");
        let db = bits_of(&b, "TextDecoder.mlpackage");
        assert_eq!(db.is_some(), decoder_compressed, "{name}");
        if let Some(db) = db {
            assert!(db > 3.9 && db <= 4.25 + 1e-9, "{name}: decoder {db}");
        }
        println!(
            "{name} ({} statistics files): encoder {eb:.3}, decoder {db:?}",
            stats.len()
        );
        // The compressed packages (mixed-bit tables, a chunked head) pass coremltools 9.
        common::validate(&out.join("AudioEncoder.mlpackage"));
        if decoder_compressed {
            common::validate(&out.join("TextDecoder.mlpackage"));
        }
        let o = milkit(
            &["transcribe", "--models"],
            &[&out, &fx.join("audio/multilingual/fleurs_de_000.wav")],
        );
        ok(&o);
    }
}

/// A recipe's `[compress]` table and the command-line flags are one type: an empty table
/// means the flags' defaults, and a table reads as the flags with the same names do.
#[test]
fn a_compress_table_reads_as_the_compression_flags() {
    use clap::Parser;
    use milkit::convert::compress::CompressFlags;
    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        flags: CompressFlags,
    }
    let parse = |args: &[&str]| {
        Cli::try_parse_from(std::iter::once("milkit").chain(args.iter().copied()))
            .unwrap()
            .flags
    };
    let table = |text: &str| toml::from_str::<CompressFlags>(text).unwrap();
    assert_eq!(parse(&[]), CompressFlags::default());
    assert_eq!(table(""), CompressFlags::default());
    assert_eq!(
        table(
            "palettize = \"kmeans\"\nnbits = 3\ngranularity = \"per-grouped-channel\"\n\
             group_size = 8\nop_types = [\"conv\"]\nhead_only = true\ntarget_bits = 3.5"
        ),
        parse(&[
            "--palettize",
            "kmeans",
            "--nbits",
            "3",
            "--granularity",
            "per-grouped-channel",
            "--group-size",
            "8",
            "--op-types",
            "conv",
            "--head-only",
            "--target-bits",
            "3.5",
        ])
    );
    assert_eq!(
        table("quantize = \"INT8\"\ngranularity = \"per-block\"\nasymmetric = true"),
        parse(&[
            "--quantize",
            "int8",
            "--granularity",
            "per-block",
            "--asymmetric"
        ])
    );
    // Fixed widths: a table in a recipe, NAME=BITS on the command line.
    assert_eq!(
        table("palettize = \"kmeans\"\nop_nbits = { lm_head_0 = 6, lm_head_1 = 3 }"),
        parse(&[
            "--palettize",
            "kmeans",
            "--op-nbits",
            "lm_head_0=6,lm_head_1=3"
        ])
    );
    for bad in ["lm_head_0", "lm_head_0=5", "=4", "lm_head_0=six"] {
        let e = table(&format!("palettize = \"kmeans\"\nop_nbits = [\"{bad}\"]"))
            .compression()
            .unwrap_err();
        assert!(e.to_string().contains("op_nbits entry"), "{bad}: {e}");
    }
    let e = toml::from_str::<CompressFlags>("palettize = \"kmeanz\"").unwrap_err();
    assert!(e.to_string().contains("kmeanz"), "{e}");
    // Statistics come from the command line only.
    assert!(toml::from_str::<CompressFlags>("calibration = [\"x\"]").is_err());
}

/// The small multilingual synth checkpoint the recipe tests use (whisper-tiny's vocabulary,
/// d_model 256, one layer each).
fn small_multilingual(dir: &Path) -> PathBuf {
    let synth = dir.join("synth");
    ok(&milkit(
        &[
            "synth",
            "--quiet",
            "--preset",
            "tiny",
            "--encoder-layers",
            "1",
            "--decoder-layers",
            "1",
            "--d-model",
            "256",
            "--heads",
            "4",
            "--ffn-dim",
            "512",
            "--out",
        ],
        &[&synth],
    ));
    synth
}

/// Per `constexpr_lut_to_dense` op of a package: (the weight it makes, index bits, elements,
/// stored bits counted from its inputs: indices × bits + table entries × 16).
fn lut_widths(pkg: &Path) -> Vec<(String, u32, u64, u64)> {
    use milkit::ir::{Arg, Value};
    let m = milkit::package::load_package(pkg).unwrap();
    let main = m.program.main().unwrap();
    let mut out = Vec::new();
    for op in main.block.walk() {
        if op.op_type != "constexpr_lut_to_dense" {
            continue;
        }
        let inline = |k: &str| match op.arg(k) {
            Some(Arg::Value(Value::Tensor(t))) => t.clone(),
            _ => panic!("{}: input {k} not inline", op.name),
        };
        let (idx, lut) = (inline("indices"), inline("lut"));
        let nbits = idx.dtype.bits() as u32;
        let n = idx.num_elements() as u64;
        let stored = n * nbits as u64 + lut.num_elements() as u64 * 16;
        out.push((op.outputs[0].name.clone(), nbits, n, stored));
    }
    out
}

/// A recipe states a head chunk's bits (`op_nbits = { lm_head_0 = 6 }`): the exported
/// decoder has that chunk at 6 bits and every other weight at the base 4 bits, and with a
/// `target_bits` budget the chunk keeps its 6 bits while the plan fills the rest of the
/// budget, the folder staying within it by `milkit eval --models DIR`. The folder average
/// is also counted here from the ops' own indices and tables; `milkit eval` agrees.
#[test]
fn a_recipe_gives_a_head_chunk_its_stated_bits_within_the_budget() {
    let Some(_) = common::fixtures() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let synth = small_multilingual(tmp.path());
    for target in [None, Some(4.4)] {
        let budget = target
            .map(|t| format!("target_bits = {t}\n"))
            .unwrap_or_default();
        let r = tmp.path().join("chunk0.toml");
        std::fs::write(
            &r,
            format!(
                "name = \"chunk0\"\n\n[[component]]\ncomponent = \"decoder\"\n\
                 file = \"TextDecoder.mlpackage\"\nhead_chunks = 16\n\n[component.compress]\n\
                 palettize = \"kmeans\"\nnbits = 4\ngroup_size = 8\n{budget}\
                 op_nbits = {{ lm_head_0 = 6 }}\n"
            ),
        )
        .unwrap();
        let out = tmp.path().join(format!("out-{target:?}"));
        let mut c = common::milkit();
        c.args(["export", "--quiet", "--recipe"])
            .arg(&r)
            .arg("--model")
            .arg(&synth)
            .arg("--out")
            .arg(&out);
        ok(&c.output().unwrap());
        let pkg = out.join("TextDecoder.mlpackage");
        let w = lut_widths(&pkg);
        // 16 head chunks and the layer's 10 weights (4 self-, 4 cross-attention, fc1, fc2).
        assert_eq!(w.len(), 26, "{w:?}");
        let chunk0: Vec<_> = w.iter().filter(|x| x.0 == "lm_head_0_weight").collect();
        assert_eq!(chunk0.len(), 1, "{w:?}");
        assert_eq!(chunk0[0].1, 6, "chunk 0's index bits");
        let others = w.iter().filter(|x| x.0 != "lm_head_0_weight");
        match target {
            None => assert!(others.clone().all(|x| x.1 == 4), "{w:?}"),
            Some(_) => assert!(others.clone().all(|x| x.1 >= 4), "{w:?}"),
        }
        let (stored, elems) = w.iter().fold((0u64, 0u64), |a, x| (a.0 + x.3, a.1 + x.2));
        let counted = stored as f64 / elems as f64;
        let evaluated = bits_of(&bits(&out), "TextDecoder.mlpackage").unwrap();
        println!(
            "chunk 0 at 6 bits, budget {target:?}: {evaluated:.4} bits (counted {counted:.4})"
        );
        // Packed indices round up to whole bytes per op: well under 0.001 bits here.
        assert!(
            (evaluated - counted).abs() < 1e-3,
            "{evaluated} vs {counted}"
        );
        if let Some(t) = target {
            assert!(evaluated <= t + 1e-9, "{evaluated} > {t}");
        }
    }
    // A width for an op the compression does not select is an error naming it.
    let r = tmp.path().join("typo.toml");
    std::fs::write(
        &r,
        "name = \"typo\"\n\n[[component]]\ncomponent = \"decoder\"\nfile = \"TextDecoder.mlpackage\"\n\
         head_chunks = 16\n\n[component.compress]\npalettize = \"kmeans\"\ngroup_size = 8\n\
         op_nbits = { lm_head_16 = 6 }\n",
    )
    .unwrap();
    let mut c = common::milkit();
    c.args(["export", "--quiet", "--recipe"])
        .arg(&r)
        .arg("--model")
        .arg(&synth)
        .arg("--out")
        .arg(tmp.path().join("typo"));
    let o = c.output().unwrap();
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("lm_head_16") && err.contains("lm_head_0"),
        "{err}"
    );
}
