//! Checkpoint loading and synthetic checkpoints: the real whisper-tiny.en fixture, synthetic
//! checkpoints in every dtype, sharded and PyTorch-zip checkpoints, and the error messages for
//! broken ones.

use half::{bf16, f16};
use milkit::whisper::config::{GenerationConfig, Preset, WhisperConfig};
use milkit::whisper::synth::{synthesize, synthesize_with, tensor_list, SynthDType, SynthOptions};
use milkit::whisper::weights::{Component, StoredDType, WhisperWeights};
use safetensors::tensor::TensorView;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};

mod common;
use common::fixtures;
#[path = "weights/errors.rs"]
mod errors;
#[path = "weights/torch_file.rs"]
mod torch_file;
use torch_file::{state_dict_pickle, write_zip, Pickled};

/// A tiny-shaped but much smaller model, for the error cases.
use common::micro_config as micro;

fn opts(seed: u64, dtype: SynthDType) -> SynthOptions {
    SynthOptions {
        seed,
        dtype,
        progress: false,
        force: false,
    }
}

fn synth_micro(dir: &Path, dtype: SynthDType) {
    synthesize_with(&micro(), None, dir, &opts(7, dtype)).unwrap();
}

/// Parses a safetensors header by hand: name → (dtype, shape, absolute byte range).
fn read_header(path: &Path) -> BTreeMap<String, (String, Vec<usize>, std::ops::Range<usize>)> {
    let bytes = std::fs::read(path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let json: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let mut out = BTreeMap::new();
    for (name, t) in json.as_object().unwrap() {
        if name == "__metadata__" {
            continue;
        }
        let dtype = t["dtype"].as_str().unwrap().to_string();
        let shape = t["shape"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as usize);
        let off = t["data_offsets"].as_array().unwrap();
        let (s, e) = (
            off[0].as_u64().unwrap() as usize,
            off[1].as_u64().unwrap() as usize,
        );
        out.insert(name.clone(), (dtype, shape.collect(), 8 + n + s..8 + n + e));
    }
    out
}

fn err_text<T>(r: anyhow::Result<T>) -> String {
    match r {
        Ok(_) => panic!("expected an error"),
        Err(e) => format!("{e:#}"),
    }
}

#[test]
fn real_tiny_en_matches_expected_tensor_list() {
    let Some(fx) = fixtures() else { return };
    let dir = fx.join("models/whisper-tiny.en");
    let (cfg, w) = WhisperWeights::open(&dir).unwrap();
    assert_eq!(
        (cfg.d_model, cfg.vocab_size, cfg.num_mel_bins),
        (384, 51864, 80)
    );
    w.check(&cfg, Component::Encoder).unwrap();
    w.check(&cfg, Component::Decoder).unwrap();

    // The file itself is the reference: the expected lists must cover exactly its tensors.
    let header = read_header(&dir.join("model.safetensors"));
    let mut expected: Vec<(String, Vec<usize>)> =
        WhisperWeights::expected(&cfg, Component::Encoder);
    expected.extend(WhisperWeights::expected(&cfg, Component::Decoder));
    let names: HashSet<&str> = expected.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names.len(),
        expected.len(),
        "duplicate names in the expected lists"
    );
    for (name, shape) in &expected {
        let (_, file_shape, _) = header
            .get(name)
            .unwrap_or_else(|| panic!("{name} not in file"));
        assert_eq!(file_shape, shape, "{name}");
        assert_eq!(w.shape(name), Some(shape.as_slice()));
    }
    for name in header.keys() {
        assert!(
            names.contains(name.as_str()),
            "{name} in the file but not expected"
        );
    }
    assert_eq!(w.names().len(), header.len());

    // fp16 tensors come back as the file's own bytes.
    let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
    for name in [
        "model.encoder.conv1.weight",
        "model.decoder.layers.3.fc2.bias",
    ] {
        let t = w.tensor_f16(name).unwrap();
        assert_eq!(&t.data[..], &bytes[header[name].2.clone()]);
        assert_eq!(t.data.len(), t.numel() * 2);
        // Releasing the pages must not change what a live tensor reads.
        w.release(name);
        assert_eq!(&t.data[..], &bytes[header[name].2.clone()]);
    }
    let gen = GenerationConfig::from_dir(&dir).unwrap().unwrap();
    gen.validate(&cfg).unwrap();
    assert_eq!(gen.no_timestamps_token_id, Some(50362));
}

