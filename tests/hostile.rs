//! Hostile input through the `milkit` binary (and the library readers it uses): files whose
//! sizes lie (a billion layers, shapes that overflow, blob records and WAV chunks larger than
//! their files, absurd token ids), weights holding NaN or ±Inf, broken packages handed to
//! the runtime, and a stdout closed early. Every case must end with a clear error naming the
//! file and the problem (exit 2) — never a panic, an abort or a signal — and the tests write
//! every broken input themselves.

mod common;

use milkit::ir::{ArrayDType, DType, Description, Feature, Model, Opset, Value, ValueType};
use milkit::ops::{Builder, In};
use milkit::whisper::synth::{synthesize_with, SynthDType, SynthOptions};
use prost::Message;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// A micro checkpoint (d_model 64, 2 + 2 layers) in `dir`.
fn micro_checkpoint(dir: &Path) {
    let opts = SynthOptions {
        seed: 7,
        dtype: SynthDType::F16,
        progress: false,
        force: false,
    };
    synthesize_with(&common::micro_config(), None, dir, &opts).unwrap();
}

fn run(args: &[&str], paths: &[&Path]) -> Output {
    let mut c = common::milkit();
    c.args(args);
    c.args(paths);
    c.output().unwrap()
}

/// Runs milkit, which must fail cleanly: exit status 2, no panic, one `error:` line naming
/// the problem. Returns stderr.
fn fails(mut c: Command) -> String {
    let o = c.output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(o.status.code(), Some(2), "status {:?}: {err}", o.status);
    assert!(!err.contains("panicked"), "panic: {err}");
    assert!(err.contains("error:"), "{err}");
    err
}

fn export(model: &Path, component: &str, out: &Path) -> Command {
    let mut c = common::milkit();
    c.args(["export", "--quiet", "--component", component, "--model"])
        .arg(model)
        .arg("--out")
        .arg(out);
    c
}

fn edit_config(dir: &Path, edit: impl Fn(&mut serde_json::Value)) {
    let path = dir.join("config.json");
    let mut json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    edit(&mut json);
    std::fs::write(&path, json.to_string()).unwrap();
}

#[test]
fn a_config_claiming_a_billion_layers_names_the_first_missing_tensor() {
    let tmp = tempfile::tempdir().unwrap();
    let m = tmp.path().join("m");
    micro_checkpoint(&m);
    edit_config(&m, |j| j["encoder_layers"] = 1_000_000_000.into());
    let out = tmp.path().join("enc.mlpackage");
    let e = fails(export(&m, "encoder", &out));
    for part in [
        "model.safetensors",
        "encoder_layers = 1000000000",
        "no tensor of layer 2",
        "model.encoder.layers.2.self_attn.q_proj.weight",
    ] {
        assert!(e.contains(part), "{part:?} not in: {e}");
    }
    assert!(!out.exists());

    // The same for the decoder, and for a count only one above the layers present.
    edit_config(&m, |j| {
        j["encoder_layers"] = 2.into();
        j["decoder_layers"] = 3.into();
    });
    let e = fails(export(&m, "decoder", &out));
    assert!(
        e.contains("decoder_layers = 3") && e.contains("model.decoder.layers.2.self_attn"),
        "{e}"
    );
}

#[test]
fn absurd_config_dimensions_are_refused_before_anything_is_allocated() {
    let tmp = tempfile::tempdir().unwrap();
    let m = tmp.path().join("m");
    micro_checkpoint(&m);
    let out = tmp.path().join("x.mlpackage");
    for (key, value, component) in [
        ("d_model", 1u64 << 40, "encoder"),
        ("num_mel_bins", 1 << 30, "mel"),
        ("vocab_size", 1 << 40, "decoder"),
        ("max_source_positions", 1 << 40, "encoder"),
        ("encoder_ffn_dim", u64::MAX, "encoder"),
    ] {
        let good = std::fs::read_to_string(m.join("config.json")).unwrap();
        edit_config(&m, |j| j[key] = value.into());
        let e = fails(export(&m, component, &out));
        assert!(
            e.contains("config.json") && e.contains(key) && e.contains("implausibly large"),
            "{key}: {e}"
        );
        std::fs::write(m.join("config.json"), good).unwrap();
    }
}

