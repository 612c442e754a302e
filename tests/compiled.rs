//! Compiled models (`.mlmodelc`): every real one in `../shared/compiled` opens; each
//! compiled model and the package it was compiled from give bit-identical outputs on the
//! same random inputs (fp16 and fp32 compute); the text-only WhisperKit tiny.en programs
//! type-check and count their ops as their metadata.json does; hand-written programs with
//! states and nested blocks run to hand-computed values; malformed text fails naming the
//! file, line and column; absent weights are inspected but not run; `coremldata.bin`'s
//! description agrees with metadata.json and a damaged one is a warning; milkit's own tiny.en
//! compiled (also in whisperkit-coreml's layout) transcribes, gates, evaluates and
//! compresses as its packages do.

mod common;

use common::programs::f32s;
use common::rng::Rng;
use milkit::package::compiled::{is_compiled, open_compiled};
use milkit::package::coremldata::{coremldata_bytes, parse_coremldata, read_coremldata};
use milkit::package::load_package;
use milkit::package::mil_text::{parse_float, parse_program, Weights};
use milkit::proto::specification::{FeatureDescription, ModelDescription};
use milkit::runtime::precision::Compute;
use milkit::runtime::{Options, Session, Tensor};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn cpu() -> candle_core::Device {
    candle_core::Device::Cpu
}

/// `../shared/compiled`, or None (after printing why) when the fixtures are absent.
fn compiled_dir() -> Option<PathBuf> {
    let d = common::fixtures()?.join("compiled");
    if d.is_dir() {
        return Some(d);
    }
    if common::require() {
        panic!("{} is missing and MILKIT_REQUIRE_FIXTURES=1", d.display());
    }
    eprintln!("SKIP: {} is missing", d.display());
    None
}

fn mlmodelc_folders(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for p in entries {
        if p.extension().is_some_and(|e| e == "mlmodelc") {
            out.push(p);
        } else if p.is_dir() && p.extension().is_none_or(|e| e != "mlpackage") {
            mlmodelc_folders(&p, out);
        }
    }
}

#[test]
fn every_compiled_model_in_the_fixtures_opens_and_type_checks() {
    let Some(dir) = compiled_dir() else { return };
    let mut all = vec![];
    mlmodelc_folders(&dir, &mut all);
    assert_eq!(all.len(), 8, "the fixtures hold 8 compiled models: {all:?}");
    for p in &all {
        assert!(is_compiled(p), "{} is not recognised", p.display());
        let c = open_compiled(p).unwrap_or_else(|e| panic!("{}: {e:#}", p.display()));
        let f = c.model.program.main().unwrap();
        assert!(!f.block.operations.is_empty(), "{}", p.display());
        assert_eq!(
            c.model.description.inputs.len() + c.model.description.states.len(),
            f.inputs.len(),
            "{}",
            p.display()
        );
        let text_only = p.to_string_lossy().contains("text-only");
        assert_eq!(c.weights_absent.is_some(), text_only, "{}", p.display());
        match load_package(p) {
            Ok(_) => assert!(!text_only),
            Err(e) => {
                let e = format!("{e:#}");
                assert!(text_only, "{}: {e}", p.display());
                assert!(
                    e.contains("weights are absent") && e.contains("does not exist"),
                    "{e}"
                );
            }
        }
    }
}

#[test]
fn both_printer_dialects_and_a_flexible_input_are_read() {
    let Some(dir) = compiled_dir() else { return };
    let mnist =
        open_compiled(&dir.join("pairs/jafreck-ironmill__test-q_base_mnist/model.mlmodelc"))
            .unwrap();
    assert_eq!(mnist.dialect, "1.3");
    let vad = open_compiled(
        &dir.join("pairs/FluidInference-mobius__silero-vad-unified-v6.0.0/model.mlmodelc"),
    )
    .unwrap();
    assert_eq!(vad.dialect, "1.0");
    // metadata.json's input order, not the program's (sorted by name).
    let names: Vec<_> = vad
        .model
        .description
        .inputs
        .iter()
        .map(|f| f.name.as_str())
        .collect();
    assert_eq!(names, ["audio_input", "hidden_state", "cell_state"]);
    let t =
        open_compiled(&dir.join("FluidInference-FluidAudio__TransposeEncoder.mlmodelc")).unwrap();
    let x = &t.model.description.inputs[0];
    assert_eq!(x.shape, [1, 1, 1]);
    assert_eq!(x.flex.to_string(), "[1, 1..=2048, 1..=2048]");
    assert!(x.check_shape(&[1, 7, 300]).is_ok());
    assert!(x.check_shape(&[1, 7, 3000]).is_err());
    assert!(t.notes.is_empty(), "{:?}", t.notes);
}

/// Random inputs of every described input's default shape (ints in 0..8).
fn random_inputs(s: &Session, rng: &mut Rng) -> Vec<(String, Tensor)> {
    s.description()
        .inputs
        .iter()
        .map(|f| {
            let n: usize = f.shape.iter().product();
            let t = match f.dtype {
                milkit::ir::ArrayDType::I32 => {
                    let v: Vec<i32> = (0..n).map(|_| rng.below(8) as i32).collect();
                    Tensor::from_vec(v, f.shape.as_slice(), &cpu()).unwrap()
                }
                d => {
                    let v: Vec<f32> = (0..n).map(|_| rng.normal() as f32).collect();
                    let t = Tensor::from_vec(v, f.shape.as_slice(), &cpu()).unwrap();
                    match d {
                        milkit::ir::ArrayDType::F16 => t.to_dtype(candle_core::DType::F16),
                        milkit::ir::ArrayDType::F64 => t.to_dtype(candle_core::DType::F64),
                        _ => Ok(t),
                    }
                    .unwrap()
                }
            };
            (f.name.clone(), t)
        })
        .collect()
}

fn bits(t: &Tensor) -> (candle_core::DType, Vec<usize>, Vec<u32>) {
    (
        t.dtype(),
        t.dims().to_vec(),
        f32s(t).iter().map(|x| x.to_bits()).collect(),
    )
}