#[test]
fn synthetic_tiny_in_every_dtype_loads_and_converts_exactly() {
    let tmp = tempfile::tempdir().unwrap();
    let dirs: Vec<(SynthDType, PathBuf)> = [SynthDType::F16, SynthDType::F32, SynthDType::BF16]
        .into_iter()
        .map(|d| {
            let dir = tmp.path().join(format!("{d:?}"));
            synthesize(Preset::Tiny, &dir, 11, d, false, false).unwrap();
            (d, dir)
        })
        .collect();
    let opened: Vec<_> = dirs
        .iter()
        .map(|(_, d)| WhisperWeights::open(d).unwrap())
        .collect();
    for (cfg, w) in &opened {
        assert_eq!(*cfg, Preset::Tiny.config());
        w.check(cfg, Component::Encoder).unwrap();
        w.check(cfg, Component::Decoder).unwrap();
        assert!(
            !w.has("proj_out.weight"),
            "tied proj_out must not be written"
        );
    }
    let (cfg, w16) = &opened[0];
    let (_, w32) = &opened[1];
    let (_, wbf) = &opened[2];
    assert_eq!(
        w32.stored_dtype("model.encoder.conv1.bias"),
        Some(&StoredDType::F32)
    );
    assert_eq!(
        wbf.stored_dtype("model.encoder.conv1.bias"),
        Some(&StoredDType::BF16)
    );
    let f32_file = std::fs::read(dirs[1].1.join("model.safetensors")).unwrap();
    let f32_header = read_header(&dirs[1].1.join("model.safetensors"));
    let mut all = WhisperWeights::expected(cfg, Component::Encoder);
    all.extend(WhisperWeights::expected(cfg, Component::Decoder));
    for (name, shape) in &all {
        // The same seed gives the same f32 values; f16 and bf16 files hold their roundings.
        let raw: Vec<f32> = f32_file[f32_header[name].2.clone()]
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        let want16: Vec<f16> = raw.iter().map(|&v| f16::from_f32(v)).collect();
        let want_bf: Vec<f16> = raw
            .iter()
            .map(|&v| f16::from_f32(bf16::from_f32(v).to_f32()))
            .collect();
        let t16 = w16.tensor_f16(name).unwrap();
        let t32 = w32.tensor_f16(name).unwrap();
        let tbf = wbf.tensor_f16(name).unwrap();
        for t in [&t16, &t32, &tbf] {
            assert_eq!(&t.shape, shape, "{name}");
        }
        assert_eq!(t16.data.to_f16_vec(), want16, "{name} (f16 file)");
        assert_eq!(t32.data.to_f16_vec(), want16, "{name} (f32 file converted)");
        assert_eq!(
            tbf.data.to_f16_vec(),
            want_bf,
            "{name} (bf16 file converted)"
        );
    }
}

#[test]
fn f32_to_f16_is_exact_for_representable_values_and_refuses_overflow() {
    let tmp = tempfile::tempdir().unwrap();
    // Normal, subnormal, extreme and negative values that fp16 represents exactly.
    let exact: Vec<f32> = (-1024..=1024)
        .map(|k| k as f32 / 64.0)
        .chain([
            65504.0,
            -65504.0,
            2f32.powi(-24),
            2f32.powi(-14),
            0.0,
            -0.0,
            1.0 + 2f32.powi(-10),
        ])
        .collect();
    let big = [1.0f32, 1.0e6];
    let bytes_exact: Vec<u8> = exact.iter().flat_map(|v| v.to_le_bytes()).collect();
    let bytes_big: Vec<u8> = big.iter().flat_map(|v| v.to_le_bytes()).collect();
    let path = tmp.path().join("t.safetensors");
    let views = vec![
        (
            "exact",
            TensorView::new(safetensors::Dtype::F32, vec![exact.len()], &bytes_exact).unwrap(),
        ),
        (
            "big",
            TensorView::new(safetensors::Dtype::F32, vec![2], &bytes_big).unwrap(),
        ),
    ];
    safetensors::serialize_to_file(views, None, &path).unwrap();
    let w = WhisperWeights::open_file(&path).unwrap();
    let back = w.tensor_f16("exact").unwrap().to_f32_vec();
    assert_eq!(back.len(), exact.len());
    for (a, b) in exact.iter().zip(&back) {
        assert_eq!(a.to_bits(), b.to_bits(), "{a} came back as {b}");
    }
    let e = err_text(w.tensor_f16("big"));
    assert!(
        e.contains("overflows fp16") && e.contains("big") && e.contains("t.safetensors"),
        "{e}"
    );
    let e = err_text(w.tensor_f16("nope"));
    assert!(e.contains("nope") && e.contains("t.safetensors"), "{e}");
}