/// A safetensors file written by hand: `header` as JSON, then `data`.
fn raw_safetensors(path: &Path, header: &serde_json::Value, data: &[u8]) {
    let h = header.to_string().into_bytes();
    let mut bytes = (h.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(&h);
    bytes.extend_from_slice(data);
    std::fs::write(path, bytes).unwrap();
}

#[test]
fn safetensors_shapes_that_overflow_or_exceed_the_file_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let m = tmp.path().join("m");
    micro_checkpoint(&m);
    let st = m.join("model.safetensors");
    let out = tmp.path().join("x.mlpackage");
    for shape in [
        serde_json::json!([1u64 << 32, 1u64 << 32, 1u64 << 32]),
        serde_json::json!([u64::MAX, 2]),
        serde_json::json!([1u64 << 30, 1u64 << 30]),
    ] {
        let header = serde_json::json!({
            "model.encoder.conv1.weight": {"dtype": "F16", "shape": shape, "data_offsets": [0, 8]}
        });
        raw_safetensors(&st, &header, &[0; 8]);
        let e = fails(export(&m, "encoder", &out));
        assert!(
            e.contains("model.safetensors") && e.contains("invalid safetensors header"),
            "{e}"
        );
    }
    // Offsets past the end of the file.
    let header = serde_json::json!({
        "model.encoder.conv1.weight": {"dtype": "F16", "shape": [1u64 << 39], "data_offsets": [0, 1u64 << 40]}
    });
    raw_safetensors(&st, &header, &[0; 8]);
    let e = fails(export(&m, "encoder", &out));
    assert!(
        e.contains("model.safetensors") && e.contains("truncated"),
        "{e}"
    );
}

/// y = x · mask + 1 (fp16 [2, 3]) as a package in `dir`.
fn small_package(dir: &Path) -> PathBuf {
    let mut b = Builder::new(Opset::Ios17);
    let x = b.input("x", ValueType::tensor(DType::F16, &[2, 3]));
    let m = b.input("mask", ValueType::tensor(DType::F16, &[2, 3]));
    let xm = b
        .op1("mul", "xm", vec![("x", In::V(x)), ("y", In::V(m))])
        .unwrap();
    let y = b
        .op1(
            "add",
            "y",
            vec![("x", In::V(xm)), ("y", In::C(Value::f16_scalar(1.0)))],
        )
        .unwrap();
    let (inputs, block) = b.finish(&[(y, "y")]).unwrap();
    save(
        dir.join("small.mlpackage"),
        inputs,
        block,
        vec![
            Feature::new("x", ArrayDType::F16, &[2, 3]),
            Feature::new("mask", ArrayDType::F16, &[2, 3]),
        ],
        vec![Feature::new("y", ArrayDType::F16, &[2, 3])],
    )
}

fn save(
    path: PathBuf,
    inputs: Vec<milkit::ir::Var>,
    block: milkit::ir::Block,
    ins: Vec<Feature>,
    outs: Vec<Feature>,
) -> PathBuf {
    let m = Model::single(
        Opset::Ios17,
        inputs,
        block,
        Description {
            inputs: ins,
            outputs: outs,
            ..Default::default()
        },
    );
    milkit::package::save_package(&m, &path, false, &mut |_| {}).unwrap();
    path
}

fn mlmodel(pkg: &Path) -> PathBuf {
    pkg.join("Data/com.apple.CoreML/model.mlmodel")
}

/// Decodes a package's model.mlmodel, lets `edit` change the main block, writes it back.
fn edit_program(pkg: &Path, edit: impl Fn(&mut milkit::proto::mil::Block)) {
    use milkit::proto::specification as spec;
    let path = mlmodel(pkg);
    let mut m = spec::Model::decode(std::fs::read(&path).unwrap().as_slice()).unwrap();
    let Some(spec::model::Type::MlProgram(p)) = m.r#type.as_mut() else {
        panic!("not a program")
    };
    let f = p.functions.get_mut("main").unwrap();
    let block = f.block_specializations.values_mut().next().unwrap();
    edit(block);
    std::fs::write(&path, m.encode_to_vec()).unwrap();
}

fn set_dims(t: &mut milkit::proto::mil::ValueType, dims: &[u64]) {
    use milkit::proto::mil;
    let Some(mil::value_type::Type::TensorType(tt)) = t.r#type.as_mut() else {
        panic!("not a tensor type")
    };
    tt.rank = dims.len() as i64;
    tt.dimensions = dims
        .iter()
        .map(|&d| mil::Dimension {
            dimension: Some(mil::dimension::Dimension::Constant(
                mil::dimension::ConstantDimension { size: d },
            )),
        })
        .collect();
}