#[test]
fn each_compiled_model_and_its_package_give_bit_identical_outputs() {
    let Some(dir) = compiled_dir() else { return };
    let mut pairs: Vec<_> = std::fs::read_dir(dir.join("pairs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    pairs.sort();
    assert_eq!(pairs.len(), 2);
    for pair in &pairs {
        for compute in [Compute::Package, Compute::Fp32] {
            let opts = Options {
                compute,
                ..Default::default()
            };
            let mut c = Session::load_with(&pair.join("model.mlmodelc"), &opts).unwrap();
            let mut p = Session::load_with(&pair.join("model.mlpackage"), &opts).unwrap();
            assert_eq!(c.description().inputs, p.description().inputs);
            let mut rng = Rng(7);
            for _ in 0..3 {
                let feeds = random_inputs(&p, &mut rng);
                let refs: Vec<(&str, Tensor)> =
                    feeds.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
                let a = c.predict(&refs).unwrap();
                let b = p.predict(&refs).unwrap();
                assert_eq!(a.len(), b.len());
                for ((na, ta), (nb, tb)) in a.iter().zip(&b) {
                    assert_eq!(na, nb);
                    assert_eq!(
                        bits(ta),
                        bits(tb),
                        "{}: output `{na}` differs ({compute:?})",
                        pair.display()
                    );
                }
            }
        }
    }
}

/// `Ios16.layerNorm` → `layer_norm`, `SliceByIndex` → `slice_by_index`.
fn op_name(histogram_key: &str) -> String {
    let k = histogram_key.rsplit('.').next().unwrap();
    let mut s = String::new();
    for (i, c) in k.chars().enumerate() {
        if c.is_ascii_uppercase() {
            if i > 0 {
                s.push('_');
            }
            s.push(c.to_ascii_lowercase());
        } else {
            s.push(c);
        }
    }
    s
}

#[test]
fn whisperkit_text_only_programs_count_their_ops_as_their_metadata_does() {
    let Some(dir) = compiled_dir() else { return };
    let base = dir.join("text-only/whisperkit-tiny.en");
    for (name, total) in [
        ("AudioEncoder", 1683),
        ("TextDecoder", 676),
        ("MelSpectrogram", 60),
    ] {
        let p = base.join(format!("{name}.mlmodelc"));
        let c = open_compiled(&p).unwrap();
        assert!(c
            .weights_absent
            .as_ref()
            .unwrap()
            .contains("does not exist"));
        let ops = c.model.program.main().unwrap().block.walk();
        assert_eq!(ops.len(), total, "{name}");
        let mut ours: BTreeMap<String, u64> = BTreeMap::new();
        for op in ops.iter().filter(|o| o.op_type != "const") {
            *ours.entry(op.op_type.clone()).or_default() += 1;
        }
        let meta: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(p.join("metadata.json")).unwrap())
                .unwrap();
        let theirs: BTreeMap<String, u64> = meta[0]["mlProgramOperationTypeHistogram"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, v)| (op_name(k), v.as_u64().unwrap()))
            .collect();
        assert_eq!(ours, theirs, "{name}");
        // `verify` counts them too, with the weights absent, and says so.
        let expect: Vec<String> = theirs
            .iter()
            .filter(|(k, _)| {
                name != "AudioEncoder" || ["conv", "einsum", "layer_norm"].contains(&k.as_str())
            })
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        let mut args = milkit::verify::cli::VerifyArgs::new(&p);
        args.expect_ops = expect
            .iter()
            .map(|s| milkit::verify::cli::parse_op_count(s).unwrap())
            .collect();
        if name != "MelSpectrogram" {
            args.expect_abi = Some(milkit::verify::abi::AbiKind::WhisperKit);
        }
        args.placement = true;
        let (mut out, mut err) = (vec![], vec![]);
        let code = milkit::verify::cli::run_verify_to(&args, &[], &mut out, &mut err);
        let out = String::from_utf8(out).unwrap();
        assert_eq!(code, 0, "{name}: {out}\n{}", String::from_utf8_lossy(&err));
        assert!(out.contains("the weights are absent"), "{out}");
    }
    // The encoder's numbers from the issue, spelled out.
    let c = open_compiled(&base.join("AudioEncoder.mlmodelc")).unwrap();
    let count = |t: &str| {
        c.model
            .program
            .main()
            .unwrap()
            .block
            .walk()
            .iter()
            .filter(|o| o.op_type == t)
            .count()
    };
    assert_eq!(
        (count("conv"), count("einsum"), count("layer_norm")),
        (26, 192, 9)
    );
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let p = e.unwrap().path();
        let t = to.join(p.file_name().unwrap());
        if p.is_dir() {
            copy_dir(&p, &t);
        } else {
            std::fs::copy(&p, &t).unwrap();
        }
    }
}

/// What `milkit inspect PATH` prints (it must succeed).
fn inspect_text(m: &Path) -> String {
    let (mut out, mut err) = (vec![], vec![]);
    let args = milkit::verify::cli::InspectArgs {
        package: m.to_path_buf(),
        json: false,
        mil: false,
        model_mil: false,
    };
    assert_eq!(
        milkit::verify::cli::run_inspect_to(&args, &mut out, &mut err),
        0,
        "{}",
        String::from_utf8_lossy(&err)
    );
    String::from_utf8(out).unwrap()
}

#[test]
fn a_git_lfs_pointer_for_weights_is_inspected_but_not_run() {
    let Some(dir) = compiled_dir() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let m = tmp.path().join("vad.mlmodelc");
    copy_dir(
        &dir.join("pairs/FluidInference-mobius__silero-vad-unified-v6.0.0/model.mlmodelc"),
        &m,
    );
    std::fs::write(
        m.join("weights/weight.bin"),
        "version https://git-lfs.github.com/spec/v1\noid sha256:00\nsize 881984\n",
    )
    .unwrap();
    let c = open_compiled(&m).unwrap();
    assert!(c.weights_absent.unwrap().contains("Git LFS pointer"));
    let out = inspect_text(&m);
    assert!(out.contains("Git LFS pointer"), "{out}");
    let e = format!("{:#}", Session::load(&m).err().unwrap());
    assert!(
        e.contains("weights are absent") && e.contains("Git LFS pointer"),
        "{e}"
    );
}

#[test]
fn where_metadata_disagrees_with_the_program_the_program_wins_and_inspect_says_so() {
    let Some(dir) = compiled_dir() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let m = tmp.path().join("argmax.mlmodelc");
    copy_dir(&dir.join("FluidInference-FluidAudio__Argmax.mlmodelc"), &m);
    let meta = std::fs::read_to_string(m.join("metadata.json"))
        .unwrap()
        .replace("\"shape\" : \"[1025]\"", "\"shape\" : \"[1024]\"");
    std::fs::write(m.join("metadata.json"), meta).unwrap();
    let c = open_compiled(&m).unwrap();
    assert_eq!(c.model.description.inputs[0].shape, [1025]);
    assert!(
        c.notes
            .iter()
            .any(|n| n.contains("input `input`") && n.contains("[1024]") && n.contains("[1025]")),
        "{:?}",
        c.notes
    );
    let out = inspect_text(&m);
    assert!(out.contains("the program wins"), "{out}");
    // And it runs with the program's shape.
    let mut s = Session::load(&m).unwrap();
    let mut v = vec![0f32; 1025];
    v[700] = 3.0;
    let x = Tensor::from_vec(v, 1025, &cpu())
        .unwrap()
        .to_dtype(candle_core::DType::F16)
        .unwrap();
    let out = s.predict(&[("input", x)]).unwrap();
    assert_eq!(
        out[0]
            .1
            .to_dtype(candle_core::DType::I64)
            .unwrap()
            .to_vec1::<i64>()
            .unwrap(),
        [700]
    );
}