#[test]
fn synthesis_is_deterministic_and_non_degenerate() {
    let tmp = tempfile::tempdir().unwrap();
    let (a, b, c) = (
        tmp.path().join("a"),
        tmp.path().join("b"),
        tmp.path().join("c"),
    );
    synthesize(Preset::Tiny, &a, 5, SynthDType::F16, false, false).unwrap();
    // One thread instead of many must not change a byte.
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    pool.install(|| synthesize(Preset::Tiny, &b, 5, SynthDType::F16, false, false))
        .unwrap();
    synthesize(Preset::Tiny, &c, 6, SynthDType::F16, false, false).unwrap();
    let read = |d: &Path| std::fs::read(d.join("model.safetensors")).unwrap();
    let (fa, fb, fc) = (read(&a), read(&b), read(&c));
    assert!(fa == fb, "same seed, different bytes");
    for name in [
        "config.json",
        "generation_config.json",
        "preprocessor_config.json",
    ] {
        assert_eq!(
            std::fs::read(a.join(name)).unwrap(),
            std::fs::read(b.join(name)).unwrap()
        );
    }
    assert_eq!(fa.len(), fc.len());
    assert!(fa != fc, "different seeds, same bytes");

    let (cfg, w) = WhisperWeights::open(&a).unwrap();
    let mut seen = HashSet::new();
    for (name, shape) in tensor_list(&cfg) {
        let v = w.tensor_f16(&name).unwrap().to_f32_vec();
        assert!(v.iter().all(|x| x.is_finite()), "{name}");
        assert!(
            seen.insert(w.tensor_f16(&name).unwrap().data.to_vec()),
            "{name} repeats a tensor"
        );
        let n = v.len() as f64;
        let mean = v.iter().map(|&x| x as f64).sum::<f64>() / n;
        let std = (v.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / n).sqrt();
        assert!(std > 0.0, "{name} is constant");
        if name.ends_with("layer_norm.weight") {
            assert!(
                (mean - 1.0).abs() < 0.02 && (0.02..0.1).contains(&std),
                "{name} {mean} {std}"
            );
        } else if name.ends_with(".bias") {
            assert!(
                mean.abs() < 0.01 && (0.01..0.04).contains(&std),
                "{name} {mean} {std}"
            );
        } else if name.ends_with("embed_positions.weight") {
            // Row 0 of a sinusoid table: sin(0) = 0 in the first half, cos(0) = 1 in the second.
            let d = shape[1];
            let amp = if name.contains("decoder") { 0.05 } else { 1.0 };
            for (j, x) in v[..d].iter().enumerate() {
                let want = if j < d / 2 { 0.0 } else { amp };
                assert!((x - want).abs() < 0.05, "{name}[0,{j}] = {x}");
            }
        } else if shape.len() >= 2 && !name.contains("embed_tokens") {
            let fan_in: usize = shape[1..].iter().product();
            let want = 1.0 / (fan_in as f64).sqrt();
            assert!(mean.abs() < want * 0.05, "{name} mean {mean}");
            assert!(
                (std / want - 1.0).abs() < 0.05,
                "{name} std {std}, want {want}"
            );
        }
    }
    let gen = GenerationConfig::from_dir(&a).unwrap().unwrap();
    gen.validate(&cfg).unwrap();
    assert_eq!(
        gen,
        Preset::Tiny.generation_config(),
        "generation config round trip"
    );
    assert_eq!(
        gen.forced_decoder_ids,
        Some(vec![(1, None), (2, Some(50359))])
    );
    assert_eq!(gen.lang_to_id.as_ref().map(|m| m.len()), Some(99));
    assert_eq!(gen.lang_to_id.as_ref().unwrap()["<|en|>"], 50259);
    assert_eq!(gen.task_to_id.as_ref().unwrap()["transcribe"], 50359);
}

