//! Whisper text decoder export: the ABI (names, dtypes, shapes) of every variant, the
//! conformance validator's verdict, a separately compressible vocabulary head, and numerics —
//! an f32 reference step against PyTorch's logits, and the built graphs (run by milkit's
//! runtime with fp16 widened to f32) against that reference.

mod common;
#[path = "decoder/reference.rs"]
mod reference;
#[path = "decoder/support.rs"]
mod support;

use milkit::ir::{ArrayDType, Opset};
use milkit::package::load_package;
use milkit::whisper::decoder::{
    build_cross_kv, build_decoder, min_head_chunks, CrossKv, DecoderOptions, KvCache,
    CROSS_KV_NAMES,
};
use reference::{psnr, RefDecoder, SafeWeights};
use std::collections::HashMap;
use std::process::Command;
use support::*;

#[test]
fn synthetic_decoder_abi_head_and_validator() {
    let d = tiny_dims();
    let w = reference::synthetic(&d, 1);
    let heads = vec![(0, 1), (1, 0), (1, 1)];
    let m = build_decoder(
        &d,
        &w,
        &opts(heads, 3, KvCache::Io, CrossKv::InGraph),
        Opset::Ios16,
    )
    .unwrap();
    use ArrayDType::{F16, I32};
    assert_eq!(
        abi(&m.description.inputs),
        vec![
            f("input_ids", I32, &[1]),
            f("cache_length", I32, &[1]),
            f("key_cache", F16, &[1, 128, 1, 448]),
            f("value_cache", F16, &[1, 128, 1, 448]),
            f("kv_cache_update_mask", F16, &[1, 448]),
            f("encoder_output_embeds", F16, &[1, 64, 1, 1500]),
            f("decoder_key_padding_mask", F16, &[1, 448]),
        ]
    );
    assert_eq!(
        abi(&m.description.outputs),
        vec![
            f("logits", F16, &[1, 1, 300]),
            f("key_cache_updates", F16, &[1, 128, 1, 1]),
            f("value_cache_updates", F16, &[1, 128, 1, 1]),
            f("alignment_heads_weights", F16, &[1, 1500]),
        ]
    );
    assert!(m.description.states.is_empty());
    assert_eq!(m.spec_version, 7);

    // The head is its own constants (3 row chunks of 100), apart from the gather table.
    let ops = m.program.main().unwrap().block.walk();
    let consts: HashMap<&str, Vec<usize>> = ops
        .iter()
        .filter_map(|o| {
            o.const_val()
                .and_then(|v| v.as_tensor())
                .map(|t| (o.name.as_str(), t.shape.clone()))
        })
        .collect();
    let mut head: Vec<(&str, Vec<usize>)> = consts
        .iter()
        .filter(|(n, s)| n.contains("lm_head") && s.len() > 1)
        .map(|(n, s)| (*n, s.clone()))
        .collect();
    head.sort();
    assert_eq!(
        head,
        vec![
            ("lm_head_0_weight", vec![100, 64, 1, 1]),
            ("lm_head_1_weight", vec![100, 64, 1, 1]),
            ("lm_head_2_weight", vec![100, 64, 1, 1])
        ]
    );
    assert_eq!(consts["embed_tokens"], vec![300, 64]);
    let gathers = ops.iter().filter(|o| o.op_type == "gather").count();
    assert_eq!(
        gathers,
        2 + 2,
        "token + position embedding and one alignment gather per layer"
    );

    let dir = tempfile::tempdir().unwrap();
    let p = save_roundtrip(&m, dir.path(), "decoder");
    if let Some(r) = common::validate(&p) {
        assert_eq!(r["ok"], true);
        assert_eq!(r["spec_histogram"]["main"]["conv"], 10 * 2 + 3, "{r}");
    }
}