#[test]
fn model_mlmodel_types_whose_element_count_overflows_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    for dims in [
        vec![1u64 << 32, 1 << 32, 1 << 32],
        vec![u64::MAX, u64::MAX],
        vec![1 << 41],
    ] {
        let pkg = small_package(&tmp.path().join(format!("{}", dims.len())));
        edit_program(&pkg, |b| {
            let op = b.operations.iter_mut().find(|o| o.r#type == "mul").unwrap();
            set_dims(op.outputs[0].r#type.as_mut().unwrap(), &dims);
        });
        let e = fails({
            let mut c = common::milkit();
            c.arg("inspect").arg(&pkg);
            c
        });
        assert!(
            e.contains("model.mlmodel") && e.contains("more than 1099511627776 elements"),
            "{dims:?}: {e}"
        );
    }
}

/// The first blob record of a package's weight.bin (at offset 64): (dtype, size, offset).
fn weight_bin(pkg: &Path) -> PathBuf {
    pkg.join("Data/com.apple.CoreML/weights/weight.bin")
}

#[test]
fn weight_bin_records_with_absurd_sizes_or_counts_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let m = tmp.path().join("m");
    micro_checkpoint(&m);
    let pkg = tmp.path().join("enc.mlpackage");
    let o = export(&m, "encoder", &pkg).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let good = std::fs::read(weight_bin(&pkg)).unwrap();
    let inspect = || {
        let mut c = common::milkit();
        c.args(["verify", "--json"]).arg(&pkg);
        c
    };
    // Data size of the first record (bytes 8..16 of the record at 64): huge, and one that
    // overflows when added to the data offset.
    for size in [u64::MAX, u64::MAX - 100, 1 << 40] {
        let mut bad = good.clone();
        bad[64 + 8..64 + 16].copy_from_slice(&size.to_le_bytes());
        std::fs::write(weight_bin(&pkg), &bad).unwrap();
        let e = fails(inspect());
        assert!(
            e.contains("weight.bin") && e.contains("runs past the end of the file"),
            "{e}"
        );
    }
    // The data offset pointing far away.
    let mut bad = good.clone();
    bad[64 + 16..64 + 24].copy_from_slice(&(u64::MAX - 3).to_le_bytes());
    std::fs::write(weight_bin(&pkg), &bad).unwrap();
    let e = fails(inspect());
    assert!(
        e.contains("weight.bin") && e.contains("past the end"),
        "{e}"
    );
    // A header claiming 4 billion blobs (the walk stops at the first bad record).
    let mut bad = good.clone();
    bad[0..4].copy_from_slice(&u32::MAX.to_le_bytes());
    std::fs::write(weight_bin(&pkg), &bad).unwrap();
    let o = inspect().output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !err.contains("panicked") && o.status.code().is_some(),
        "{err}"
    );
    // Truncated to half.
    std::fs::write(weight_bin(&pkg), &good[..good.len() / 2]).unwrap();
    let e = fails(inspect());
    assert!(e.contains("weight.bin"), "{e}");
}

#[test]
fn wav_headers_declaring_more_samples_than_the_file_holds_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("a.wav");
    let spec = hound::WavSpec {
        channels: 1,
        sample_rate: 16_000,
        bits_per_sample: 16,
        sample_format: hound::SampleFormat::Int,
    };
    let mut w = hound::WavWriter::create(&path, spec).unwrap();
    for i in 0..1600 {
        w.write_sample((i % 100) as i16).unwrap();
    }
    w.finalize().unwrap();
    let good = std::fs::read(&path).unwrap();
    assert_eq!(
        milkit::whisper::audio::load_audio(&path).unwrap().len(),
        1600
    );
    // The data chunk's length field (bytes 40..44 of hound's 44-byte header).
    assert_eq!(&good[36..40], b"data");
    for len in [u32::MAX - 1, 1 << 30] {
        let mut bad = good.clone();
        bad[40..44].copy_from_slice(&len.to_le_bytes());
        std::fs::write(&path, &bad).unwrap();
        let e = format!(
            "{:#}",
            milkit::whisper::audio::load_audio(&path).unwrap_err()
        );
        assert!(
            e.contains("a.wav") && e.contains(&format!("declares {len} bytes")),
            "{e}"
        );
    }
    // One sample more than the file holds: truncated.
    let mut bad = good.clone();
    bad[40..44].copy_from_slice(&3202u32.to_le_bytes());
    std::fs::write(&path, &bad).unwrap();
    let e = format!(
        "{:#}",
        milkit::whisper::audio::load_audio(&path).unwrap_err()
    );
    assert!(e.contains("a.wav") && e.contains("truncated"), "{e}");
    // Zero-length data and a header only: clear errors or empty audio, never a panic.
    let mut empty = good[..44].to_vec();
    empty[40..44].copy_from_slice(&0u32.to_le_bytes());
    std::fs::write(&path, &empty).unwrap();
    assert!(milkit::whisper::audio::load_audio(&path)
        .unwrap()
        .is_empty());
    std::fs::write(&path, &good[..20]).unwrap();
    let e = format!(
        "{:#}",
        milkit::whisper::audio::load_audio(&path).unwrap_err()
    );
    assert!(e.contains("a.wav"), "{e}");
}

