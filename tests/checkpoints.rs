//! Every Whisper checkpoint people convert (issue 16): vocabulary heads no group size
//! divides (padded in the graph, logits sliced back, bit for bit the unpadded head's),
//! synth checkpoints that are complete models folders (a real tokenizer.json, presets and
//! layer overrides, distil-large-v3), alignment heads past the decoder's layers, and
//! fine-tuned layouts (key prefixes, untied heads, dtypes, missing generation config or
//! tokenizer) rewritten from tiny.en by the tests themselves.

mod common;

use common::programs::{f32s, host};
use common::rng::Rng;
use milkit::convert::bundle::{write_whisperkit_folder, BundleOptions, Compression};
use milkit::convert::decoder_export::{export_decoder, DecoderExport};
use milkit::ir::{ArrayDType, Model, Opset};
use milkit::passes::compress::{Method, Selection};
use milkit::passes::lut::{LutConfig, LutGranularity, LutMode};
use milkit::runtime::{Session, Tensor};
use milkit::whisper::checkpoint::Checkpoint;
use milkit::whisper::config::{Preset, WhisperConfig};
use milkit::whisper::decoder::{CrossKv, MASK_HIDDEN};
use milkit::whisper::file_reads;
use milkit::whisper::head_pad::{pad_head_rows, PaddedHead, HEAD_PADDING_KEY};
use milkit::whisper::synth::{synthesize_with, SynthDType, SynthOptions};
use milkit::whisper::tokenizer::Tokenizer;
use std::path::{Path, PathBuf};
use std::process::Output;

fn opts() -> SynthOptions {
    SynthOptions {
        seed: 7,
        dtype: SynthDType::F16,
        progress: false,
        force: false,
    }
}

/// A micro multilingual checkpoint (d_model 64, 2 + 2 layers) with `vocab` tokens.
fn micro(dir: &Path, preset: Preset) -> PathBuf {
    let mut c = common::micro_config();
    let p = preset.config();
    c.vocab_size = p.vocab_size;
    c.suppress_tokens = p.suppress_tokens.clone();
    c.num_mel_bins = p.num_mel_bins;
    let mut g = preset.generation_config();
    g.alignment_heads = Some(vec![[1, 0], [1, 3]]);
    let out = dir.join(preset.name());
    synthesize_with(&c, Some(&g), &out, &opts()).unwrap();
    out
}

fn lut(g: usize) -> Method {
    Method::Palettize(LutConfig {
        nbits: 4,
        mode: LutMode::Kmeans,
        granularity: if g == 0 {
            LutGranularity::PerTensor
        } else {
            LutGranularity::PerGroupedChannel(g)
        },
        per_channel_scale: false,
        cluster_dim: 1,
    })
}

fn compress(m: &mut Model, method: Method) {
    Compression::new(method, Selection::default(), true)
        .apply(m)
        .unwrap();
}

/// One decoder step (cache I/O, cross-attention in graph) at position 2 with deterministic
/// caches and encoder output; the logits as f32 and their shape.
fn step(m: &Model) -> (Vec<f32>, Vec<usize>) {
    let mut s = Session::from_model(m.clone()).unwrap();
    let mut rng = Rng(11);
    let mut ins: Vec<(String, Tensor)> = vec![];
    for (name, ty) in s.inputs(None).unwrap() {
        let shape = ty.as_tensor().unwrap().fixed_shape().unwrap();
        let n: usize = shape.iter().product();
        let t = match name.as_str() {
            "input_ids" => Tensor::from_vec(vec![50300i32], 1, &candle_core::Device::Cpu).unwrap(),
            "cache_length" => Tensor::from_vec(vec![2i32], 1, &candle_core::Device::Cpu).unwrap(),
            "decoder_key_padding_mask" => {
                let v: Vec<f32> = (0..n)
                    .map(|j| if j <= 2 { 0.0 } else { MASK_HIDDEN })
                    .collect();
                f16(&v, &shape)
            }
            "kv_cache_update_mask" => {
                let v: Vec<f32> = (0..n).map(|j| (j == 2) as u8 as f32).collect();
                f16(&v, &shape)
            }
            _ => f16(&rng.vec(n), &shape),
        };
        ins.push((name, t));
    }
    let refs: Vec<(&str, Tensor)> = ins.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
    let out = s.predict(&refs).unwrap();
    let logits = &out.iter().find(|(n, _)| n == "logits").unwrap().1;
    (f32s(logits), logits.dims().to_vec())
}