#[test]
fn synthetic_decoder_graph_matches_reference() {
    let d = tiny_dims();
    let w = reference::synthetic(&d, 2);
    let heads = vec![(0, 0), (1, 1)];
    let r = RefDecoder::load(&d, &w).unwrap();
    let (rows, enc) = synthetic_encoder(&d);
    let tokens = [7, 299, 0, 42, 42, 150];
    for chunks in [1, 3] {
        let m = build_decoder(
            &d,
            &w,
            &opts(heads.clone(), chunks, KvCache::Io, CrossKv::InGraph),
            Opset::Ios15,
        )
        .unwrap();
        let cross = [("encoder_output_embeds", enc.clone())].into();
        let p = compare_with_reference(&m, &r, &d, &heads, &tokens, &rows, &cross);
        eprintln!("synthetic decoder (head chunks {chunks}) vs f32 reference: worst logits PSNR {p:.1} dB");
        assert!(p > 60.0, "graph vs reference logits PSNR {p:.1} dB");
    }
}

#[test]
fn synthetic_stateful_decoder() {
    let d = tiny_dims();
    let w = reference::synthetic(&d, 3);
    let heads = vec![(1, 0)];
    let o = opts(heads.clone(), 1, KvCache::State, CrossKv::InGraph);
    let err = build_decoder(&d, &w, &o, Opset::Ios17).unwrap_err();
    assert!(format!("{err:#}").contains("ios18"), "{err:#}");
    let m = build_decoder(&d, &w, &o, Opset::Ios18).unwrap();
    use ArrayDType::{F16, I32};
    assert_eq!(
        abi(&m.description.inputs),
        vec![
            f("input_ids", I32, &[1]),
            f("cache_length", I32, &[1]),
            f("encoder_output_embeds", F16, &[1, 64, 1, 1500]),
            f("decoder_key_padding_mask", F16, &[1, 448]),
        ]
    );
    assert_eq!(
        abi(&m.description.states),
        vec![
            f("key_cache", F16, &[1, 128, 1, 448]),
            f("value_cache", F16, &[1, 128, 1, 448])
        ]
    );
    assert_eq!(
        abi(&m.description.outputs),
        vec![
            f("logits", F16, &[1, 1, 300]),
            f("alignment_heads_weights", F16, &[1, 1500])
        ]
    );
    assert_eq!(m.spec_version, 9);
    let f0 = m.program.main().unwrap();
    let state_inputs: Vec<&str> = f0
        .inputs
        .iter()
        .filter(|v| matches!(v.ty, milkit::ir::ValueType::State(_)))
        .map(|v| v.name.as_str())
        .collect();
    assert_eq!(state_inputs, ["key_cache", "value_cache"]);
    let count = |t: &str| f0.block.walk().iter().filter(|o| o.op_type == t).count();
    assert_eq!(
        (
            count("read_state"),
            count("slice_update"),
            count("write_state")
        ),
        (4, 4, 4)
    );

    let r = RefDecoder::load(&d, &w).unwrap();
    let (rows, enc) = synthetic_encoder(&d);
    let cross = [("encoder_output_embeds", enc)].into();
    let p = compare_with_reference(&m, &r, &d, &heads, &[3, 1, 4, 1, 5], &rows, &cross);
    eprintln!("synthetic stateful decoder vs f32 reference: worst logits PSNR {p:.1} dB");
    assert!(
        p > 60.0,
        "stateful graph vs reference logits PSNR {p:.1} dB"
    );

    let dir = tempfile::tempdir().unwrap();
    let pkg = save_roundtrip(&m, dir.path(), "decoder-stateful");
    validate_stateful(&pkg, 4, 2);
}