#[test]
fn tokenizer_files_with_absurd_token_ids_are_refused() {
    use milkit::whisper::tokenizer::Tokenizer;
    let e = |json: &str| format!("{:#}", Tokenizer::from_json(json).unwrap_err());
    let t = e(r#"{"model": {"vocab": {"a": 9999999}}, "added_tokens": []}"#);
    assert!(
        t.contains("9999999") && t.contains("implausibly large"),
        "{t}"
    );
    let t = e(
        r#"{"model": {"vocab": {"a": 0}}, "added_tokens": [{"id": 4000000000, "content": "x", "special": true}]}"#,
    );
    assert!(t.contains("4000000000"), "{t}");
    // Dense enough ids (Whisper's files lack the timestamp ids) load.
    let ok = Tokenizer::from_json(
        r#"{"model": {"vocab": {"a": 0, "b": 1}}, "added_tokens": [{"id": 51000, "content": "<|x|>", "special": true}]}"#,
    )
    .unwrap();
    assert_eq!(ok.len(), 51001);
}

/// Overwrites `count` fp16 values of `tensor` in a micro checkpoint (spread over the tensor)
/// with `bits`.
fn poison(dir: &Path, tensor: &str, count: usize, bits: u16) {
    let path = dir.join("model.safetensors");
    let mut bytes = std::fs::read(&path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let json: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let t = &json[tensor];
    assert_eq!(t["dtype"], "F16");
    let start = 8 + n + t["data_offsets"][0].as_u64().unwrap() as usize;
    let end = 8 + n + t["data_offsets"][1].as_u64().unwrap() as usize;
    let elems = (end - start) / 2;
    for k in 0..count {
        let at = start + (k * elems / count) * 2;
        bytes[at..at + 2].copy_from_slice(&bits.to_le_bytes());
    }
    std::fs::write(&path, bytes).unwrap();
}

#[test]
fn non_finite_weights_are_refused_at_export_unless_allowed() {
    let tmp = tempfile::tempdir().unwrap();
    let m = tmp.path().join("m");
    micro_checkpoint(&m);
    // 3 NaNs in fc1 of layer 1 (128 × 64 values), 2 infinities in the final layer norm.
    poison(&m, "model.encoder.layers.1.fc1.weight", 3, 0x7e00);
    poison(&m, "model.encoder.layer_norm.weight", 2, 0xfc00);
    let out = tmp.path().join("enc.mlpackage");
    let e = fails(export(&m, "encoder", &out));
    assert!(
        e.contains("model.encoder.layers.1.fc1.weight")
            && e.contains("model.safetensors")
            && e.contains("3 of 8192 values are not finite")
            && e.contains("--allow-nonfinite"),
        "{e}"
    );
    assert!(!out.exists());
    // Compressing while exporting reads the same tensors.
    let mut c = export(&m, "encoder", &out);
    c.args(["--palettize", "kmeans", "--nbits", "4"]);
    let e = fails(c);
    assert!(e.contains("3 of 8192 values are not finite"), "{e}");

    let mut c = export(&m, "encoder", &out);
    c.arg("--allow-nonfinite");
    let o = c.output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains("warning:")
            && err.contains("model.encoder.layers.1.fc1.weight")
            && err.contains("3 of 8192")
            && err.contains("model.encoder.layer_norm.weight")
            && err.contains("2 of 64"),
        "{err}"
    );

    // compress refuses the package that holds them, naming the ops and counts.
    let comp = tmp.path().join("c.mlpackage");
    let mut c = common::milkit();
    c.args([
        "compress",
        "--quiet",
        "--palettize",
        "uniform",
        "--nbits",
        "8",
    ])
    .arg(&out)
    .arg("--out")
    .arg(&comp);
    let e = fails(c);
    assert!(
        e.contains("enc.mlpackage") && e.contains("op(s)") && e.contains("3 of 8192 values"),
        "{e}"
    );
    assert!(!comp.exists());
    let mut c = common::milkit();
    c.args([
        "compress",
        "--quiet",
        "--allow-nonfinite",
        "--palettize",
        "uniform",
        "--nbits",
        "8",
    ])
    .arg(&out)
    .arg("--out")
    .arg(&comp);
    let o = c.output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!err.contains("panicked"), "{err}");
    assert!(err.contains("warning:") && err.contains("op(s)"), "{err}");
}

#[test]
fn calibration_statistics_holding_non_finite_values_are_refused_with_the_count() {
    let tmp = tempfile::tempdir().unwrap();
    let m = tmp.path().join("m");
    micro_checkpoint(&m);
    let pkg = tmp.path().join("enc.mlpackage");
    assert!(export(&m, "encoder", &pkg).status().unwrap().success());
    let v: Vec<u8> = [1.0f32, f32::NAN, 2.0, f32::INFINITY, 0.5]
        .iter()
        .flat_map(|x| x.to_le_bytes())
        .collect();
    let view = safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![5], &v).unwrap();
    let stats = tmp.path().join("stats.safetensors");
    safetensors::serialize_to_file([("some_weight", view)], None, &stats).unwrap();
    let mut c = common::milkit();
    c.args([
        "compress",
        "--quiet",
        "--palettize",
        "kmeans",
        "--nbits",
        "4",
        "--calibration",
    ])
    .arg(&stats)
    .arg(&pkg)
    .arg("--out")
    .arg(tmp.path().join("c.mlpackage"));
    let e = fails(c);
    assert!(
        e.contains("stats.safetensors")
            && e.contains("some_weight")
            && e.contains("2 non-finite second moment(s)"),
        "{e}"
    );
}

