//! The interpreter on milkit's Whisper text decoder with the real tiny.en weights, driven
//! as WhisperKit drives it (one token a step, host-side or state-held KV cache) and
//! teacher-forced through the jfk reference tokens: logits against PyTorch's, argmax at
//! every position, and the stateful variant (through a saved package) against the cache-I/O
//! one.

mod common;

use common::programs::*;
use milkit::ir::Opset;
use milkit::runtime::{io, Session, Tensor};
use milkit::whisper::decoder::{
    build_decoder, min_head_chunks, CrossKv, DecoderDims, DecoderOptions, KvCache, MASK_HIDDEN,
};
use std::collections::HashMap;
use std::path::Path;
use std::time::Instant;

fn json(p: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap()
}

fn dims(fx: &Path) -> DecoderDims {
    let c = json(&fx.join("models/whisper-tiny.en/config.json"));
    let u = |k: &str| c[k].as_u64().unwrap() as usize;
    DecoderDims {
        d_model: u("d_model"),
        layers: u("decoder_layers"),
        heads: u("decoder_attention_heads"),
        ffn: u("decoder_ffn_dim"),
        vocab: u("vocab_size"),
        n_text_ctx: u("max_target_positions"),
        n_audio_ctx: u("max_source_positions"),
    }
}

fn f16_host(v: Vec<f32>, shape: &[usize]) -> Tensor {
    host(&v, shape).to_dtype(candle_core::DType::F16).unwrap()
}

fn i32_host(v: i32) -> Tensor {
    Tensor::from_vec(vec![v], 1, &candle_core::Device::Cpu).unwrap()
}

/// Runs every reference token through a decoder session; returns the logits per position.
fn teacher_force(s: &mut Session, d: &DecoderDims, tokens: &[i32], enc: &Tensor) -> Vec<Vec<f32>> {
    let (n, dl) = (d.n_text_ctx, d.d_model * d.layers);
    let fed: Vec<String> = s
        .inputs(None)
        .unwrap()
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    let (mut key, mut value) = (vec![0f32; dl * n], vec![0f32; dl * n]);
    let mut all = Vec::new();
    for (t, &tok) in tokens.iter().enumerate() {
        let mut ins: HashMap<&str, Tensor> = HashMap::new();
        ins.insert("input_ids", i32_host(tok));
        ins.insert("cache_length", i32_host(t as i32));
        let pad = (0..n)
            .map(|j| if j <= t { 0.0 } else { MASK_HIDDEN })
            .collect();
        ins.insert("decoder_key_padding_mask", f16_host(pad, &[1, n]));
        ins.insert("encoder_output_embeds", enc.clone());
        let upd = (0..n).map(|j| (j == t) as u8 as f32).collect();
        ins.insert("kv_cache_update_mask", f16_host(upd, &[1, n]));
        ins.insert("key_cache", f16_host(key.clone(), &[1, dl, 1, n]));
        ins.insert("value_cache", f16_host(value.clone(), &[1, dl, 1, n]));
        let inputs: Vec<(&str, Tensor)> = fed
            .iter()
            .map(|k| (k.as_str(), ins[k.as_str()].clone()))
            .collect();
        let out: HashMap<String, Tensor> = s.predict(&inputs).unwrap().into_iter().collect();
        for (cache, name) in [
            (&mut key, "key_cache_updates"),
            (&mut value, "value_cache_updates"),
        ] {
            if let Some(u) = out.get(name) {
                for (c, v) in f32s(u).into_iter().enumerate() {
                    cache[c * n + t] = v;
                }
            }
        }
        all.push(f32s(&out["logits"]));
    }
    all
}

fn argmax(v: &[f32]) -> usize {
    (0..v.len()).fold(0, |b, i| if v[i] > v[b] { i } else { b })
}