const STATEFUL: &str = r#"program(1.3)
[buildInfo = dict<string, string>({{"coremlc-version", "hand-written"}})]
{
    func main<ios18>(state<tensor<fp16, [1, 4]>> acc, tensor<fp16, [1, 4]> x) {
            tensor<fp16, [1, 4]> old = read_state(input = acc)[name = string("old")];
            tensor<fp16, [1, 4]> sum = add(x = old, y = x)[name = string("sum")];
            tensor<fp16, [1, 4]> upd = coreml_update_state(state = acc, value = sum)[name = string("upd")];
            tensor<fp16, [1, 4]> y = mul(x = upd, y = fp16(0x1p+1))[name = string("y")];
        } -> (y);
}"#;

#[test]
fn a_program_with_a_state_reads_and_runs_accumulating_across_predictions() {
    let tmp = tempfile::tempdir().unwrap();
    let m = tmp.path().join("acc.mlmodelc");
    std::fs::create_dir(&m).unwrap();
    std::fs::write(m.join("model.mil"), STATEFUL).unwrap();
    let c = open_compiled(&m).unwrap();
    assert_eq!(c.model.description.states.len(), 1);
    assert_eq!(c.model.description.states[0].shape, [1, 4]);
    assert!(c
        .notes
        .iter()
        .any(|n| n.contains("metadata.json does not exist")));
    let mut s = Session::load(&m).unwrap();
    let x = Tensor::from_vec(vec![1f32, 2.0, -3.0, 0.5], (1, 4), &cpu())
        .unwrap()
        .to_dtype(candle_core::DType::F16)
        .unwrap();
    let y1 = f32s(&s.predict(&[("x", x.clone())]).unwrap()[0].1);
    let y2 = f32s(&s.predict(&[("x", x)]).unwrap()[0].1);
    assert_eq!(y1, [2.0, 4.0, -6.0, 1.0]);
    assert_eq!(y2, [4.0, 8.0, -12.0, 2.0]);
}

const LOOP: &str = r#"program(1.0)
{
    func main<ios15>(tensor<int32, [1]> n, tensor<fp32, [3]> x) {
            tensor<int32, [1]> k0 = const()[name = tensor<string, []>("k0"), val = tensor<int32, [1]>([0])];
            tensor<int32, [1]> k, tensor<fp32, [3]> acc = while_loop(loop_vars = (k0, x))[name = tensor<string, []>("loop")]
                (tensor<int32, [1]> k_c, tensor<fp32, [3]> a_c) {
                    tensor<bool, [1]> go = less(x = k_c, y = n)[name = tensor<string, []>("go")];
                } -> (go)
                (tensor<int32, [1]> k_b, tensor<fp32, [3]> a_b) {
                    tensor<int32, [1]> k_next = add(x = k_b, y = tensor<int32, []>(1))[name = tensor<string, []>("k_next")];
                    tensor<fp32, [3]> a_next = add(x = a_b, y = x)[name = tensor<string, []>("a_next")];
                } -> (k_next, a_next);
            tensor<bool, [1]> big = greater(x = k, y = tensor<int32, [1]>([2]))[name = tensor<string, []>("big")];
            tensor<fp32, [3]> r = cond(pred = big)[name = tensor<string, []>("pick")]
                {
                    tensor<fp32, [3]> t = mul(x = acc, y = tensor<fp32, []>(0x1p+1))[name = tensor<string, []>("t")];
                } -> (t)
                {
                    tensor<fp32, [3]> f = sub(x = acc, y = x)[name = tensor<string, []>("f")];
                } -> (f);
        } -> (k, r);
}"#;

#[test]
fn nested_blocks_of_while_loop_and_cond_read_and_run() {
    let tmp = tempfile::tempdir().unwrap();
    let m = tmp.path().join("loop.mlmodelc");
    std::fs::create_dir(&m).unwrap();
    std::fs::write(m.join("model.mil"), LOOP).unwrap();
    let mut s = Session::load(&m).unwrap();
    let x = [0.5f32, -1.0, 2.0];
    for n in [1i32, 4] {
        let out = s
            .predict(&[
                ("n", Tensor::new(&[n], &cpu()).unwrap()),
                ("x", Tensor::new(&x, &cpu()).unwrap()),
            ])
            .unwrap();
        let k = out[0].1.to_vec1::<i32>().unwrap();
        let r = f32s(&out[1].1);
        assert_eq!(k, [n]);
        // acc = x·(n+1); r = 2·acc when n > 2, else acc − x = x·n.
        let want: Vec<f32> = x
            .iter()
            .map(|v| {
                if n > 2 {
                    2.0 * v * (n + 1) as f32
                } else {
                    v * n as f32
                }
            })
            .collect();
        assert_eq!(r, want, "n = {n}");
    }
}

fn parse_err(text: &str, weights: &Weights) -> String {
    match parse_program(text, "bad/model.mil", weights, None) {
        Ok(_) => panic!("parsed:\n{text}"),
        Err(e) => format!("{e:#}"),
    }
}

#[test]
fn malformed_text_fails_naming_the_file_line_and_column() {
    let none = Weights::Absent("no weights in this test".into());
    // Truncated in the middle of the loop's body.
    let cut = &LOOP[..LOOP.find("a_next = add").unwrap() + 10];
    let e = parse_err(cut, &none);
    let last = cut.lines().count();
    assert!(e.starts_with(&format!("bad/model.mil:{last}:")), "{e}");
    assert!(e.contains("end of the file"), "{e}");
    // An op milkit does not know.
    let e = parse_err(&STATEFUL.replace("= add(", "= frobnicate("), &none);
    assert!(e.starts_with("bad/model.mil:6:40:"), "{e}");
    assert!(e.contains("unknown op type `frobnicate`"), "{e}");
    // A literal that is not a number.
    let e = parse_err(&STATEFUL.replace("0x1p+1", "0x1.zp+1"), &none);
    assert!(e.starts_with("bad/model.mil:8:"), "{e}");
    assert!(e.contains("`0x1.zp+1` is not a fp16 value"), "{e}");
    // An int literal out of range.
    let e = parse_err(
        &LOOP.replace(
            "tensor<int32, [1]>([0])",
            "tensor<int32, [1]>([4294967296])",
        ),
        &none,
    );
    assert!(e.starts_with("bad/model.mil:4:"), "{e}");
    assert!(e.contains("outside the range of int32"), "{e}");
    // A 4 GB dimension.
    let e = parse_err(
        &STATEFUL.replace("tensor<fp16, [1, 4]> x", "tensor<fp16, [1, 4294967296]> x"),
        &none,
    );
    assert!(e.starts_with("bad/model.mil:4:"), "{e}");
    assert!(e.contains("dimension 4294967296 is larger"), "{e}");
    // A declared type the op does not infer.
    let e = parse_err(
        &STATEFUL.replace("tensor<fp16, [1, 4]> sum", "tensor<fp16, [1, 5]> sum"),
        &none,
    );
    assert!(e.starts_with("bad/model.mil:6:13:"), "{e}");
    assert!(
        e.contains("declared tensor<fp16, [1, 5]> but infers to"),
        "{e}"
    );
    // A name used before it is defined.
    let e = parse_err(&STATEFUL.replace("add(x = old", "add(x = older"), &none);
    assert!(e.starts_with("bad/model.mil:6:"), "{e}");
    assert!(e.contains("older"), "{e}");
}