#[test]
fn a_closed_stdout_ends_the_process_quietly() {
    use std::os::unix::process::ExitStatusExt;
    let tmp = tempfile::tempdir().unwrap();
    let pkg = small_package(tmp.path());
    for args in [
        vec!["inspect", "--json"],
        vec!["inspect", "--mil"],
        vec!["verify", "--json"],
    ] {
        // A pipe whose reading end is closed before the child starts (as `| head -c 0`
        // would be by the time it prints), so its first write meets a closed stdout.
        let mut fds = [0i32; 2];
        // SAFETY: pipe() fills two fresh descriptors; the read end is closed at once and the
        // write end is owned by the Stdio from here on.
        let stdout = unsafe {
            assert_eq!(libc::pipe(fds.as_mut_ptr()), 0);
            libc::close(fds[0]);
            <Stdio as std::os::fd::FromRawFd>::from_raw_fd(fds[1])
        };
        let child = common::milkit()
            .args(&args)
            .arg(&pkg)
            .stdout(stdout)
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let o = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            !err.contains("panicked") && !err.contains("Broken pipe"),
            "{args:?}: {err}"
        );
        // Killed by SIGPIPE like `cat` or `ls` (the shell shows 141).
        assert_eq!(
            o.status.signal(),
            Some(libc::SIGPIPE),
            "{args:?}: {:?} {err}",
            o.status
        );
    }
    // A reader that takes a few bytes and goes, through a real shell pipe.
    let o = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "{} inspect '{}' --json | head -c 10 >/dev/null; echo \"${{PIPESTATUS:-}}\"",
            env!("CARGO_BIN_EXE_milkit"),
            pkg.display()
        ))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success() && !err.contains("panicked"), "{err}");
}

#[test]
fn runtime_inputs_of_the_wrong_shape_are_refused_naming_the_input_and_file() {
    let tmp = tempfile::tempdir().unwrap();
    let mut b = Builder::new(Opset::Ios17);
    let n = b.input("ids", ValueType::tensor(DType::I32, &[2]));
    let y = b
        .op1(
            "add",
            "y",
            vec![("x", In::V(n)), ("y", In::C(Value::i32s(&[1])))],
        )
        .unwrap();
    let (inputs, block) = b.finish(&[(y, "y")]).unwrap();
    let pkg = save(
        tmp.path().join("ids.mlpackage"),
        inputs,
        block,
        vec![Feature::new("ids", ArrayDType::I32, &[2])],
        vec![Feature::new("y", ArrayDType::I32, &[2])],
    );
    let cpu = candle_core::Device::Cpu;
    let wrong_shape = tmp.path().join("s.npy");
    milkit::runtime::io::write_npy(
        &wrong_shape,
        &candle_core::Tensor::new(&[1i64, 2, 3], &cpu).unwrap(),
    )
    .unwrap();
    let mut c = common::milkit();
    c.arg("run")
        .arg(&pkg)
        .arg("--input")
        .arg(format!("ids={}", wrong_shape.display()))
        .arg("--out")
        .arg(tmp.path().join("out"));
    let e = fails(c);
    assert!(
        e.contains("`ids`")
            && e.contains(&*wrong_shape.to_string_lossy())
            && e.contains("shape [3]"),
        "{e}"
    );
}