#[test]
fn tiny_en_decoder_matches_pytorch_cache_io_and_stateful() {
    let Some(fx) = common::fixtures() else { return };
    let d = dims(&fx);
    let heads = common::alignment_heads(&fx.join("models/whisper-tiny.en"));
    let ck =
        Checkpoint(std::fs::read(fx.join("models/whisper-tiny.en/model.safetensors")).unwrap());
    let refs = fx.join("reference/tiny.en-jfk.safetensors");
    let tokens = io::read_safetensors(&refs, "tokens")
        .unwrap()
        .to_vec1::<i32>()
        .unwrap();
    let want8 = f32s(&io::read_safetensors(&refs, "logits_first8").unwrap());
    let want_argmax = io::read_safetensors(&refs, "argmax_all")
        .unwrap()
        .to_vec1::<i32>()
        .unwrap();
    // encoder_output [1, 1500, d] → WhisperKit's [1, d, 1, 1500].
    let enc = io::read_safetensors(&refs, "encoder_output").unwrap();
    let enc = enc
        .transpose(1, 2)
        .unwrap()
        .unsqueeze(2)
        .unwrap()
        .contiguous()
        .unwrap();
    let opts = |kv| DecoderOptions {
        alignment_heads: heads.clone(),
        per_head_alignment: false,
        head_chunks: min_head_chunks(d.vocab),
        kv_cache: kv,
        cross_kv: CrossKv::InGraph,
    };

    let m = build_decoder(&d, &ck, &opts(KvCache::Io), Opset::Ios17).unwrap();
    let mut s = Session::from_model(m).unwrap();
    let t0 = Instant::now();
    let io_logits = teacher_force(&mut s, &d, &tokens, &enc);
    let per_token = t0.elapsed() / tokens.len() as u32;
    for t in 0..8 {
        let p = psnr(&want8[t * d.vocab..(t + 1) * d.vocab], &io_logits[t]);
        println!("decoder (cache I/O) position {t}: logits PSNR {p:.1} dB");
        assert!(p >= 35.0, "position {t}: {p:.1} dB");
    }
    let ours: Vec<i32> = io_logits.iter().map(|l| argmax(l) as i32).collect();
    assert_eq!(ours, want_argmax, "argmax at every position");
    println!(
        "decoder (cache I/O): {} positions, {per_token:.1?} per token",
        tokens.len()
    );

    // Stateful variant, saved and loaded as a package: same logits as the cache-I/O graph.
    let m = build_decoder(&d, &ck, &opts(KvCache::State), Opset::Ios18).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let pkg = dir.path().join("decoder-stateful.mlpackage");
    milkit::package::save_package(&m, &pkg, false, &mut |_| {}).unwrap();
    let mut s = Session::load(&pkg).unwrap();
    let t0 = Instant::now();
    let st_logits = teacher_force(&mut s, &d, &tokens, &enc);
    let per_token = t0.elapsed() / tokens.len() as u32;
    for (t, (a, b)) in io_logits.iter().zip(&st_logits).enumerate() {
        let p = psnr(a, b);
        assert!(p >= 60.0, "position {t}: stateful vs cache I/O {p:.1} dB");
    }
    let ours: Vec<i32> = st_logits.iter().map(|l| argmax(l) as i32).collect();
    assert_eq!(ours, want_argmax);
    println!("decoder (stateful package): {per_token:.1?} per token");
}

/// The TextDecoder packages `milkit export` writes — fp16, and with only the vocabulary head
/// palettized (`--head-only`, LUT4 k-means per 8 rows) — loaded from disk and teacher-forced
/// through the first 8 jfk tokens against PyTorch's logits.
#[test]
fn exported_decoder_packages_match_pytorch() {
    let Some(fx) = common::fixtures() else { return };
    let d = dims(&fx);
    let model = fx.join("models/whisper-tiny.en");
    let refs = fx.join("reference/tiny.en-jfk.safetensors");
    let tokens = io::read_safetensors(&refs, "tokens")
        .unwrap()
        .to_vec1::<i32>()
        .unwrap();
    let want8 = f32s(&io::read_safetensors(&refs, "logits_first8").unwrap());
    let enc = io::read_safetensors(&refs, "encoder_output").unwrap();
    let enc = enc
        .transpose(1, 2)
        .unwrap()
        .unsqueeze(2)
        .unwrap()
        .contiguous()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let head_lut4 = [
        "--head-only",
        "--palettize",
        "kmeans",
        "--nbits",
        "4",
        "--group-size",
        "8",
    ];
    for (name, extra, min_db) in [("fp16", &[][..], 35.0), ("head-lut4", &head_lut4[..], 20.0)] {
        let p = dir.path().join(format!("{name}.mlpackage"));
        let o = common::milkit()
            .args(["export", "--component", "decoder", "--quiet", "--model"])
            .arg(&model)
            .arg("--out")
            .arg(&p)
            .args(extra)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let mut s = Session::load(&p).unwrap();
        let logits = teacher_force(&mut s, &d, &tokens[..8], &enc);
        let mut worst = f64::INFINITY;
        for (t, l) in logits.iter().enumerate() {
            let want = &want8[t * d.vocab..(t + 1) * d.vocab];
            worst = worst.min(psnr(want, l));
            assert_eq!(argmax(l), argmax(want), "{name}: argmax at position {t}");
        }
        println!("exported decoder ({name}): worst logits PSNR over 8 positions {worst:.1} dB");
        assert!(worst >= min_db, "{name}: {worst:.1} dB");
    }
}