fn f16(v: &[f32], shape: &[usize]) -> Tensor {
    host(v, shape).to_dtype(candle_core::DType::F16).unwrap()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn a_padded_head_computes_the_unpadded_heads_logits_bit_for_bit() {
    let dir = tempfile::tempdir().unwrap();
    for (preset, vocab) in [(Preset::Tiny, 51865usize), (Preset::LargeV3, 51866)] {
        let model = micro(dir.path(), preset);
        for chunks in [1, 4] {
            let o = DecoderExport {
                head_chunks: chunks,
                ..Default::default()
            };
            let plain =
                export_decoder(&Checkpoint::open(&model).unwrap(), &o, Opset::Ios18).unwrap();
            let mut padded = plain.clone();
            let done = pad_head_rows(&mut padded, 16).unwrap();
            // Every chunk whose rows 16 does not divide is padded to the next multiple.
            let per = vocab.div_ceil(chunks);
            let rows: Vec<usize> = (0..chunks).map(|c| per.min(vocab - c * per)).collect();
            let want: Vec<PaddedHead> = rows
                .iter()
                .enumerate()
                .filter(|(_, r)| *r % 16 != 0)
                .map(|(c, &r)| PaddedHead {
                    op: if chunks == 1 {
                        "lm_head".into()
                    } else {
                        format!("lm_head_{c}")
                    },
                    rows: r,
                    padded_rows: r.next_multiple_of(16),
                })
                .collect();
            assert_eq!(done, want, "vocab {vocab}, {chunks} chunks");
            assert!(padded.description.user_defined[HEAD_PADDING_KEY].contains("zero rows"));
            // The ABI is unchanged.
            assert_eq!(padded.description.outputs, plain.description.outputs);
            let (a, sa) = step(&plain);
            let (b, sb) = step(&padded);
            assert_eq!(sa, vec![1, 1, vocab]);
            assert_eq!(sb, sa);
            assert_eq!(
                bits(&a),
                bits(&b),
                "fp16 logits differ (vocab {vocab}, {chunks} chunks)"
            );
            // A second pass finds nothing left to pad.
            assert!(pad_head_rows(&mut padded, 16).unwrap().is_empty());
        }
        if vocab % 2 == 0 {
            // Tables per 2 rows divide 51,866: padding to 16 first leaves every group of real
            // rows as it was, so the palettized logits agree bit for bit too.
            let plain = export_decoder(
                &Checkpoint::open(&model).unwrap(),
                &Default::default(),
                Opset::Ios18,
            )
            .unwrap();
            let mut padded = plain.clone();
            pad_head_rows(&mut padded, 16).unwrap();
            let (mut p, mut q) = (plain.clone(), padded.clone());
            compress(&mut p, lut(2));
            compress(&mut q, lut(2));
            assert!(!p.description.user_defined.contains_key(HEAD_PADDING_KEY));
            let (a, _) = step(&p);
            let (b, _) = step(&q);
            assert_eq!(bits(&a), bits(&b), "LUT4 g2 logits differ");
            // Compressed logits are not the fp16 ones (the tables did something).
            let (f, _) = step(&plain);
            assert_ne!(bits(&a), bits(&f));
        }
    }
}

#[test]
fn grouped_palettization_pads_an_indivisible_head_by_itself() {
    let dir = tempfile::tempdir().unwrap();
    let model = micro(dir.path(), Preset::Tiny);
    for chunks in [1, 4] {
        let o = DecoderExport {
            head_chunks: chunks,
            ..Default::default()
        };
        let plain = export_decoder(&Checkpoint::open(&model).unwrap(), &o, Opset::Ios18).unwrap();
        let mut m = plain.clone();
        compress(&mut m, lut(16));
        let note = &m.description.user_defined[HEAD_PADDING_KEY];
        assert!(note.contains("51872") || chunks > 1, "{note}");
        // Every head op is compressed, none skipped.
        assert_eq!(common::count_ops(&m, "constexpr_lut_to_dense"), chunks);
        let (logits, shape) = step(&m);
        assert_eq!(shape, vec![1, 1, 51865]);
        // Against the fp16 head: close (4-bit tables), not equal.
        let (f, _) = step(&plain);
        let err: f64 = logits
            .iter()
            .zip(&f)
            .map(|(a, b)| f64::from(a - b).powi(2))
            .sum::<f64>()
            / f.iter().map(|b| f64::from(*b).powi(2)).sum::<f64>();
        assert!(
            err.sqrt() < 0.2 && err > 0.0,
            "relative error {}",
            err.sqrt()
        );
    }
    // Per-block int4 blocks the input axis (d_model), which needs no padding.
    let mut m = export_decoder(
        &Checkpoint::open(&model).unwrap(),
        &Default::default(),
        Opset::Ios18,
    )
    .unwrap();
    let q = Method::Quantize(milkit::passes::quant::QuantConfig {
        dtype: milkit::passes::quant::QuantDtype::Int4,
        granularity: milkit::passes::quant::QuantGranularity::PerBlock(32),
        symmetric: true,
    });
    compress(&mut m, q);
    assert!(!m.description.user_defined.contains_key(HEAD_PADDING_KEY));
    assert_eq!(step(&m).1, vec![1, 1, 51865]);
}

#[test]
fn a_chunked_head_compressed_in_two_passes_pads_each_chunk_once() {
    // Chunk 0 at 6 bits first, then the other chunks at 4: the second pass pads and
    // compresses only its own chunks and leaves the compressed chunk 0 alone.
    let dir = tempfile::tempdir().unwrap();
    let model = micro(dir.path(), Preset::Tiny);
    let (chunks, vocab) = (4usize, 51865usize);
    let o = DecoderExport {
        head_chunks: chunks,
        ..Default::default()
    };
    let plain = export_decoder(&Checkpoint::open(&model).unwrap(), &o, Opset::Ios18).unwrap();
    let mut m = plain.clone();
    let pass = |m: &mut Model, nbits: u32, ops: Vec<String>| {
        let method = Method::Palettize(LutConfig {
            nbits,
            mode: LutMode::Kmeans,
            granularity: LutGranularity::PerGroupedChannel(8),
            per_channel_scale: false,
            cluster_dim: 1,
        });
        let sel = Selection {
            op_types: vec!["conv".into()],
            op_names: ops,
            ..Selection::default()
        };
        Compression::new(method, sel, false).apply(m).unwrap();
    };
    pass(&mut m, 6, vec!["lm_head_0".into()]);
    pass(
        &mut m,
        4,
        (1..chunks).map(|c| format!("lm_head_{c}")).collect(),
    );
    assert_eq!(common::count_ops(&m, "constexpr_lut_to_dense"), chunks);
    // 51,865 = 3 × 12,967 + 12,964: every chunk is padded (to 12,968), each named once.
    let note = &m.description.user_defined[HEAD_PADDING_KEY];
    for c in 0..chunks {
        assert_eq!(note.matches(&format!("lm_head_{c}:")).count(), 1, "{note}");
    }
    let (logits, shape) = step(&m);
    assert_eq!(shape, vec![1, 1, vocab]);
    // Against the fp16 head, per chunk: a 6-bit table (64 entries) fits its rows far better
    // than a 4-bit one (16), so chunk 0's logits are much closer to fp16 than chunk 1's.
    let (f, _) = step(&plain);
    let per = vocab.div_ceil(chunks);
    let rel = |r: std::ops::Range<usize>| {
        let e: f64 = r.clone().map(|i| f64::from(logits[i] - f[i]).powi(2)).sum();
        let n: f64 = r.map(|i| f64::from(f[i]).powi(2)).sum();
        (e / n).sqrt()
    };
    let (six, four) = (rel(0..per), rel(per..2 * per));
    assert!(
        six > 0.0 && six < 0.5 * four,
        "chunk 0 (6 bits) {six}, chunk 1 (4 bits) {four}"
    );
}

fn run(args: &[&str]) -> Output {
    common::milkit().args(args).output().unwrap()
}

fn ok(o: &Output) -> String {
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(o.status.success(), "failed: {err}");
    err
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn synth_writes_a_tokenizer_of_the_vocabularys_layout() {
    for preset in [Preset::Tiny, Preset::LargeV3] {
        let cfg = preset.config();
        let gen = preset.generation_config();
        let j = milkit::whisper::synth_tokenizer::synth_tokenizer_json(&cfg, Some(&gen)).unwrap();
        let tok = Tokenizer::from_json(&j.to_string()).unwrap();
        assert_eq!(tok.len(), cfg.vocab_size);
        // Every special token sits where the generation config says.
        for (t, id) in gen.lang_to_id.as_ref().unwrap() {
            assert_eq!(tok.token_id(t), Some(*id), "{t}");
        }
        let tasks = gen.task_to_id.as_ref().unwrap();
        assert_eq!(tok.token_id("<|transcribe|>"), Some(tasks["transcribe"]));
        assert_eq!(tok.token_id("<|translate|>"), Some(tasks["translate"]));
        assert_eq!(tok.token_id("<|notimestamps|>"), gen.no_timestamps_token_id);
        assert_eq!(tok.token_id("<|startofprev|>"), gen.prev_sot_token_id);
        assert_eq!(tok.token_id("<|endoftext|>"), Some(cfg.eos_token_id));
        assert_eq!(
            tok.token_id("<|startoftranscript|>"),
            Some(cfg.decoder_start_token_id)
        );
        let last = (cfg.vocab_size - 1) as u32;
        assert_eq!(tok.decode(&[last], false), "<|30.00|>");
        // Every text id decodes to text, specials are skipped.
        assert_eq!(tok.decode(&[0, 1, 2], true), "!\"#");
        let text = tok.decode(&(0..cfg.eos_token_id).collect::<Vec<_>>(), true);
        assert!(!text.contains("<|"), "an unknown text id");
        assert_eq!(tok.decode(&[256, 257, 258], true), " aaaa ab");
        assert!(tok.is_special(cfg.eos_token_id) && !tok.is_special(cfg.eos_token_id - 1));
    }
    // The English-only layout (tiny.en): <|endoftext|> 50256 in the BPE vocabulary too,
    // <|notimestamps|> at 50362, as in the real file.
    if let Some(fx) = common::fixtures() {
        let dir = fx.join("models/whisper-tiny.en");
        let cfg = WhisperConfig::from_file(&dir.join("config.json")).unwrap();
        let real = Tokenizer::from_file(dir.join("tokenizer.json")).unwrap();
        let j = milkit::whisper::synth_tokenizer::synth_tokenizer_json(&cfg, None).unwrap();
        let tok = Tokenizer::from_json(&j.to_string()).unwrap();
        for t in [
            "<|endoftext|>",
            "<|startoftranscript|>",
            "<|en|>",
            "<|translate|>",
            "<|transcribe|>",
            "<|startoflm|>",
            "<|startofprev|>",
            "<|nocaptions|>",
            "<|notimestamps|>",
        ] {
            assert_eq!(tok.token_id(t), real.token_id(t), "{t}");
        }
        // The byte tokens are GPT-2's, in GPT-2's order.
        for id in 0..256u32 {
            assert_eq!(
                tok.decode(&[id], false),
                real.decode(&[id], false),
                "id {id}"
            );
        }
    }
    // A vocabulary without Whisper's layout: a clear error.
    let mut odd = common::micro_config();
    odd.vocab_size = 50400;
    let e = milkit::whisper::synth_tokenizer::synth_tokenizer_json(&odd, None).unwrap_err();
    assert!(
        format!("{e:#}").contains("no Whisper token layout"),
        "{e:#}"
    );
}

/// `synth` of a preset's layout, small: d_model 64, 4 heads, MLP 128, the given layers.
fn synth_small(out: &Path, preset: &str, enc: usize, dec: usize) {
    ok(&run(&[
        "synth",
        "--preset",
        preset,
        "--d-model",
        "64",
        "--heads",
        "4",
        "--ffn-dim",
        "128",
        "--encoder-layers",
        &enc.to_string(),
        "--decoder-layers",
        &dec.to_string(),
        "--quiet",
        "--out",
        s(out),
    ]));
}

fn jfk() -> Option<PathBuf> {
    common::fixtures().map(|f| f.join("audio/jfk.wav"))
}

#[test]
fn a_small_turbo_layout_exports_with_a_lut4_g16_head_and_transcribes() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("turbo");
    // Turbo's layout (128 mels, 51,866 tokens) with 2 + 4 layers of 4 heads: of turbo's
    // alignment heads [2,4] [2,11] [3,3] [3,6] [3,11] [3,14] only [3,3] exists.
    synth_small(&model, "large-v3-turbo", 2, 4);
    for f in ["tokenizer.json", "generation_config.json", "config.json"] {
        assert!(model.join(f).is_file(), "{f}");
    }
    let out = dir.path().join("folder");
    let err = ok(&run(&[
        "export",
        "--model",
        s(&model),
        "--component",
        "all",
        "--palettize",
        "kmeans",
        "--nbits",
        "4",
        "--granularity",
        "per-grouped-channel",
        "--group-size",
        "16",
        "--quiet",
        "--out",
        s(&out),
    ]));
    assert!(
        err.contains("dropping alignment heads [2, 4], [2, 11], [3, 6], [3, 11], [3, 14]")
            && err.contains("1 kept"),
        "{err}"
    );
    let g: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("generation_config.json")).unwrap())
            .unwrap();
    assert_eq!(g["alignment_heads"], serde_json::json!([[3, 3]]));
    let dec_pkg = out.join("TextDecoder.mlpackage");
    let dec = milkit::package::load_package(&dec_pkg).unwrap();
    let logits = dec
        .description
        .outputs
        .iter()
        .find(|f| f.name == "logits")
        .unwrap();
    assert_eq!(
        (logits.dtype, logits.shape.clone()),
        (ArrayDType::F16, vec![1, 1, 51866])
    );
    assert!(dec
        .description
        .outputs
        .iter()
        .any(|f| f.name == "alignment_heads_weights"));
    let v = run(&["verify", s(&dec_pkg)]);
    let text = String::from_utf8_lossy(&v.stdout);
    assert!(
        text.contains("vocabulary head padded: lm_head: 51866 rows + 6 zero rows = 51872"),
        "{text}"
    );
    for p in [
        "MelSpectrogram.mlpackage",
        "AudioEncoder.mlpackage",
        "TextDecoder.mlpackage",
        "TextDecoderContextPrefill.mlpackage",
    ] {
        common::validate(&out.join(p));
    }
    let Some(wav) = jfk() else { return };
    // The transcriber has no language detection yet: it needs the language slot of
    // forced_decoder_ids filled, so pick English as a user would.
    let mut g = g;
    let en = g["lang_to_id"]["<|en|>"].clone();
    g["forced_decoder_ids"][0][1] = en;
    std::fs::write(out.join("generation_config.json"), g.to_string()).unwrap();
    let t = run(&["transcribe", "--models", s(&out), s(&wav)]);
    ok(&t);
}

