//! Error cases: refused output directories, incomplete checkpoints, broken safetensors files
//! and broken configs; each message must say what is wrong and name the file.

use super::*;

/// Rewrites `dir/model.safetensors` (fp16) through `edit`, which may drop or reshape tensors.
fn rewrite(dir: &Path, edit: impl Fn(&str, Vec<usize>) -> Option<Vec<usize>>) {
    let path = dir.join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    let header = read_header(&path);
    let mut kept: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
    for (name, (dtype, shape, range)) in header {
        assert_eq!(dtype, "F16");
        if let Some(new_shape) = edit(&name, shape) {
            let n: usize = new_shape.iter().product();
            let data = bytes[range].iter().copied().cycle().take(n * 2).collect();
            kept.push((name, new_shape, data));
        }
    }
    let views: Vec<(String, TensorView)> = kept
        .iter()
        .map(|(n, s, d)| {
            (
                n.clone(),
                TensorView::new(safetensors::Dtype::F16, s.clone(), d).unwrap(),
            )
        })
        .collect();
    safetensors::serialize_to_file(views, None, &path).unwrap();
}

#[test]
fn output_directory_is_refused_unless_forced() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("out");
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("keep.txt"), "x").unwrap();
    let e = err_text(synthesize_with(
        &micro(),
        None,
        &dir,
        &opts(1, SynthDType::F16),
    ));
    assert!(e.contains("not empty") && e.contains("out"), "{e}");
    assert!(dir.join("keep.txt").exists());
    // With a progress bar (hidden when stderr is not a terminal) to exercise that path.
    let forced = SynthOptions {
        force: true,
        progress: true,
        ..opts(1, SynthDType::F16)
    };
    synthesize_with(&micro(), None, &dir, &forced).unwrap();
    assert!(!dir.join("keep.txt").exists() && dir.join("model.safetensors").exists());
    // Nothing but the output is left in the parent (no staging directories).
    let left: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().collect();
    assert_eq!(left.len(), 1);
}

#[test]
fn check_reports_every_missing_and_misshapen_tensor() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("m");
    synth_micro(&dir, SynthDType::F16);
    rewrite(&dir, |name, shape| match name {
        "model.encoder.conv1.bias" | "model.encoder.layers.1.fc2.weight" => None,
        "model.encoder.conv2.weight" => Some(vec![64, 64, 2]),
        _ => Some(shape),
    });
    let (cfg, w) = WhisperWeights::open(&dir).unwrap();
    let e = err_text(w.check(&cfg, Component::Encoder));
    for part in [
        "model.safetensors",
        "encoder",
        "2 missing",
        "model.encoder.conv1.bias",
        "model.encoder.layers.1.fc2.weight",
        "model.encoder.conv2.weight has shape [64, 64, 2], expected [64, 64, 3]",
    ] {
        assert!(e.contains(part), "{part:?} not in: {e}");
    }
    // The decoder is untouched.
    w.check(&cfg, Component::Decoder).unwrap();
}

#[test]
fn broken_safetensors_files_give_clear_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("m");
    synth_micro(&dir, SynthDType::F16);
    let path = dir.join("model.safetensors");
    let full = std::fs::read(&path).unwrap();

    std::fs::write(&path, &full[..full.len() - 100]).unwrap();
    let e = err_text(WhisperWeights::open(&dir));
    assert!(
        e.contains("truncated") && e.contains(&path.display().to_string()),
        "{e}"
    );
    assert!(
        e.contains(&format!(
            "but the file holds {}",
            full.len() - 100 - 8 - header_len(&full)
        )),
        "{e}"
    );

    let mut long = (1u64 << 40).to_le_bytes().to_vec();
    long.extend_from_slice(b"{}");
    std::fs::write(&path, &long).unwrap();
    let e = err_text(WhisperWeights::open(&dir));
    assert!(
        e.contains("header length 1099511627776 is larger than the file (10 bytes)"),
        "{e}"
    );
    assert!(e.contains(&path.display().to_string()), "{e}");

    std::fs::write(&path, b"abc").unwrap();
    let e = err_text(WhisperWeights::open(&dir));
    assert!(
        e.contains("too short") && e.contains("model.safetensors"),
        "{e}"
    );
}

fn header_len(file: &[u8]) -> usize {
    u64::from_le_bytes(file[..8].try_into().unwrap()) as usize
}

#[test]
fn broken_configs_give_clear_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("m");
    synth_micro(&dir, SynthDType::F16);
    let config = dir.join("config.json");
    let good = std::fs::read_to_string(&config).unwrap();
    let shown = config.display().to_string();

    std::fs::write(&config, "{ \"d_model\": 64,").unwrap();
    let e = err_text(WhisperWeights::open(&dir));
    assert!(e.contains(&shown) && e.contains("malformed JSON"), "{e}");

    let mut json: serde_json::Value = serde_json::from_str(&good).unwrap();
    json.as_object_mut().unwrap().remove("encoder_ffn_dim");
    std::fs::write(&config, json.to_string()).unwrap();
    let e = err_text(WhisperWeights::open(&dir));
    assert!(
        e.contains(&shown) && e.contains("missing key \"encoder_ffn_dim\""),
        "{e}"
    );

    let mut json: serde_json::Value = serde_json::from_str(&good).unwrap();
    json["decoder_attention_heads"] = 5.into();
    std::fs::write(&config, json.to_string()).unwrap();
    let e = err_text(WhisperWeights::open(&dir));
    assert!(
        e.contains(&shown) && e.contains("not divisible by decoder_attention_heads 5"),
        "{e}"
    );

    let mut json: serde_json::Value = serde_json::from_str(&good).unwrap();
    json["activation_function"] = "relu".into();
    std::fs::write(&config, json.to_string()).unwrap();
    let e = err_text(WhisperWeights::open(&dir));
    assert!(e.contains("\"relu\" is not supported"), "{e}");

    std::fs::remove_file(&config).unwrap();
    let e = err_text(WhisperWeights::open(&dir));
    assert!(
        e.contains(&shown) && e.contains("missing config.json"),
        "{e}"
    );

    std::fs::write(dir.join("generation_config.json"), "[1,").unwrap();
    let e = err_text(GenerationConfig::from_dir(&dir));
    assert!(
        e.contains("generation_config.json") && e.contains("malformed JSON"),
        "{e}"
    );
}