#[test]
fn synthetic_cross_kv_models() {
    let d = tiny_dims();
    let w = reference::synthetic(&d, 4);
    let heads = vec![(0, 1)];
    let ckv = build_cross_kv(&d, &w, Opset::Ios16).unwrap();
    use ArrayDType::F16;
    assert_eq!(
        abi(&ckv.description.inputs),
        vec![f("encoder_output_embeds", F16, &[1, 64, 1, 1500])]
    );
    assert_eq!(
        abi(&ckv.description.outputs),
        vec![
            f(CROSS_KV_NAMES[0], F16, &[1, 128, 1, 1500]),
            f(CROSS_KV_NAMES[1], F16, &[1, 128, 1, 1500])
        ]
    );
    let dec = build_decoder(
        &d,
        &w,
        &opts(heads.clone(), 1, KvCache::Io, CrossKv::Precomputed),
        Opset::Ios16,
    )
    .unwrap();
    let names: Vec<&str> = dec
        .description
        .inputs
        .iter()
        .map(|f| f.name.as_str())
        .collect();
    assert_eq!(
        names,
        [
            "input_ids",
            "cache_length",
            "key_cache",
            "value_cache",
            "kv_cache_update_mask",
            CROSS_KV_NAMES[0],
            CROSS_KV_NAMES[1],
            "decoder_key_padding_mask"
        ]
    );

    // CrossKV outputs equal the reference's per-layer projections; the decoder fed with them
    // equals the reference decoder.
    let r = RefDecoder::load(&d, &w).unwrap();
    let (rows, enc) = synthetic_encoder(&d);
    let out = run_f32(
        &ckv,
        &[("encoder_output_embeds", enc)].into(),
        &mut HashMap::new(),
    )
    .unwrap();
    let want = r.cross_kv(&rows);
    let wk = bc1s_layers(
        &want.iter().map(|kv| kv.0.clone()).collect::<Vec<_>>(),
        d.d_model,
        d.n_audio_ctx,
    );
    let wv = bc1s_layers(
        &want.iter().map(|kv| kv.1.clone()).collect::<Vec<_>>(),
        d.d_model,
        d.n_audio_ctx,
    );
    assert!(psnr(&wk.data, &out[CROSS_KV_NAMES[0]].data) > 80.0);
    assert!(psnr(&wv.data, &out[CROSS_KV_NAMES[1]].data) > 80.0);
    let cross: HashMap<&str, T> = [
        (CROSS_KV_NAMES[0], out[CROSS_KV_NAMES[0]].clone()),
        (CROSS_KV_NAMES[1], out[CROSS_KV_NAMES[1]].clone()),
    ]
    .into();
    let p = compare_with_reference(&dec, &r, &d, &heads, &[9, 8, 7], &rows, &cross);
    eprintln!(
        "synthetic precomputed-cross-KV decoder vs f32 reference: worst logits PSNR {p:.1} dB"
    );
    assert!(p > 60.0);

    let stateful = build_decoder(
        &d,
        &w,
        &opts(vec![], 1, KvCache::State, CrossKv::Precomputed),
        Opset::Ios18,
    )
    .unwrap();
    assert_eq!(
        stateful.description.outputs.len(),
        1,
        "no alignment heads → logits only"
    );

    let dir = tempfile::tempdir().unwrap();
    for (m, name) in [(&ckv, "cross-kv"), (&dec, "decoder-cross-kv")] {
        let p = save_roundtrip(m, dir.path(), name);
        if let Some(r) = common::validate(&p) {
            assert_eq!(r["ok"], true, "{name}");
        }
    }
    let p = save_roundtrip(&stateful, dir.path(), "decoder-stateful-cross-kv");
    validate_stateful(&p, 5, 2);
}

#[test]
fn bad_options_are_errors() {
    let d = tiny_dims();
    let w = reference::synthetic(&d, 5);
    let e = build_decoder(
        &d,
        &w,
        &opts(vec![(2, 0)], 1, KvCache::Io, CrossKv::InGraph),
        Opset::Ios16,
    )
    .unwrap_err();
    assert!(format!("{e:#}").contains("alignment head"), "{e:#}");
    let e = build_decoder(
        &d,
        &w,
        &opts(vec![], 0, KvCache::Io, CrossKv::InGraph),
        Opset::Ios16,
    )
    .unwrap_err();
    assert!(format!("{e:#}").contains("head_chunks"), "{e:#}");
    let mut missing = reference::synthetic(&d, 5);
    missing.0.remove("model.decoder.layers.1.fc2.bias");
    let e = build_decoder(&d, &missing, &DecoderOptions::default(), Opset::Ios16).unwrap_err();
    assert!(format!("{e:#}").contains("layers.1.fc2.bias"), "{e:#}");
    assert!(
        serde_json::from_value::<milkit::whisper::config::GenerationConfig>(
            serde_json::json!({"alignment_heads": [[1, 2], [3]]})
        )
        .is_err()
    );
    assert_eq!(min_head_chunks(51864), 4);
    assert_eq!(min_head_chunks(16384), 1);
}