#[test]
fn distil_large_v3_drops_the_teachers_alignment_heads() {
    let c = Preset::DistilLargeV3.config();
    assert_eq!(
        (c.decoder_layers, c.encoder_layers, c.d_model),
        (2, 32, 1280)
    );
    let g = Preset::DistilLargeV3.generation_config();
    assert_eq!(
        g.alignment_heads,
        Preset::LargeV3.generation_config().alignment_heads
    );
    g.validate(&c).unwrap();
    let (kept, dropped) = g.split_alignment_heads(&c);
    assert!(kept.is_empty() && dropped.len() == 10);

    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("distil");
    synth_small(&model, "distil-large-v3", 2, 2);
    let cfg = WhisperConfig::from_file(&model.join("config.json")).unwrap();
    assert_eq!(cfg.decoder_layers, 2);
    let out = dir.path().join("dec.mlpackage");
    let err = ok(&run(&[
        "export",
        "--model",
        s(&model),
        "--component",
        "decoder",
        "--quiet",
        "--out",
        s(&out),
    ]));
    assert!(
        err.contains("dropping alignment heads [7, 0], [10, 17]")
            && err.contains("no word timestamps"),
        "{err}"
    );
    let m = milkit::package::load_package(&out).unwrap();
    let names: Vec<&str> = m
        .description
        .outputs
        .iter()
        .map(|f| f.name.as_str())
        .collect();
    assert_eq!(
        names,
        ["logits", "key_cache_updates", "value_cache_updates"]
    );
    common::validate(&out);
}