#[test]
fn a_blobfile_offset_past_the_end_of_the_weights_fails_naming_the_place() {
    let Some(dir) = compiled_dir() else { return };
    let m = dir.join("pairs/FluidInference-mobius__silero-vad-unified-v6.0.0/model.mlmodelc");
    let text = std::fs::read_to_string(m.join("model.mil")).unwrap();
    let w = Weights::File(
        milkit::package::blob::BlobReader::open(&m.join("weights/weight.bin")).unwrap(),
    );
    let bad = text.replacen(
        "offset = tensor<uint64, []>(64)",
        "offset = tensor<uint64, []>(8000000)",
        1,
    );
    let line = bad[..bad.find("(8000000)").unwrap()].lines().count();
    let e = parse_err(&bad, &w);
    assert!(e.starts_with(&format!("bad/model.mil:{line}:")), "{e}");
    assert!(
        e.contains("offset 8000000") && e.contains("past the end"),
        "{e}"
    );
}

#[test]
fn hex_floats_and_special_values_parse_exactly() {
    assert_eq!(
        parse_float("0x1.77540ap-4").unwrap() as f32,
        f32::from_bits(0x3dbbaa05)
    );
    assert_eq!(
        parse_float("-0x1.947f0cp-4").unwrap(),
        -(0x1947f0c as f64) * 2f64.powi(-28)
    );
    assert_eq!(parse_float("0x0p+0").unwrap(), 0.0);
    assert_eq!(parse_float("0x1p-24").unwrap(), 2f64.powi(-24));
    // An fp16 subnormal as Apple prints it: 0x1.5p-17 = 21 · 2^-21.
    let h = half::f16::from_f64(parse_float("0x1.5p-17").unwrap());
    assert_eq!(h.to_bits(), 21 << 3);
    assert_eq!(parse_float("-inf").unwrap(), f64::NEG_INFINITY);
    assert!(parse_float("nan").unwrap().is_nan());
    assert_eq!(parse_float("1025").unwrap(), 1025.0);
    assert!(parse_float("0x").is_none() && parse_float("12abc").is_none());
}

#[test]
fn apple_s_text_is_printed_back_byte_for_byte() {
    use milkit::package::mil_write::{write_program, Dialect, OffsetCounter};
    let Some(dir) = compiled_dir() else { return };
    let mut all = vec![];
    mlmodelc_folders(&dir, &mut all);
    let mut same = 0;
    for p in &all {
        let c = open_compiled(p).unwrap();
        let dialect = if c.dialect == "1.3" {
            Dialect::V1_3
        } else {
            Dialect::V1_0
        };
        let theirs = std::fs::read_to_string(p.join("model.mil")).unwrap();
        // Apple's compiler keeps every constant inline in a model without a weight file.
        let mut offsets = OffsetCounter::default();
        let sink: Option<&mut dyn milkit::package::convert::BlobSink> =
            if theirs.contains("BLOBFILE") {
                Some(&mut offsets)
            } else {
                None
            };
        let ours = write_program(&c.model.program, dialect, sink).unwrap();
        if p.to_string_lossy().contains("TransposeEncoder") {
            // The function attribute FlexibleShapeInformation is read into the
            // description, not kept in the program: that line differs, nothing else.
            let func = |s: &str| {
                s.lines()
                    .find(|l| l.contains("func main"))
                    .unwrap()
                    .to_string()
            };
            assert!(func(&theirs).starts_with(func(&ours).trim_end_matches(" {")));
            let rest = |s: &str| {
                s.lines()
                    .filter(|l| !l.contains("func main"))
                    .map(String::from)
                    .collect::<Vec<_>>()
            };
            assert_eq!(rest(&ours), rest(&theirs));
        } else {
            assert!(ours == theirs, "{}: the printed text differs", p.display());
        }
        same += 1;
    }
    assert_eq!(same, 8);
}

#[test]
fn convert_writes_a_valid_package_and_a_compiled_folder_that_run_alike() {
    let Some(dir) = compiled_dir() else { return };
    let tmp = tempfile::tempdir().unwrap();
    for (name, pair) in [
        ("vad", "FluidInference-mobius__silero-vad-unified-v6.0.0"),
        ("mnist", "jafreck-ironmill__test-q_base_mnist"),
    ] {
        let src = dir.join("pairs").join(pair).join("model.mlmodelc");
        let pkg = tmp.path().join(format!("{name}.mlpackage"));
        let back = tmp.path().join(format!("{name}.mlmodelc"));
        let run = |args: &[&std::ffi::OsStr]| {
            let o = common::milkit().arg("convert").args(args).output().unwrap();
            (
                o.status.code(),
                String::from_utf8_lossy(&o.stderr).into_owned(),
            )
        };
        let (code, e) = run(&[src.as_os_str(), "--out".as_ref(), pkg.as_os_str()]);
        assert_eq!(code, Some(0), "{e}");
        common::validate(&pkg);
        let (code, e) = run(&[pkg.as_os_str(), "--out".as_ref(), back.as_os_str()]);
        assert_eq!(code, Some(0), "{e}");
        // Never over an existing output without --force.
        let (code, e) = run(&[pkg.as_os_str(), "--out".as_ref(), back.as_os_str()]);
        assert_eq!(code, Some(2));
        assert!(e.contains("already exists") && e.contains("--force"), "{e}");
        if src.join("weights/weight.bin").exists() {
            assert_eq!(
                std::fs::read(src.join("weights/weight.bin")).unwrap(),
                std::fs::read(back.join("weights/weight.bin")).unwrap(),
                "{name}: the weight file written differs from Apple's"
            );
        }
        let mut sessions: Vec<Session> = [&src, &pkg, &back]
            .iter()
            .map(|p| Session::load(p).unwrap())
            .collect();
        let mut rng = Rng(3);
        let feeds = random_inputs(&sessions[0], &mut rng);
        let refs: Vec<(&str, Tensor)> =
            feeds.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
        let outs: Vec<Vec<_>> = sessions
            .iter_mut()
            .map(|s| {
                s.predict(&refs)
                    .unwrap()
                    .iter()
                    .map(|(n, t)| (n.clone(), bits(t)))
                    .collect()
            })
            .collect();
        assert_eq!(outs[0], outs[1], "{name}: package");
        assert_eq!(outs[0], outs[2], "{name}: compiled folder written back");
        // The coremldata.bin written from Apple's package holds the description Apple's
        // compiler wrote, in a header equal to Apple's byte for byte (the description's bytes
        // may differ only in the order of userDefined's keys, which Apple does not sort).
        let direct = tmp.path().join(format!("{name}-direct.mlmodelc"));
        let package = src.with_extension("mlpackage");
        let (code, e) = run(&[package.as_os_str(), "--out".as_ref(), direct.as_os_str()]);
        assert_eq!(code, Some(0), "{e}");
        let apple = std::fs::read(src.join("coremldata.bin")).unwrap();
        let ours = std::fs::read(direct.join("coremldata.bin")).unwrap();
        let (a, o) = (
            parse_coremldata(&apple).unwrap(),
            parse_coremldata(&ours).unwrap(),
        );
        assert_eq!(o, a, "{name}: coremldata.bin");
        assert_eq!(ours[..83], apple[..83], "{name}: coremldata.bin's header");
        assert_eq!(ours.len(), apple.len(), "{name}: coremldata.bin's length");
        assert_eq!(ours[ours.len() - 16..], apple[apple.len() - 16..], "{name}");
        if a.description.metadata.as_ref().unwrap().user_defined.len() < 2 {
            assert_eq!(ours, apple, "{name}: coremldata.bin");
        }
        // And the folder opens with the description from it alone.
        std::fs::remove_file(back.join("metadata.json")).unwrap();
        let c = open_compiled(&back).unwrap();
        assert_eq!(
            c.model.description,
            load_package(&pkg).unwrap().description,
            "{name}"
        );
    }
}