/// The contract the graphs implement, checked where it matters: the f32 reference decoder with
/// the real tiny.en weights, fed PyTorch's encoder output and tokens (teacher forcing),
/// reproduces PyTorch's logits at the first 8 positions.
#[test]
fn reference_decoder_reproduces_pytorch_logits() {
    let Some(fx) = common::fixtures() else { return };
    let d = tiny_en_dims(&fx);
    let w = SafeWeights::open(&fx.join("models/whisper-tiny.en/model.safetensors")).unwrap();
    let refs = SafeWeights::open(&fx.join("reference/tiny.en-jfk.safetensors")).unwrap();
    let (es, enc) = refs.f32s("encoder_output").unwrap();
    assert_eq!(es, [1, d.n_audio_ctx, d.d_model]);
    let (_, tokens) = refs.f32s("tokens").unwrap();
    let (ls, logits8) = refs.f32s("logits_first8").unwrap();
    let (_, argmax) = refs.f32s("argmax_all").unwrap();
    assert_eq!(ls, [8, d.vocab]);
    let r = RefDecoder::load(&d, &w).unwrap();
    let cross = r.cross_kv(&enc);
    let mut cache: reference::Kv = vec![(vec![], vec![]); d.layers];
    let mut all = vec![];
    for t in 0..8 {
        let s = r.step(tokens[t] as usize, t, &cross, &mut cache, &[]);
        let want = &logits8[t * d.vocab..(t + 1) * d.vocab];
        let p = psnr(want, &s.logits);
        let am = s
            .logits
            .iter()
            .enumerate()
            .fold((0, f32::MIN), |b, (i, &v)| if v > b.1 { (i, v) } else { b })
            .0;
        eprintln!(
            "reference step {t}: logits PSNR {p:.1} dB, argmax {am} (PyTorch {})",
            argmax[t]
        );
        assert!(p >= 35.0, "position {t}: PSNR {p:.1} dB");
        assert_eq!(am, argmax[t] as usize, "argmax at position {t}");
        all.extend(s.logits);
    }
    let p = psnr(&logits8, &all);
    eprintln!("reference decoder vs PyTorch logits_first8: PSNR {p:.1} dB");
    assert!(p >= 35.0);
}