/// Copies tiny.en's json files into `dir` (all but `skip`) and rewrites its weights through
/// `edit` (name, fp16 bytes → tensors to store under which names).
#[allow(clippy::type_complexity)]
fn rewrite_tiny_en(
    fx: &Path,
    dir: &Path,
    skip: &[&str],
    edit: &dyn Fn(&str, &[usize], &[u8]) -> Vec<(String, Vec<usize>, Vec<u8>)>,
) {
    let src = fx.join("models/whisper-tiny.en");
    std::fs::create_dir_all(dir).unwrap();
    for f in [
        "config.json",
        "generation_config.json",
        "preprocessor_config.json",
        "tokenizer.json",
    ] {
        if !skip.contains(&f) {
            std::fs::copy(src.join(f), dir.join(f)).unwrap();
        }
    }
    let bytes = std::fs::read(src.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut out: Vec<(String, Vec<usize>, Vec<u8>)> = vec![];
    for (name, view) in st.tensors() {
        assert_eq!(view.dtype(), safetensors::Dtype::F16);
        out.extend(edit(&name, view.shape(), view.data()));
    }
    let views: Vec<(String, safetensors::tensor::TensorView)> = out
        .iter()
        .map(|(n, s, d)| {
            (
                n.clone(),
                safetensors::tensor::TensorView::new(safetensors::Dtype::F16, s.clone(), d)
                    .unwrap(),
            )
        })
        .collect();
    safetensors::serialize_to_file(views, None, &dir.join("model.safetensors")).unwrap();
}

fn keep(n: &str, s: &[usize], d: &[u8]) -> Vec<(String, Vec<usize>, Vec<u8>)> {
    vec![(n.to_string(), s.to_vec(), d.to_vec())]
}

fn set_config(dir: &Path, key: &str, v: serde_json::Value) {
    let p = dir.join("config.json");
    let mut c: serde_json::Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
    c[key] = v;
    std::fs::write(&p, c.to_string()).unwrap();
}

/// The fp16 bytes of const `name` of a model.
fn const_bytes(m: &Model, name: &str) -> Vec<u8> {
    let ops = m.program.main().unwrap().block.walk();
    let op = ops
        .iter()
        .find(|o| o.op_type == "const" && o.name == name)
        .unwrap_or_else(|| panic!("no const {name}"));
    op.const_val()
        .unwrap()
        .as_tensor()
        .unwrap()
        .data
        .as_slice()
        .to_vec()
}

#[test]
fn fine_tuned_layouts_bare_keys_and_an_untied_head() {
    let Some(fx) = common::fixtures() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let orig = export_decoder(
        &Checkpoint::open(&fx.join("models/whisper-tiny.en")).unwrap(),
        &Default::default(),
        Opset::Ios18,
    )
    .unwrap();
    // WhisperModel's bare keys (no `model.` prefix) and an untied head proj_out.weight that
    // differs from the embedding (the embedding with every value halved, exact in fp16).
    let bare = tmp.path().join("bare");
    rewrite_tiny_en(&fx, &bare, &[], &|n, s, d| {
        let mut v = keep(n.strip_prefix("model.").unwrap_or(n), s, d);
        if n == "model.decoder.embed_tokens.weight" {
            let half: Vec<u8> = d
                .chunks_exact(2)
                .flat_map(|c| {
                    let x = half::f16::from_le_bytes([c[0], c[1]]).to_f32() * 0.5;
                    half::f16::from_f32(x).to_le_bytes()
                })
                .collect();
            v.push(("proj_out.weight".into(), s.to_vec(), half));
        }
        v
    });
    set_config(&bare, "tie_word_embeddings", serde_json::json!(false));
    let m = export_decoder(
        &Checkpoint::open(&bare).unwrap(),
        &Default::default(),
        Opset::Ios18,
    )
    .unwrap();
    // The embedding table is the original; the head is proj_out, not the embedding.
    assert_eq!(
        const_bytes(&m, "embed_tokens"),
        const_bytes(&orig, "embed_tokens")
    );
    let head = const_bytes(&m, "lm_head_weight");
    assert_ne!(head, const_bytes(&orig, "lm_head_weight"));
    let emb = const_bytes(&orig, "embed_tokens");
    let x = |b: &[u8], i: usize| half::f16::from_le_bytes([b[2 * i], b[2 * i + 1]]).to_f32();
    for i in (0..emb.len() / 2).step_by(997) {
        assert_eq!(x(&head, i), half::f16::from_f32(x(&emb, i) * 0.5).to_f32());
    }
    // Untied but proj_out missing: the error names it and says the fix.
    let noproj = tmp.path().join("noproj");
    rewrite_tiny_en(&fx, &noproj, &[], &keep);
    set_config(&noproj, "tie_word_embeddings", serde_json::json!(false));
    let e = format!(
        "{:#}",
        export_decoder(
            &Checkpoint::open(&noproj).unwrap(),
            &Default::default(),
            Opset::Ios18
        )
        .unwrap_err()
    );
    assert!(
        e.contains("proj_out.weight") && e.contains("set tie_word_embeddings to true"),
        "{e}"
    );
    // Both namings of one tensor: the conflict is named.
    let both = tmp.path().join("both");
    rewrite_tiny_en(&fx, &both, &[], &|n, s, d| {
        let mut v = keep(n, s, d);
        if n == "model.encoder.conv1.weight" {
            v.push(("encoder.conv1.weight".into(), s.to_vec(), d.to_vec()));
        }
        v
    });
    let e = format!(
        "{:#}",
        export_decoder(
            &Checkpoint::open(&both).unwrap(),
            &Default::default(),
            Opset::Ios18
        )
        .unwrap_err()
    );
    assert!(
        e.contains("model.encoder.conv1.weight")
            && e.contains("with and without the `model.` prefix"),
        "{e}"
    );
}

fn export_all(model: &Path, out: &Path) -> Output {
    run(&[
        "export",
        "--model",
        s(model),
        "--component",
        "all",
        "--quiet",
        "--out",
        s(out),
    ])
}

#[test]
fn missing_generation_config_is_derived_and_missing_tokenizer_refused_for_a_folder() {
    let Some(fx) = common::fixtures() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let real: serde_json::Value = serde_json::from_slice(
        &std::fs::read(fx.join("models/whisper-tiny.en/generation_config.json")).unwrap(),
    )
    .unwrap();
    let nogen = tmp.path().join("nogen");
    rewrite_tiny_en(&fx, &nogen, &["generation_config.json"], &keep);
    let out = tmp.path().join("folder");
    let err = ok(&export_all(&nogen, &out));
    assert!(
        err.contains(
            "no generation_config.json; using defaults derived from config.json and tokenizer.json"
        ),
        "{err}"
    );
    let g: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("generation_config.json")).unwrap())
            .unwrap();
    // The derived ids are the released file's.
    for k in [
        "no_timestamps_token_id",
        "decoder_start_token_id",
        "eos_token_id",
        "forced_decoder_ids",
        "begin_suppress_tokens",
        "is_multilingual",
        "prev_sot_token_id",
        "max_length",
    ] {
        assert_eq!(g[k], real[k], "{k}");
    }
    assert!(g.get("alignment_heads").is_none());
    let dec = milkit::package::load_package(&out.join("TextDecoder.mlpackage")).unwrap();
    assert!(!dec
        .description
        .outputs
        .iter()
        .any(|f| f.name == "alignment_heads_weights"));
    // It transcribes as the folder with the released generation config does.
    if let Some(wav) = jfk() {
        let full = tmp.path().join("full");
        ok(&export_all(&fx.join("models/whisper-tiny.en"), &full));
        let a = run(&["transcribe", "--models", s(&out), s(&wav)]);
        let b = run(&["transcribe", "--models", s(&full), s(&wav)]);
        ok(&a);
        ok(&b);
        let text = String::from_utf8_lossy(&a.stdout);
        assert_eq!(text, String::from_utf8_lossy(&b.stdout));
        assert!(
            text.to_lowercase().contains("ask not what your country"),
            "{text}"
        );
        // Word timings need the alignment output: refused up front, naming it.
        let w = run(&[
            "transcribe",
            "--word-timestamps",
            "--models",
            s(&out),
            s(&wav),
        ]);
        let err = String::from_utf8_lossy(&w.stderr);
        assert_eq!(w.status.code(), Some(2), "{err}");
        assert!(err.contains("`alignment_heads_weights`"), "{err}");
    }
    // No tokenizer: a folder is refused with the fix, a single package is fine.
    let notok = tmp.path().join("notok");
    rewrite_tiny_en(&fx, &notok, &["tokenizer.json"], &keep);
    let out2 = tmp.path().join("folder2");
    let o = export_all(&notok, &out2);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("missing tokenizer.json") && err.contains("--component"),
        "{err}"
    );
    assert!(!out2.exists());
    let pkg = tmp.path().join("dec.mlpackage");
    ok(&run(&[
        "export",
        "--model",
        s(&notok),
        "--component",
        "decoder",
        "--quiet",
        "--out",
        s(&pkg),
    ]));
}