#[test]
fn sharded_checkpoint_loads_equal_to_unsharded() {
    let tmp = tempfile::tempdir().unwrap();
    let single = tmp.path().join("single");
    synthesize(Preset::Tiny, &single, 3, SynthDType::F16, false, false).unwrap();
    let sharded = tmp.path().join("sharded");
    std::fs::create_dir(&sharded).unwrap();
    std::fs::copy(single.join("config.json"), sharded.join("config.json")).unwrap();
    let (cfg, w) = WhisperWeights::open(&single).unwrap();
    let names = w.names();
    let tensors: Vec<_> = names
        .iter()
        .map(|n| (*n, w.tensor_f16(n).unwrap()))
        .collect();
    let mut weight_map = serde_json::Map::new();
    let half = tensors.len() / 2;
    for (i, part) in [&tensors[..half], &tensors[half..]].into_iter().enumerate() {
        let file = format!("model-0000{}-of-00002.safetensors", i + 1);
        let views: Vec<_> = part
            .iter()
            .map(|(n, t)| {
                weight_map.insert(n.to_string(), file.clone().into());
                (
                    *n,
                    TensorView::new(safetensors::Dtype::F16, t.shape.clone(), &t.data).unwrap(),
                )
            })
            .collect();
        safetensors::serialize_to_file(views, None, &sharded.join(&file)).unwrap();
    }
    let index = serde_json::json!({ "metadata": { "total_size": 0 }, "weight_map": weight_map });
    let index_path = sharded.join("model.safetensors.index.json");
    std::fs::write(&index_path, index.to_string()).unwrap();

    let (cfg2, w2) = WhisperWeights::open(&sharded).unwrap();
    assert_eq!(cfg, cfg2);
    assert_eq!(w2.origin(), index_path.as_path());
    assert_eq!(w2.names(), names);
    w2.check(&cfg2, Component::Encoder).unwrap();
    w2.check(&cfg2, Component::Decoder).unwrap();
    for (n, t) in &tensors {
        assert_eq!(&w2.tensor_f16(n).unwrap(), t, "{n}");
    }
    assert!(w2
        .file_of(names[0])
        .unwrap()
        .ends_with("model-00001-of-00002.safetensors"));
    assert!(w2
        .file_of(names[names.len() - 1])
        .unwrap()
        .ends_with("model-00002-of-00002.safetensors"));

    // An index that puts a tensor in the wrong shard is refused, naming the index.
    let mut bad = index.clone();
    bad["weight_map"][names[0]] = "model-00002-of-00002.safetensors".into();
    std::fs::write(&index_path, bad.to_string()).unwrap();
    let e = err_text(WhisperWeights::open(&sharded));
    assert!(
        e.contains("model.safetensors.index.json") && e.contains(names[0]),
        "{e}"
    );
}