/// All variants from the real tiny.en weights: exact ABIs, the validator's verdict, and the
/// cache-I/O graph's logits against PyTorch for the first positions of the jfk clip.
#[test]
fn tiny_en_packages() {
    let Some(fx) = common::fixtures() else { return };
    let d = tiny_en_dims(&fx);
    let heads = tiny_en_heads(&fx);
    assert_eq!(heads.len(), 8);
    let w = SafeWeights::open(&fx.join("models/whisper-tiny.en/model.safetensors")).unwrap();
    let chunks = min_head_chunks(d.vocab);
    let dir = tempfile::tempdir().unwrap();

    let m = build_decoder(
        &d,
        &w,
        &opts(heads.clone(), chunks, KvCache::Io, CrossKv::InGraph),
        Opset::Ios17,
    )
    .unwrap();
    use ArrayDType::F16;
    let dl = d.d_model * d.layers;
    assert_eq!(
        m.description.inputs[2],
        milkit::ir::Feature::new("key_cache", F16, &[1, dl, 1, 448])
    );
    assert_eq!(
        abi(&m.description.outputs),
        vec![
            f("logits", F16, &[1, 1, 51864]),
            f("key_cache_updates", F16, &[1, 1536, 1, 1]),
            f("value_cache_updates", F16, &[1, 1536, 1, 1]),
            f("alignment_heads_weights", F16, &[1, 1500]),
        ]
    );
    let p = save_roundtrip(&m, dir.path(), "tiny.en-decoder");
    if let Some(r) = common::validate(&p) {
        eprintln!(
            "validator on tiny.en decoder: {}",
            r["spec_histogram"]["main"]
        );
    }

    // Numerics of the graph itself on real weights: first 3 jfk positions vs PyTorch.
    let refs = SafeWeights::open(&fx.join("reference/tiny.en-jfk.safetensors")).unwrap();
    let (_, enc) = refs.f32s("encoder_output").unwrap();
    let (_, tokens) = refs.f32s("tokens").unwrap();
    let (_, logits8) = refs.f32s("logits_first8").unwrap();
    let cross: HashMap<&str, T> = [(
        "encoder_output_embeds",
        T::new(
            &[1, d.d_model, 1, d.n_audio_ctx],
            transpose(&enc, d.n_audio_ctx, d.d_model),
        ),
    )]
    .into();
    let mut host = Host::new(&d);
    for t in 0..3 {
        let out = host.step(&m, tokens[t] as usize, t, &cross);
        let p = psnr(
            &logits8[t * d.vocab..(t + 1) * d.vocab],
            &out["logits"].data,
        );
        eprintln!(
            "tiny.en decoder graph (f32 evaluation) step {t} vs PyTorch: logits PSNR {p:.1} dB"
        );
        assert!(p >= 35.0, "step {t}: {p:.1} dB");
    }
    drop(host);

    let st = build_decoder(
        &d,
        &w,
        &opts(heads.clone(), chunks, KvCache::State, CrossKv::InGraph),
        Opset::Ios18,
    )
    .unwrap();
    let p = save_roundtrip(&st, dir.path(), "tiny.en-decoder-stateful");
    validate_stateful(&p, 4, 2);

    let ckv = build_cross_kv(&d, &w, Opset::Ios17).unwrap();
    let p = save_roundtrip(&ckv, dir.path(), "tiny.en-cross-kv");
    common::validate(&p);
    let dec = build_decoder(
        &d,
        &w,
        &opts(heads, chunks, KvCache::Io, CrossKv::Precomputed),
        Opset::Ios17,
    )
    .unwrap();
    let p = save_roundtrip(&dec, dir.path(), "tiny.en-decoder-cross-kv");
    common::validate(&p);
}