#[test]
fn every_truncation_and_byte_flip_of_a_program_is_an_error_or_a_program_never_a_panic() {
    let none = Weights::Absent("none".into());
    let mut rng = Rng(11);
    for text in [STATEFUL, LOOP] {
        for cut in 0..text.len() {
            if !text.is_char_boundary(cut) {
                continue;
            }
            let r = parse_program(&text[..cut], "cut.mil", &none, None);
            assert!(r.is_err(), "a truncation at {cut} parsed");
        }
        let bytes = text.as_bytes();
        for _ in 0..3000 {
            let mut b = bytes.to_vec();
            let i = rng.below(b.len());
            let alphabet = b"()[]{}<>,;=?-+.0123456789aepx\" _";
            b[i] = alphabet[rng.below(alphabet.len())];
            if let Ok(t) = std::str::from_utf8(&b) {
                if let Err(e) = parse_program(t, "flip.mil", &none, None) {
                    assert!(format!("{e}").starts_with("flip.mil:"), "{e}");
                }
            }
        }
    }
}

/// Runs a milkit command that must succeed; its stdout.
fn ok(c: &mut std::process::Command) -> String {
    let o = c.output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout).unwrap()
}

/// milkit's fp16 tiny.en folder (`export --component all`), and beside it the same folder
/// with every package converted to a compiled `NAME.mlmodelc` (json files copied); made
/// once per test run.
fn whisper_folders(fx: &Path) -> &'static (PathBuf, PathBuf) {
    static DIRS: std::sync::OnceLock<(PathBuf, PathBuf)> = std::sync::OnceLock::new();
    DIRS.get_or_init(|| {
        let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join("compiled-whisper");
        let (pkgs, compiled) = (root.join("pkgs"), root.join("compiled"));
        let _ = std::fs::remove_dir_all(&root);
        ok(common::milkit()
            .args(["export", "--quiet", "--component", "all", "--model"])
            .arg(fx.join("models/whisper-tiny.en"))
            .arg("--out")
            .arg(&pkgs));
        std::fs::create_dir(&compiled).unwrap();
        let mut n = 0;
        for e in std::fs::read_dir(&pkgs).unwrap() {
            let p = e.unwrap().path();
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            if let Some(stem) = name.strip_suffix(".mlpackage") {
                ok(common::milkit()
                    .arg("convert")
                    .arg(&p)
                    .arg("--out")
                    .arg(compiled.join(format!("{stem}.mlmodelc"))));
                n += 1;
            } else if p.is_file() {
                std::fs::copy(&p, compiled.join(&name)).unwrap();
            }
        }
        assert!(n >= 2, "{n} packages exported");
        (pkgs, compiled)
    })
}

#[test]
fn a_compiled_folder_written_from_milkit_s_whisper_packages_transcribes_the_same_text() {
    let Some(fx) = common::fixtures() else { return };
    let (pkgs, compiled) = whisper_folders(&fx);
    let clip = fx.join("audio/jfk.wav");
    let a = ok(common::milkit()
        .arg("transcribe")
        .arg("--models")
        .arg(pkgs)
        .arg(&clip));
    let b = ok(common::milkit()
        .arg("transcribe")
        .arg("--models")
        .arg(compiled)
        .arg(&clip));
    assert!(a.to_lowercase().contains("ask not"), "{a}");
    assert_eq!(a, b);
}

/// The files of a whisperkit-coreml model folder as WhisperKit downloads it: the compiled
/// components and `config.json`, `generation_config.json` (no tokenizer).
const WHISPERKIT_FILES: [&str; 5] = [
    "AudioEncoder.mlmodelc",
    "TextDecoder.mlmodelc",
    "MelSpectrogram.mlmodelc",
    "config.json",
    "generation_config.json",
];

#[test]
fn a_folder_laid_out_as_whisperkit_coreml_ships_it_transcribes_once_given_a_tokenizer() {
    let Some(fx) = common::fixtures() else { return };
    let (pkgs, compiled) = whisper_folders(&fx);
    let tmp = tempfile::tempdir().unwrap();
    let wk = tmp.path().join("openai_whisper-tiny.en");
    std::fs::create_dir(&wk).unwrap();
    for f in WHISPERKIT_FILES {
        let from = compiled.join(f);
        if from.is_dir() {
            copy_dir(&from, &wk.join(f));
        } else {
            std::fs::copy(&from, wk.join(f)).unwrap();
        }
    }
    let clip = fx.join("audio/jfk.wav");
    let o = common::milkit()
        .arg("transcribe")
        .arg("--models")
        .arg(&wk)
        .arg(&clip)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(
        e.contains("lacks tokenizer.json") && e.contains("whisperkit-coreml"),
        "{e}"
    );
    std::fs::copy(
        fx.join("models/whisper-tiny.en/tokenizer.json"),
        wk.join("tokenizer.json"),
    )
    .unwrap();
    for mel in [&[][..], &["--mel-package"][..]] {
        let a = ok(common::milkit()
            .arg("transcribe")
            .args(mel)
            .arg("--models")
            .arg(pkgs)
            .arg(&clip));
        let b = ok(common::milkit()
            .arg("transcribe")
            .args(mel)
            .arg("--models")
            .arg(&wk)
            .arg(&clip));
        assert!(a.to_lowercase().contains("ask not"), "{mel:?}: {a}");
        assert_eq!(a, b, "{mel:?}");
    }
    // With --mel-package the log-mel comes from MelSpectrogram.mlmodelc.
    let o = common::milkit()
        .args(["transcribe", "--mel-package", "-v", "--models"])
        .arg(&wk)
        .arg(&clip)
        .output()
        .unwrap();
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(e.contains("mel package"), "{e}");
}