#[test]
fn pytorch_zip_checkpoint_loads_like_safetensors() {
    let tmp = tempfile::tempdir().unwrap();
    let st = tmp.path().join("st");
    synth_micro(&st, SynthDType::F32);
    let (cfg, w) = WhisperWeights::open(&st).unwrap();
    let st_file = st.join("model.safetensors");
    let bytes = std::fs::read(&st_file).unwrap();
    let header = read_header(&st_file);

    // Half the tensors as FloatStorage, half as HalfStorage; the last two share one storage
    // at different offsets, as tied weights do in torch files.
    let mut entries = Vec::new();
    let mut dict = Vec::new();
    let names = w.names();
    let n_names = names.len();
    for (i, name) in names.iter().enumerate().take(n_names - 2) {
        let (_, shape, range) = &header[*name];
        let raw = &bytes[range.clone()];
        let numel = raw.len() / 4;
        let (class, data) = if i % 2 == 0 {
            ("FloatStorage", raw.to_vec())
        } else {
            let h: Vec<u8> = raw
                .chunks_exact(4)
                .flat_map(|c| {
                    f16::from_f32(f32::from_le_bytes(c.try_into().unwrap())).to_le_bytes()
                })
                .collect();
            ("HalfStorage", h)
        };
        entries.push((format!("archive/data/{i}"), data));
        let (name, key, shape) = (name.to_string(), i.to_string(), shape.clone());
        dict.push(Pickled {
            name,
            class,
            key,
            numel,
            offset: 0,
            shape,
        });
    }
    let (a, b) = (names[n_names - 2], names[n_names - 1]);
    let (ra, rb) = (header[a].2.clone(), header[b].2.clone());
    let mut shared = bytes[ra.clone()].to_vec();
    shared.extend_from_slice(&bytes[rb.clone()]);
    let total = shared.len() / 4;
    entries.push(("archive/data/shared".into(), shared));
    for (name, offset) in [(a, 0), (b, ra.len() / 4)] {
        dict.push(Pickled {
            name: name.to_string(),
            class: "FloatStorage",
            key: "shared".into(),
            numel: total,
            offset,
            shape: header[name].1.clone(),
        });
    }
    entries.insert(0, ("archive/data.pkl".into(), state_dict_pickle(&dict)));
    entries.push(("archive/version".into(), b"3\n".to_vec()));

    let pt = tmp.path().join("pt");
    std::fs::create_dir(&pt).unwrap();
    std::fs::copy(st.join("config.json"), pt.join("config.json")).unwrap();
    write_zip(&pt.join("pytorch_model.bin"), &entries);

    let (cfg2, w2) = WhisperWeights::open(&pt).unwrap();
    assert_eq!(cfg, cfg2);
    assert_eq!(w2.names(), names);
    w2.check(&cfg2, Component::Encoder).unwrap();
    w2.check(&cfg2, Component::Decoder).unwrap();
    for (i, name) in names.iter().enumerate() {
        let want = w.tensor_f16(name).unwrap();
        let got = w2.tensor_f16(name).unwrap();
        assert_eq!(got, want, "{name}");
        let stored = if i % 2 == 1 && i < n_names - 2 {
            StoredDType::F16
        } else {
            StoredDType::F32
        };
        assert_eq!(w2.stored_dtype(name), Some(&stored), "{name}");
    }

    // A corrupt .bin is refused with a message naming it.
    std::fs::write(
        pt.join("pytorch_model.bin"),
        b"PK\x03\x04 definitely not a zip",
    )
    .unwrap();
    let e = err_text(WhisperWeights::open(&pt));
    assert!(
        e.contains("pytorch_model.bin") && e.contains("PyTorch"),
        "{e}"
    );
}