/// `export --component all` through one opened checkpoint reads config.json, the generation
/// config, the tokenizer (when the generation config is derived from it), the mel filters
/// and the weights once each, for every part of the folder (before the Checkpoint, the
/// exporters re-read config.json 4-10 times and the weights 2-4 times per folder).
#[test]
fn a_whole_folder_reads_each_checkpoint_file_once() {
    let dir = tempfile::tempdir().unwrap();
    let multilingual = micro(dir.path(), Preset::Tiny);
    let derived = dir.path().join("derived");
    synthesize_with(&common::micro_config(), None, &derived, &opts()).unwrap();
    for (model, cross_kv, expect) in [
        (
            &multilingual,
            CrossKv::Precomputed,
            &["config.json", "generation_config.json", "model.safetensors"][..],
        ),
        (
            &derived,
            CrossKv::InGraph,
            &["config.json", "model.safetensors", "tokenizer.json"][..],
        ),
    ] {
        file_reads::take();
        let ckpt = Checkpoint::open(model).unwrap();
        let opts = BundleOptions {
            opset: Opset::Ios18,
            decoder: DecoderExport {
                cross_kv,
                ..Default::default()
            },
            encoder_compression: None,
            decoder_compression: None,
        };
        let out = dir.path().join("out");
        let report = write_whisperkit_folder(&ckpt, &out, &opts, true, &mut |_| {}).unwrap();
        let reads = file_reads::take();
        for f in expect {
            assert_eq!(
                reads.get(*f),
                Some(&1),
                "{f} of {}: {reads:?}",
                model.display()
            );
        }
        assert!(reads.values().all(|&n| n == 1), "{reads:?}");
        assert!(report.files.len() >= 6, "{:?}", report.files);
    }
}