#[test]
fn gate_takes_a_compiled_candidate_against_its_packages_and_goes() {
    let Some(fx) = common::fixtures() else { return };
    let (pkgs, compiled) = whisper_folders(&fx);
    let o = common::milkit()
        .arg("gate")
        .arg(compiled)
        .arg("--baseline")
        .arg(pkgs)
        .arg("--audio")
        .arg(fx.join("audio/jfk.wav"))
        .args(["--json", "--quiet"])
        .output()
        .unwrap();
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(r["verdict"], "go");
    let n = std::fs::read_dir(pkgs)
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .path()
                .extension()
                .is_some_and(|x| x == "mlpackage")
        })
        .count();
    assert_eq!(
        r["packages"].as_array().unwrap().len(),
        n,
        "{:#}",
        r["packages"]
    );
    for p in r["packages"].as_array().unwrap() {
        assert_eq!(p["abi_equal"], true, "{p}");
    }
    for p in r["parity"].as_array().unwrap() {
        assert_eq!(p["max_abs_error"], 0.0, "{p}");
    }
}

#[test]
fn compress_and_eval_take_a_compiled_model_as_they_take_its_package() {
    let Some(fx) = common::fixtures() else { return };
    let (pkgs, compiled) = whisper_folders(&fx);
    let tmp = tempfile::tempdir().unwrap();
    // compress: the compiled encoder and its package compress to the same package.
    let lut = |input: &Path, out: &Path| {
        ok(common::milkit()
            .arg("compress")
            .arg(input)
            .arg("--out")
            .arg(out)
            .args(["--quiet", "--palettize", "uniform", "--nbits", "4"]))
    };
    let (from_pkg, from_c) = (
        tmp.path().join("from-pkg.mlpackage"),
        tmp.path().join("from-compiled.mlpackage"),
    );
    lut(&pkgs.join("AudioEncoder.mlpackage"), &from_pkg);
    lut(&compiled.join("AudioEncoder.mlmodelc"), &from_c);
    let weights =
        |p: &Path| std::fs::read(p.join("Data/com.apple.CoreML/weights/weight.bin")).unwrap();
    assert!(
        weights(&from_c) == weights(&from_pkg),
        "the weight files differ"
    );
    let (a, b) = (
        load_package(&from_pkg).unwrap(),
        load_package(&from_c).unwrap(),
    );
    assert_eq!(a.program, b.program);
    assert_eq!(a.description.inputs, b.description.inputs);
    assert_eq!(a.description.outputs, b.description.outputs);
    // An .mlmodelc output is refused, naming what to do.
    let o = common::milkit()
        .arg("compress")
        .arg(compiled.join("AudioEncoder.mlmodelc"))
        .arg("--out")
        .arg(tmp.path().join("x.mlmodelc"))
        .args(["--quiet", "--palettize", "uniform", "--nbits", "4"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(
        e.contains("x.mlmodelc") && e.contains("milkit convert"),
        "{e}"
    );
    // eval: bits per compressed weight of a folder whose encoder is compiled.
    let (pkg_dir, c_dir) = (tmp.path().join("p"), tmp.path().join("c"));
    copy_dir(pkgs, &pkg_dir);
    copy_dir(compiled, &c_dir);
    std::fs::remove_dir_all(pkg_dir.join("AudioEncoder.mlpackage")).unwrap();
    copy_dir(&from_pkg, &pkg_dir.join("AudioEncoder.mlpackage"));
    std::fs::remove_dir_all(c_dir.join("AudioEncoder.mlmodelc")).unwrap();
    ok(common::milkit()
        .arg("convert")
        .arg(&from_c)
        .arg("--out")
        .arg(c_dir.join("AudioEncoder.mlmodelc")));
    let bits = |d: &Path| -> serde_json::Value {
        serde_json::from_str(&ok(common::milkit()
            .args(["eval", "--json", "--models"])
            .arg(d)))
        .unwrap()
    };
    let (bp, bc) = (bits(&pkg_dir), bits(&c_dir));
    assert!(bp["avg_bits"].as_f64().unwrap() > 4.0, "{bp:#}");
    assert_eq!(bp["avg_bits"], bc["avg_bits"]);
    assert_eq!(bp["compressed_elements"], bc["compressed_elements"]);
    let names: Vec<_> = bc["packages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["package"].as_str().unwrap().to_string())
        .collect();
    assert!(
        names.contains(&"AudioEncoder.mlmodelc".to_string()),
        "{names:?}"
    );
    // eval --against: the compiled folder against its packages, identical next tokens.
    let f: serde_json::Value = serde_json::from_str(&ok(common::milkit()
        .args(["eval", "--json", "--quiet", "--models"])
        .arg(compiled)
        .arg("--against")
        .arg(pkgs)
        .arg("--audio")
        .arg(fx.join("audio/jfk.wav"))))
    .unwrap();
    assert_eq!(f["mean_kl"], 0.0, "{f:#}");
    assert_eq!(f["top1_agreement"], 1.0, "{f:#}");
    assert_eq!(f["wer_vs_baseline"], 0.0, "{f:#}");
}

#[test]
fn a_compiled_folder_without_model_mil_is_refused_as_not_an_ml_program() {
    let tmp = tempfile::tempdir().unwrap();
    let m = tmp.path().join("nn.mlmodelc");
    std::fs::create_dir(&m).unwrap();
    std::fs::write(m.join("model.espresso.net"), "{}").unwrap();
    let e = format!("{:#}", load_package(&m).unwrap_err());
    assert!(
        e.contains("without model.mil") && e.contains("not an ML Program"),
        "{e}"
    );
}

/// The compiled models of the fixtures that have a `coremldata.bin`.
fn with_coremldata(dir: &Path) -> Vec<PathBuf> {
    let mut all = vec![];
    mlmodelc_folders(dir, &mut all);
    all.retain(|p| p.join("coremldata.bin").is_file());
    all
}

fn metadata(p: &Path) -> serde_json::Value {
    let j: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(p.join("metadata.json")).unwrap()).unwrap();
    j[0].clone()
}

#[test]
fn coremldata_bin_holds_the_description_metadata_json_gives() {
    use milkit::proto::specification::array_feature_type::ShapeFlexibility;
    use milkit::proto::specification::feature_type::Type;
    let Some(dir) = compiled_dir() else { return };
    let all = with_coremldata(&dir);
    assert_eq!(all.len(), 5, "{all:?}");
    for p in &all {
        let c = read_coremldata(p).unwrap().unwrap();
        let m = metadata(p);
        assert_eq!(c.kind, "generic", "{}", p.display());
        assert_eq!(
            c.spec_version,
            m["specificationVersion"].as_u64().unwrap(),
            "{}",
            p.display()
        );
        let names = |key: &str| -> Vec<String> {
            m[key]
                .as_array()
                .unwrap()
                .iter()
                .map(|j| j["name"].as_str().unwrap().to_string())
                .collect()
        };
        let d = &c.description;
        let ours = |fs: &[milkit::proto::specification::FeatureDescription]| -> Vec<String> {
            fs.iter().map(|f| f.name.clone()).collect()
        };
        assert_eq!(ours(&d.input), names("inputSchema"), "{}", p.display());
        assert_eq!(ours(&d.output), names("outputSchema"), "{}", p.display());
        assert_eq!(
            d.metadata.as_ref().unwrap().author,
            m["author"].as_str().unwrap_or(""),
            "{}",
            p.display()
        );
    }
    // TransposeEncoder's flexible input: the same ranges as metadata.json's shapeRange.
    let t = dir.join("FluidInference-FluidAudio__TransposeEncoder.mlmodelc");
    let c = read_coremldata(&t).unwrap().unwrap();
    let Some(Type::MultiArrayType(a)) = c.description.input[0]
        .r#type
        .as_ref()
        .and_then(|t| t.r#type.clone())
    else {
        panic!("x is not a multi-array")
    };
    let Some(ShapeFlexibility::ShapeRange(r)) = a.shape_flexibility else {
        panic!("x has no shape range")
    };
    let ranges: Vec<[i64; 2]> = r
        .size_ranges
        .iter()
        .map(|s| [s.lower_bound as i64, s.upper_bound])
        .collect();
    let theirs: Vec<[i64; 2]> = serde_json::from_str(
        metadata(&t)["inputSchema"][0]["shapeRange"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(ranges, theirs);
    assert_eq!(ranges, [[1, 1], [1, 2048], [1, 2048]]);
}

#[test]
fn the_writer_rebuilds_each_coremldata_bin_header_byte_for_byte() {
    let Some(dir) = compiled_dir() else { return };
    for p in with_coremldata(&dir) {
        let bytes = std::fs::read(p.join("coremldata.bin")).unwrap();
        let c = parse_coremldata(&bytes).unwrap();
        let ours = coremldata_bytes(c.spec_version, &c.description);
        // The header up to the description, the description's length and the closing tag;
        // the description itself only as decoded (Apple does not sort userDefined's keys).
        assert_eq!(ours.len(), bytes.len(), "{}", p.display());
        assert_eq!(ours[..83], bytes[..83], "{}", p.display());
        assert_eq!(
            ours[ours.len() - 16..],
            bytes[bytes.len() - 16..],
            "{}",
            p.display()
        );
    }
}

const TWO_FUNCTIONS: &str = r#"program(1.3)
[buildInfo = dict<string, string>({{"coremlc-version", "hand-written"}})]
{
    func main<ios18>(tensor<fp16, [1, 4]> x) {
            tensor<fp16, [1, 4]> y = mul(x = x, y = fp16(0x1p+1))[name = string("y")];
        } -> (y);
    func twice<ios18>(tensor<fp16, [1, ?]> x) {
            tensor<fp16, [1, ?]> z = add(x = x, y = x)[name = string("z")];
        } -> (z);
}"#;

fn array(name: &str, shape: &[i64], ranges: Option<&[(u64, i64)]>) -> FeatureDescription {
    use milkit::proto::specification::array_feature_type::{
        ArrayDataType, ShapeFlexibility, ShapeRange,
    };
    use milkit::proto::specification::{feature_type, ArrayFeatureType, FeatureType, SizeRange};
    FeatureDescription {
        name: name.into(),
        r#type: Some(FeatureType {
            is_optional: false,
            r#type: Some(feature_type::Type::MultiArrayType(ArrayFeatureType {
                shape: shape.to_vec(),
                data_type: ArrayDataType::Float16 as i32,
                shape_flexibility: ranges.map(|r| {
                    ShapeFlexibility::ShapeRange(ShapeRange {
                        size_ranges: r
                            .iter()
                            .map(|&(lower_bound, upper_bound)| SizeRange {
                                lower_bound,
                                upper_bound,
                            })
                            .collect(),
                    })
                }),
                default_optional_value: None,
            })),
        }),
        ..Default::default()
    }
}