#[test]
fn presets_have_the_released_dimensions() {
    // d_model, encoder layers, decoder layers, heads, ffn, mel bins, vocabulary.
    let dims: HashMap<Preset, [usize; 7]> = [
        (Preset::Tiny, [384, 4, 4, 6, 1536, 80, 51865]),
        (Preset::Base, [512, 6, 6, 8, 2048, 80, 51865]),
        (Preset::Small, [768, 12, 12, 12, 3072, 80, 51865]),
        (Preset::Medium, [1024, 24, 24, 16, 4096, 80, 51865]),
        (Preset::LargeV3, [1280, 32, 32, 20, 5120, 128, 51866]),
        (Preset::LargeV3Turbo, [1280, 32, 4, 20, 5120, 128, 51866]),
        (Preset::DistilLargeV3, [1280, 32, 2, 20, 5120, 128, 51866]),
    ]
    .into_iter()
    .collect();
    for p in Preset::ALL {
        let c = p.config();
        let d = [
            c.d_model,
            c.encoder_layers,
            c.decoder_layers,
            c.encoder_attention_heads,
            c.encoder_ffn_dim,
            c.num_mel_bins,
            c.vocab_size,
        ];
        assert_eq!(d, dims[&p], "{p}");
        assert_eq!(c.decoder_attention_heads, c.encoder_attention_heads);
        assert_eq!(c.decoder_ffn_dim, c.encoder_ffn_dim);
        assert_eq!(
            (c.max_source_positions, c.max_target_positions),
            (1500, 448)
        );
        assert_eq!(p.name().parse::<Preset>().unwrap(), p);
        // The config survives its own JSON.
        assert_eq!(
            WhisperConfig::from_json_str(&c.to_json().to_string()).unwrap(),
            c
        );
        let g = p.generation_config();
        g.validate(&c).unwrap();
        let langs = g.lang_to_id.as_ref().unwrap();
        assert_eq!(langs.len(), if c.vocab_size == 51866 { 100 } else { 99 });
        // Languages fill the ids between <|startoftranscript|> and <|translate|>.
        let ids: HashSet<u32> = langs.values().copied().collect();
        let translate = g.task_to_id.as_ref().unwrap()["translate"];
        assert_eq!(ids, (c.decoder_start_token_id + 1..translate).collect());
        assert_eq!(g.no_timestamps_token_id, Some(translate + 5));
    }
    // 809 M parameters for large-v3-turbo, as published.
    let turbo: usize = tensor_list(&Preset::LargeV3Turbo.config())
        .iter()
        .map(|(_, s)| s.iter().product::<usize>())
        .sum();
    assert!((808_000_000..810_000_000).contains(&turbo), "{turbo}");
    assert!("huge".parse::<Preset>().is_err());
}

/// Peak resident memory of this process so far, in MiB (Linux), for the measurements below.
fn peak_rss_mib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace()
        .nth(1)?
        .parse::<u64>()
        .ok()
        .map(|kb| kb / 1024)
}

/// Measurement, not a check (run with `--ignored --nocapture`; needs ~2 GB of disk): time and
/// peak memory to synthesize large-v3-turbo, then to read its whole encoder as fp16 (what an
/// export does). Set MILKIT_SYNTH_DTYPE=f32 to measure the converting path, MILKIT_RELEASE=1
/// to release each tensor's pages after use.
#[test]
#[ignore]
fn measure_large_v3_turbo() {
    let dtype: SynthDType = std::env::var("MILKIT_SYNTH_DTYPE")
        .unwrap_or_else(|_| "f16".into())
        .parse()
        .unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("turbo");
    let t = std::time::Instant::now();
    synthesize(Preset::LargeV3Turbo, &dir, 1, dtype, false, false).unwrap();
    let size = std::fs::metadata(dir.join("model.safetensors"))
        .unwrap()
        .len();
    println!(
        "synthesize large-v3-turbo {dtype:?}: {:.2} s, {:.2} GB, peak RSS {:?} MiB",
        t.elapsed().as_secs_f64(),
        size as f64 / 1e9,
        peak_rss_mib()
    );
    let t = std::time::Instant::now();
    let (cfg, w) = WhisperWeights::open(&dir).unwrap();
    w.check(&cfg, Component::Encoder).unwrap();
    let mut sum = 0u64;
    let mut bytes = 0usize;
    for (name, _) in WhisperWeights::expected(&cfg, Component::Encoder) {
        let t = w.tensor_f16(&name).unwrap();
        // Touch every byte, as writing a weight blob would.
        sum = t.data.iter().fold(sum, |s, &b| s.wrapping_add(b as u64));
        bytes += t.data.len();
        if std::env::var_os("MILKIT_RELEASE").is_some() {
            w.release(&name);
        }
    }
    println!(
        "read encoder: {:.2} GB fp16 in {:.2} s (checksum {sum}), peak RSS {:?} MiB",
        bytes as f64 / 1e9,
        t.elapsed().as_secs_f64(),
        peak_rss_mib()
    );
}

#[test]
fn weights_can_be_shared_across_threads() {
    // Exporters read tensors from rayon workers.
    fn shareable<T: Send + Sync>() {}
    shareable::<WhisperWeights>();
    shareable::<milkit::whisper::weights::F16Tensor>();
}