/// WhisperKit's in-graph decoder re-projects `encoder_output_embeds` every token; with
/// memoization (the default) a session reuses those projections while the input's bytes
/// are unchanged. Same logits as a session without it, bit for bit, across a changed
/// encoder output; and the memoized steps are faster.
#[test]
fn in_graph_decoder_memoizes_cross_projections() {
    let Some(fx) = common::fixtures() else { return };
    let d = dims(&fx);
    let ck =
        Checkpoint(std::fs::read(fx.join("models/whisper-tiny.en/model.safetensors")).unwrap());
    let refs = fx.join("reference/tiny.en-jfk.safetensors");
    let tokens = io::read_safetensors(&refs, "tokens")
        .unwrap()
        .to_vec1::<i32>()
        .unwrap();
    let enc = io::read_safetensors(&refs, "encoder_output").unwrap();
    let enc = enc
        .transpose(1, 2)
        .unwrap()
        .unsqueeze(2)
        .unwrap()
        .contiguous()
        .unwrap();
    let enc2 = (&enc * 0.5).unwrap();
    let opts = DecoderOptions {
        alignment_heads: vec![],
        per_head_alignment: false,
        head_chunks: 1,
        kv_cache: KvCache::State,
        cross_kv: CrossKv::InGraph,
    };
    let m = build_decoder(&d, &ck, &opts, Opset::Ios18).unwrap();
    let mut memo = Session::from_model(m.clone()).unwrap();
    let mut plain = Session::from_model(m).unwrap();
    plain.set_memoize(false);
    memo.enable_profiling(true);
    plain.enable_profiling(true);
    let n = d.n_text_ctx;
    let (mut t_memo, mut t_plain) = (vec![], vec![]);
    for (t, &tok) in tokens.iter().take(6).enumerate() {
        let e = if t < 4 { &enc } else { &enc2 };
        let pad = (0..n)
            .map(|j| if j <= t { 0.0 } else { MASK_HIDDEN })
            .collect();
        let ins = [
            ("input_ids", i32_host(tok)),
            ("cache_length", i32_host(t as i32)),
            ("decoder_key_padding_mask", f16_host(pad, &[1, n])),
            ("encoder_output_embeds", e.clone()),
        ];
        let t0 = Instant::now();
        let a = memo.predict(&ins).unwrap();
        t_memo.push(t0.elapsed());
        let t0 = Instant::now();
        let b = plain.predict(&ins).unwrap();
        t_plain.push(t0.elapsed());
        assert_eq!(f32s(&a[0].1), f32s(&b[0].1), "token {t}: memoized vs plain");
    }
    println!("in-graph decoder per token, memoized: {t_memo:.1?}; plain: {t_plain:.1?}");
    assert!(memo.memoized_values() > 0);
    // Fewer contractions ran in the memoized session (the projections of tokens 1-3, 5).
    let convs = |s: &Session| s.profile().iter().find(|p| p.0 == "conv").map(|p| p.1);
    let (cm, cp) = (convs(&memo).unwrap_or(0), convs(&plain).unwrap_or(0));
    println!("conv runs: memoized {cm}, plain {cp}");
    assert!(
        cm + 4 * 2 * d.layers <= cp,
        "memoized {cm} vs plain {cp} conv runs"
    );
}