#[test]
fn coremldata_bin_gives_a_multifunction_model_its_function_list_and_default() {
    use milkit::proto::specification::FunctionDescription;
    let tmp = tempfile::tempdir().unwrap();
    let m = tmp.path().join("two.mlmodelc");
    std::fs::create_dir(&m).unwrap();
    std::fs::write(m.join("model.mil"), TWO_FUNCTIONS).unwrap();
    // The program alone: `main` is the default, `twice`'s `?` unbounded.
    let c = open_compiled(&m).unwrap();
    assert_eq!(c.model.description.default_function, "main");
    assert_eq!(
        c.model.description.functions["twice"].inputs[0]
            .flex
            .to_string(),
        "[1, 1..]"
    );
    let d = ModelDescription {
        functions: vec![
            FunctionDescription {
                name: "main".into(),
                input: vec![array("x", &[1, 4], None)],
                output: vec![array("y", &[], None)],
                ..Default::default()
            },
            FunctionDescription {
                name: "twice".into(),
                input: vec![array("x", &[1, 8], Some(&[(1, 1), (1, 64)]))],
                output: vec![array("z", &[], None)],
                ..Default::default()
            },
        ],
        default_function_name: "twice".into(),
        ..Default::default()
    };
    std::fs::write(m.join("coremldata.bin"), coremldata_bytes(9, &d)).unwrap();
    let c = open_compiled(&m).unwrap();
    let desc = &c.model.description;
    assert_eq!(desc.default_function, "twice");
    assert_eq!(desc.functions.keys().collect::<Vec<_>>(), ["main", "twice"]);
    assert_eq!(desc.inputs[0].shape, [1, 8]);
    assert_eq!(desc.inputs[0].flex.to_string(), "[1, 1..=64]");
    assert_eq!(c.model.spec_version, 9);
    assert!(c.warnings.is_empty(), "{:?}", c.warnings);
    // It runs `twice` by default, at a size the range allows.
    let mut s = Session::load(&m).unwrap();
    let x = Tensor::from_vec(vec![1f32, 2.0, 3.0], (1, 3), &cpu())
        .unwrap()
        .to_dtype(candle_core::DType::F16)
        .unwrap();
    let out = s.predict(&[("x", x)]).unwrap();
    assert_eq!(out[0].0, "z");
    assert_eq!(f32s(&out[0].1), [2.0, 4.0, 6.0]);
    // A function coremldata.bin lists that the program lacks is a note.
    let mut d2 = d.clone();
    d2.functions[1].name = "thrice".into();
    d2.default_function_name = "main".into();
    std::fs::write(m.join("coremldata.bin"), coremldata_bytes(9, &d2)).unwrap();
    let c = open_compiled(&m).unwrap();
    assert!(
        c.notes.iter().any(|n| n.contains("function `thrice`"))
            && c.notes
                .iter()
                .any(|n| n.contains("twice: not in coremldata.bin's function list")),
        "{:?}",
        c.notes
    );
}