#[test]
fn packages_reading_undefined_or_cyclic_values_are_refused_at_load() {
    let tmp = tempfile::tempdir().unwrap();
    let load = |pkg: &Path| format!("{:#}", milkit::runtime::Session::load(pkg).err().unwrap());
    let rebind = |b: &mut milkit::proto::mil::Block, op: &str, param: &str, to: &str| {
        use milkit::proto::mil::argument::binding::Binding;
        let o = b.operations.iter_mut().find(|o| o.r#type == op).unwrap();
        o.inputs.get_mut(param).unwrap().arguments[0].binding = Some(Binding::Name(to.into()));
    };
    // `mul` reads a value no op defines.
    let pkg = small_package(&tmp.path().join("undefined"));
    edit_program(&pkg, |b| rebind(b, "mul", "x", "nowhere"));
    let e = load(&pkg);
    assert!(e.contains("model.mlmodel") && e.contains("nowhere"), "{e}");
    // `mul` reads the output of `add`, which reads `mul`: a cycle, refused as a use before
    // definition.
    let pkg = small_package(&tmp.path().join("cycle"));
    edit_program(&pkg, |b| rebind(b, "mul", "x", "y"));
    let e = load(&pkg);
    assert!(e.contains("model.mlmodel") && e.contains("`y`"), "{e}");
    // An op reading its own output.
    let pkg = small_package(&tmp.path().join("self"));
    edit_program(&pkg, |b| rebind(b, "mul", "x", "xm"));
    let e = load(&pkg);
    assert!(e.contains("`xm`"), "{e}");
    // A nested block on an op that takes none (only cond and while_loop do; a loop that
    // never ends is stopped at its iteration bound, see tests/control_flow.rs).
    let pkg = small_package(&tmp.path().join("nested"));
    edit_program(&pkg, |b| {
        let inner = b.clone();
        let o = b.operations.iter_mut().find(|o| o.r#type == "mul").unwrap();
        o.blocks.push(inner);
    });
    let e = load(&pkg);
    assert!(
        e.contains("model.mlmodel")
            && e.contains("`mul`")
            && e.contains("only control flow ops (cond, while_loop) take blocks"),
        "{e}"
    );
}

/// out = x + fill(shape, 1) (fp16 [n, n]).
fn fill_package(dir: &Path, n: usize) -> PathBuf {
    let mut b = Builder::new(Opset::Ios17);
    let x = b.input("x", ValueType::tensor(DType::F16, &[1]));
    let f = b
        .op1(
            "fill",
            "big",
            vec![
                ("shape", In::C(Value::i32s(&[n as i32, n as i32]))),
                ("value", In::C(Value::f16_scalar(1.0))),
            ],
        )
        .unwrap();
    let y = b
        .op1("add", "y", vec![("x", In::V(x)), ("y", In::V(f))])
        .unwrap();
    let (inputs, block) = b.finish(&[(y, "y")]).unwrap();
    save(
        dir.join(format!("fill{n}.mlpackage")),
        inputs,
        block,
        vec![Feature::new("x", ArrayDType::F16, &[1])],
        vec![Feature::new("y", ArrayDType::F16, &[n, n])],
    )
}

#[test]
fn run_refuses_packages_over_the_memory_cap_with_a_clear_message() {
    let tmp = tempfile::tempdir().unwrap();
    let cpu = candle_core::Device::Cpu;
    let x = tmp.path().join("x.npy");
    milkit::runtime::io::write_npy(&x, &candle_core::Tensor::new(&[2.0f32], &cpu).unwrap())
        .unwrap();
    let run_with = |pkg: &Path, cap: Option<&str>| {
        let mut c = common::milkit();
        c.arg("run")
            .arg(pkg)
            .arg("--quiet")
            .arg("--input")
            .arg(format!("x={}", x.display()))
            .arg("--out")
            .arg(tmp.path().join("out"));
        if let Some(cap) = cap {
            c.args(["--max-memory", cap]);
        }
        c
    };
    // 2^40 fp16 elements (2 TiB): over the default cap (physical memory) on any machine
    // these tests run on; refused before the constant is folded.
    let huge = fill_package(tmp.path(), 1 << 20);
    let e = fails(run_with(&huge, None));
    assert!(
        e.contains("`big`") && e.contains("2048.0 GiB") && e.contains("memory cap"),
        "{e}"
    );
    // 1024 × 1024 fp16 = 2 MiB for the constant, 2 MiB for the output.
    let small = fill_package(tmp.path(), 1024);
    let e = fails(run_with(&small, Some("3M")));
    assert!(
        e.contains("over the memory cap of 3.0 MiB") && e.contains("`y`"),
        "{e}"
    );
    let e = fails(run_with(&small, Some("1M")));
    assert!(
        e.contains("`big`") && e.contains("memory cap of 1.0 MiB"),
        "{e}"
    );
    let o = run_with(&small, Some("5M")).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let y =
        milkit::runtime::io::read_tensor(&tmp.path().join("out/y.npy").to_string_lossy()).unwrap();
    assert_eq!(y.dims(), &[1024, 1024]);
    let v: Vec<f32> = y
        .to_dtype(candle_core::DType::F32)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap();
    assert!(v.iter().all(|&a| a == 3.0));
    // A malformed size is refused by the argument parser.
    let o = run_with(&small, Some("12Q")).output().unwrap();
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("unknown size suffix"));
}

#[test]
fn exit_status_on_failure_is_two_and_nothing_is_written() {
    // A missing checkpoint directory and a directory given as a weights file.
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("x.mlpackage");
    let e = fails(export(&tmp.path().join("nope"), "encoder", &out));
    assert!(e.contains("does not exist"), "{e}");
    let o = run(&["inspect"], &[tmp.path()]);
    assert_eq!(o.status.code(), Some(2));
    assert!(!out.exists());
}

/// One tensor of a hand-written PyTorch checkpoint: name, storage class, storage key, storage
/// element count, element offset and shape as the pickle declares them.
struct PthTensor<'a> {
    name: &'a str,
    class: &'a str,
    key: &'a str,
    numel: u64,
    offset: u64,
    shape: &'a [u64],
}