/// WhisperKit's context prefill: `.en` checkpoints are refused; a synthetic multilingual one
/// gives lookup rows equal to the reference decoder's caches for the forced prefix (on an
/// all-zero encoder output), at the row WhisperKit's task/language arithmetic selects.
#[test]
fn prefill_lookup_tables() {
    use milkit::whisper::config::GenerationConfig;
    use milkit::whisper::decoder_prefill::{build_prefill, PrefillSpec};
    if let Some(fx) = common::fixtures() {
        let g: GenerationConfig = serde_json::from_slice(
            &std::fs::read(fx.join("models/whisper-tiny.en/generation_config.json")).unwrap(),
        )
        .unwrap();
        let e = PrefillSpec::from_generation_config(&g).unwrap_err();
        assert!(format!("{e:#}").contains(".en"), "{e:#}");
    }
    let d = tiny_dims();
    let w = reference::synthetic(&d, 6);
    let langs: serde_json::Map<String, serde_json::Value> = (0..10)
        .map(|i| (format!("<|l{i}|>"), serde_json::json!(251 + i)))
        .collect();
    let g = serde_json::json!({
        "is_multilingual": true, "decoder_start_token_id": 250, "lang_to_id": langs,
        "task_to_id": {"translate": 261, "transcribe": 262}
    });
    let g: GenerationConfig = serde_json::from_value(g).unwrap();
    let spec = PrefillSpec::from_generation_config(&g).unwrap();
    assert_eq!(
        spec,
        PrefillSpec {
            sot: 250,
            first_language: 251,
            languages: 10,
            transcribe: 262,
            translate: 261
        }
    );
    let m = build_prefill(&d, &w, &spec, Opset::Ios16).unwrap();
    use ArrayDType::{F16, I32};
    assert_eq!(
        abi(&m.description.inputs),
        vec![f("task", I32, &[1]), f("language", I32, &[1])]
    );
    assert_eq!(
        abi(&m.description.outputs),
        vec![
            f("key_cache_prefill", F16, &[1, 128, 1, 3]),
            f("value_cache_prefill", F16, &[1, 128, 1, 3])
        ]
    );

    let r = RefDecoder::load(&d, &w).unwrap();
    let cross = r.cross_kv(&vec![0.0; d.n_audio_ctx * d.d_model]);
    for (task, lang, task_token) in [(0usize, 251usize, 262usize), (1, 255, 261), (1, 260, 261)] {
        let mut cache: reference::Kv = vec![(vec![], vec![]); d.layers];
        for (t, tok) in [250, lang, task_token].into_iter().enumerate() {
            r.step(tok, t, &cross, &mut cache, &[]);
        }
        let want_k = bc1s_layers(
            &cache.iter().map(|kv| kv.0.clone()).collect::<Vec<_>>(),
            d.d_model,
            3,
        );
        let want_v = bc1s_layers(
            &cache.iter().map(|kv| kv.1.clone()).collect::<Vec<_>>(),
            d.d_model,
            3,
        );
        let ins = [
            ("task", T::new(&[1], vec![task as f32])),
            ("language", T::new(&[1], vec![lang as f32])),
        ]
        .into();
        let out = run_f32(&m, &ins, &mut HashMap::new()).unwrap();
        let (pk, pv) = (
            psnr(&want_k.data, &out["key_cache_prefill"].data),
            psnr(&want_v.data, &out["value_cache_prefill"].data),
        );
        eprintln!("prefill (task {task}, language {lang}) vs reference: key PSNR {pk:.1} dB, value PSNR {pv:.1} dB");
        assert!(pk > 50.0 && pv > 50.0);
    }
    let dir = tempfile::tempdir().unwrap();
    let p = save_roundtrip(&m, dir.path(), "prefill");
    common::validate(&p);
}

/// The state ops as coremltools 9 serializes them (read_state, slice_update with a dynamic
/// begin, write_state + read_state for `coreml_update_state`) load with milkit's definitions,
/// every op re-inferred.
#[test]
fn coremltools_stateful_package_loads() {
    let (Some(_), Some(py)) = (common::fixtures(), common::python()) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let pkg = dir.path().join("ct-stateful.mlpackage");
    let script = r#"
import sys, numpy as np, coremltools as ct
from coremltools.converters.mil import Builder as mb
from coremltools.converters.mil.mil import types
@mb.program(input_specs=[mb.StateTensorSpec((1, 8, 1, 16), dtype=types.fp16),
                         mb.TensorSpec((1, 4, 1, 1), dtype=types.fp16),
                         mb.TensorSpec((1,), dtype=types.int32)], opset_version=ct.target.iOS18)
def prog(cache, x, pos):
    c = mb.read_state(input=cache)
    b = mb.concat(values=[np.array([0, 4, 0], dtype=np.int32), pos], axis=0)
    e = mb.add(x=b, y=np.array([1, 4, 1, 1], dtype=np.int32))
    u = mb.coreml_update_state(state=cache, value=mb.slice_update(x=c, update=x, begin=b, end=e))
    return mb.reduce_sum(x=u, axes=[3], keep_dims=True, name="y")
ct.convert(prog, convert_to="mlprogram", minimum_deployment_target=ct.target.iOS18,
           skip_model_load=True).save(sys.argv[1])
"#;
    let out = Command::new(py)
        .arg("-c")
        .arg(script)
        .arg(&pkg)
        .output()
        .expect("run python");
    assert!(
        out.status.success(),
        "coremltools: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let m = load_package(&pkg).unwrap_or_else(|e| panic!("load: {e:#}"));
    assert_eq!(m.description.states.len(), 1);
    let ops: Vec<&str> = m
        .program
        .main()
        .unwrap()
        .block
        .walk()
        .iter()
        .map(|o| o.op_type.as_str())
        .collect();
    for t in ["read_state", "slice_update", "write_state"] {
        assert!(ops.contains(&t), "{t} missing from {ops:?}");
    }
}