#[test]
fn without_metadata_json_the_description_comes_from_coremldata_bin() {
    let Some(dir) = compiled_dir() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let m = tmp.path().join("t.mlmodelc");
    copy_dir(
        &dir.join("FluidInference-FluidAudio__TransposeEncoder.mlmodelc"),
        &m,
    );
    std::fs::remove_file(m.join("metadata.json")).unwrap();
    // Without the function attribute either, only coremldata.bin knows the ranges.
    let text = std::fs::read_to_string(m.join("model.mil")).unwrap();
    let start = text.find(" [FlexibleShapeInformation").unwrap();
    let end = start + text[start..].find(")))] {").unwrap() + ")))]".len();
    std::fs::write(
        m.join("model.mil"),
        format!("{}{}", &text[..start], &text[end..]),
    )
    .unwrap();
    let c = open_compiled(&m).unwrap();
    let x = &c.model.description.inputs[0];
    assert_eq!(x.shape, [1, 1, 1]);
    assert_eq!(x.flex.to_string(), "[1, 1..=2048, 1..=2048]");
    assert_eq!(c.model.description.author, "FluidAudio");
    assert_eq!(c.model.spec_version, 7);
    assert!(c.warnings.is_empty(), "{:?}", c.warnings);
    assert_eq!(c.notes.len(), 1, "{:?}", c.notes);
    assert!(c.notes[0].contains("from coremldata.bin and the program"));
}

/// Argmax's `coremldata.bin` with its input's size 1025 (varint `81 08`) made 1024.
fn argmax_with_a_wrong_coremldata(dir: &Path, to: &Path) {
    copy_dir(&dir.join("FluidInference-FluidAudio__Argmax.mlmodelc"), to);
    let mut b = std::fs::read(to.join("coremldata.bin")).unwrap();
    let at = b.windows(3).position(|w| w == [0x0a, 0x02, 0x81]).unwrap();
    b[at + 2] = 0x80;
    std::fs::write(to.join("coremldata.bin"), b).unwrap();
}

#[test]
fn where_coremldata_bin_disagrees_with_the_program_the_program_wins_and_inspect_says_so() {
    let Some(dir) = compiled_dir() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let m = tmp.path().join("argmax.mlmodelc");
    argmax_with_a_wrong_coremldata(&dir, &m);
    let c = open_compiled(&m).unwrap();
    assert_eq!(c.model.description.inputs[0].shape, [1025]);
    assert_eq!(c.notes.len(), 1, "{:?}", c.notes);
    assert!(
        c.notes[0].contains("input `input`: coremldata.bin says")
            && c.notes[0].contains("[1024]")
            && c.notes[0].contains("[1025]"),
        "{:?}",
        c.notes
    );
    let out = inspect_text(&m);
    assert!(
        out.contains("coremldata.bin says") && out.contains("the program wins"),
        "{out}"
    );
}

#[test]
fn a_damaged_coremldata_bin_is_a_named_warning_never_a_panic() {
    let Some(dir) = compiled_dir() else { return };
    let mut rng = Rng(5);
    for p in with_coremldata(&dir) {
        let bytes = std::fs::read(p.join("coremldata.bin")).unwrap();
        assert!(parse_coremldata(&bytes).is_ok());
        // Every cut before the closing tag's end; the 12 zeros after it are not read.
        for cut in 0..bytes.len() - 12 {
            let e = parse_coremldata(&bytes[..cut]).unwrap_err();
            assert!(format!("{e:#}").contains("byte"), "{cut}: {e:#}");
        }
        for _ in 0..2000 {
            let mut b = bytes.clone();
            let i = rng.below(b.len());
            b[i] = rng.below(256) as u8;
            let _ = parse_coremldata(&b);
        }
        // A length of 2^64 - 1 is refused before anything is allocated.
        let mut b = bytes.clone();
        b[75..83].copy_from_slice(&u64::MAX.to_le_bytes());
        let e = format!("{:#}", parse_coremldata(&b).unwrap_err());
        assert!(e.contains("the description needs"), "{e}");
    }
    // The folder still opens, from metadata.json, and inspect shows the warning.
    let tmp = tempfile::tempdir().unwrap();
    let m = tmp.path().join("t.mlmodelc");
    copy_dir(
        &dir.join("FluidInference-FluidAudio__TransposeEncoder.mlmodelc"),
        &m,
    );
    let b = std::fs::read(m.join("coremldata.bin")).unwrap();
    std::fs::write(m.join("coremldata.bin"), &b[..200]).unwrap();
    let c = open_compiled(&m).unwrap();
    assert_eq!(
        c.model.description.inputs[0].flex.to_string(),
        "[1, 1..=2048, 1..=2048]"
    );
    assert_eq!(c.warnings.len(), 1);
    assert!(
        c.warnings[0].contains("coremldata.bin: at byte 83: the description needs 293 bytes")
            && c.warnings[0].contains("comes from metadata.json"),
        "{:?}",
        c.warnings
    );
    let out = inspect_text(&m);
    assert!(
        out.contains("warning:") && out.contains("coremldata.bin"),
        "{out}"
    );
    // A Git LFS pointer (what a clone without `git lfs pull` holds) is named as one.
    std::fs::write(
        m.join("coremldata.bin"),
        "version https://git-lfs.github.com/spec/v1\noid sha256:00\nsize 392\n",
    )
    .unwrap();
    let c = open_compiled(&m).unwrap();
    assert!(
        c.warnings.len() == 1 && c.warnings[0].contains("coremldata.bin is a Git LFS pointer"),
        "{:?}",
        c.warnings
    );
}