/// The pickle (protocol 2) torch.save writes for a state dict: an OrderedDict of
/// `torch._utils._rebuild_tensor_v2(storage, offset, shape, stride, False, OrderedDict())`,
/// each storage a persistent id `("storage", torch.CLASS, key, "cpu", numel)`.
fn state_dict_pickle(tensors: &[PthTensor]) -> Vec<u8> {
    fn text(out: &mut Vec<u8>, s: &str) {
        out.push(b'X');
        out.extend_from_slice(&(s.len() as u32).to_le_bytes());
        out.extend_from_slice(s.as_bytes());
    }
    fn int(out: &mut Vec<u8>, v: u64) {
        if v <= i32::MAX as u64 {
            out.push(b'J');
            out.extend_from_slice(&(v as i32).to_le_bytes());
        } else if v < 1 << 63 {
            // LONG1: little-endian two's complement.
            out.extend_from_slice(&[0x8a, 8]);
            out.extend_from_slice(&v.to_le_bytes());
        } else {
            // 9 bytes, so that the top bit is clear (as Python writes it).
            out.extend_from_slice(&[0x8a, 9]);
            out.extend_from_slice(&v.to_le_bytes());
            out.push(0);
        }
    }
    fn ordered_dict(out: &mut Vec<u8>) {
        out.extend_from_slice(b"ccollections\nOrderedDict\n)R");
    }
    let mut p = vec![0x80, 2];
    ordered_dict(&mut p);
    p.push(b'(');
    for t in tensors {
        text(&mut p, t.name);
        p.extend_from_slice(b"ctorch._utils\n_rebuild_tensor_v2\n(");
        p.push(b'(');
        text(&mut p, "storage");
        p.extend_from_slice(format!("ctorch\n{}\n", t.class).as_bytes());
        text(&mut p, t.key);
        text(&mut p, "cpu");
        int(&mut p, t.numel);
        p.extend_from_slice(b"tQ");
        int(&mut p, t.offset);
        p.push(b'(');
        for &d in t.shape {
            int(&mut p, d);
        }
        p.push(b't');
        p.push(b'(');
        let mut stride = 1u64;
        let mut strides = Vec::new();
        for &d in t.shape.iter().rev() {
            // candle takes only 32-bit strides; past that the (then wrong) stride is capped.
            strides.push(stride.min(i32::MAX as u64));
            stride = stride.saturating_mul(d);
        }
        for s in strides.iter().rev() {
            int(&mut p, *s);
        }
        p.push(b't');
        p.push(0x89); // NEWFALSE
        ordered_dict(&mut p);
        p.extend_from_slice(b"tR");
    }
    p.extend_from_slice(b"u.");
    p
}

/// A `pytorch_model.bin` zip: `archive/data.pkl` from `tensors`, and `storages` as
/// `archive/data/KEY` entries, stored as torch.save stores them (uncompressed).
fn raw_pth(path: &Path, tensors: &[PthTensor], storages: &[(&str, &[u8])]) {
    use std::io::Write;
    let mut z = zip::ZipWriter::new(std::fs::File::create(path).unwrap());
    let opts =
        zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
    z.start_file("archive/data.pkl", opts).unwrap();
    z.write_all(&state_dict_pickle(tensors)).unwrap();
    for (key, bytes) in storages {
        z.start_file(format!("archive/data/{key}"), opts).unwrap();
        z.write_all(bytes).unwrap();
    }
    z.start_file("archive/version", opts).unwrap();
    z.write_all(b"3\n").unwrap();
    z.finish().unwrap();
}

#[test]
fn pytorch_checkpoints_whose_shapes_or_offsets_exceed_their_storage_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let bin = tmp.path().join("pytorch_model.bin");
    let tensor = |numel, offset, shape| PthTensor {
        name: "model.encoder.conv1.bias",
        class: "HalfStorage",
        key: "0",
        numel,
        offset,
        shape,
    };
    let open_err = |t: PthTensor| -> String {
        raw_pth(&bin, &[t], &[("0", &[0u8; 8])]);
        match milkit::whisper::weights::WhisperWeights::open_file(&bin) {
            Ok(_) => panic!("a checkpoint with an impossible tensor was accepted"),
            Err(e) => format!("{e:#}"),
        }
    };
    // The well-formed file (4 fp16 values in 8 bytes) opens and reads back.
    raw_pth(
        &bin,
        &[tensor(4, 0, &[2, 2])],
        &[("0", &[0, 60, 0, 188, 0, 0, 0, 64])],
    );
    let w = milkit::whisper::weights::WhisperWeights::open_file(&bin).unwrap();
    let t = w.tensor_f16("model.encoder.conv1.bias").unwrap();
    assert_eq!(t.shape, vec![2, 2]);
    assert_eq!(t.to_f32_vec(), vec![1.0, -1.0, 0.0, 2.0]);
    // A billion-element shape in an 8-byte storage: refused before candle allocates 2 GB.
    let e = open_err(tensor(4, 0, &[1 << 15, 1 << 15]));
    assert!(
        e.contains("pytorch_model.bin")
            && e.contains("model.encoder.conv1.bias")
            && e.contains("archive/data/0")
            && e.contains("holds 8 bytes"),
        "{e}"
    );
    // An element count that overflows 64 bits (2^120; candle takes 32-bit dims only).
    let e = open_err(tensor(4, 0, &[1 << 30, 1 << 30, 1 << 30, 1 << 30]));
    assert!(
        e.contains("model.encoder.conv1.bias") && e.contains("overflows"),
        "{e}"
    );
    // An offset past the storage's end.
    let e = open_err(tensor(4, 3, &[2]));
    assert!(
        e.contains("model.encoder.conv1.bias") && e.contains("byte offset 6"),
        "{e}"
    );
    // A 9-byte integer, which overflows candle's pickle reader: an error, not a panic.
    let e = open_err(tensor(u64::MAX, 0, &[2]));
    assert!(
        e.contains("pytorch_model.bin") && e.contains("malformed pickle"),
        "{e}"
    );
    // A storage the archive does not have.
    let e = open_err(PthTensor {
        key: "7",
        ..tensor(4, 0, &[2])
    });
    assert!(
        e.contains("model.encoder.conv1.bias") && e.contains("archive/data/7"),
        "{e}"
    );
}

/// `big = fill(shape, 1.0)` (fp16, shape fed at run time, so of unknown size at load), then
/// `y = big + big`: a program whose memory only a run can count.
fn run_time_fill_session(cap: u64) -> milkit::runtime::Session {
    let mut b = Builder::new(Opset::Ios17);
    let shape = b.input("shape", ValueType::tensor(DType::I32, &[2]));
    let big = b
        .op1(
            "fill",
            "big",
            vec![
                ("shape", In::V(shape)),
                ("value", In::C(Value::f16_scalar(1.0))),
            ],
        )
        .unwrap();
    let y = b
        .op1(
            "add",
            "y",
            vec![("x", In::V(big.clone())), ("y", In::V(big))],
        )
        .unwrap();
    let (inputs, block) = b.finish(&[(y, "y")]).unwrap();
    let m = Model::single(Opset::Ios17, inputs, block, Description::default());
    let opts = milkit::runtime::Options {
        max_memory: Some(cap),
        ..Default::default()
    };
    milkit::runtime::Session::from_model_with(m, &opts).unwrap()
}

#[test]
fn values_whose_shape_is_known_only_at_run_time_count_against_the_memory_cap() {
    let cpu = candle_core::Device::Cpu;
    let shape = |n: i64| candle_core::Tensor::new(&[n, n], &cpu).unwrap();
    // At load nothing is known (both values have shape [?, ?]): a 3 MiB cap loads.
    let mut s = run_time_fill_session(3 << 20);
    // 512 × 512 fp16: 0.5 MiB each for `big` and `y`, within the cap.
    let out = s.predict(&[("shape", shape(512))]).unwrap();
    assert_eq!(out[0].1.dims(), &[512, 512]);
    let v: Vec<f32> = out[0]
        .1
        .to_dtype(candle_core::DType::F32)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap();
    assert!(v.iter().all(|&a| a == 2.0));
    // 1024 × 1024: `big` alone is 2 MiB and fits; `y` adds 2 MiB while `big` is live (4 MiB
    // in all), over the cap: refused naming `y`, with the run-time sizes.
    let e = format!("{:#}", s.predict(&[("shape", shape(1024))]).unwrap_err());
    assert!(
        e.contains("op `y` (add)")
            && e.contains("run-time shape take 2.0 MiB")
            && e.contains("the run needs 4.0 MiB")
            && e.contains("over the memory cap of 3.0 MiB"),
        "{e}"
    );
    // 2048 × 2048: `big` (8 MiB) is already over, and the error names it.
    let e = format!("{:#}", s.predict(&[("shape", shape(2048))]).unwrap_err());
    assert!(
        e.contains("op `big` (fill)") && e.contains("8.0 MiB"),
        "{e}"
    );
    // The session is still usable after a refused run.
    assert!(s.predict(&[("shape", shape(256))]).is_ok());
}
