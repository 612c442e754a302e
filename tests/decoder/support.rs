//! Test support for tests/decoder.rs: dimensions and options, ABI helpers, save/reload,
//! the validator run for stateful packages, and WhisperKit's host loop driving a decoder graph
//! step by step (run by milkit's runtime with fp16 widened to f32, `--compute fp32`) next to
//! the f32 reference.

use super::common;
use super::reference::{self, psnr, RefDecoder};
use anyhow::{anyhow, Result};
use milkit::ir::{ArrayDType, Model};
use milkit::package::{load_package, save_package};
use milkit::runtime::{precision::Compute, Options, Session, Tensor};
use milkit::whisper::decoder::{CrossKv, DecoderDims, DecoderOptions, KvCache, MASK_HIDDEN};
use std::collections::HashMap;
use std::path::Path;
use std::process::Command;

pub fn tiny_dims() -> DecoderDims {
    // head_dim 32: 1/sqrt(32) is not a power of two, so the query scale stays a `mul`.
    DecoderDims {
        d_model: 64,
        layers: 2,
        heads: 2,
        ffn: 128,
        vocab: 300,
        n_text_ctx: 448,
        n_audio_ctx: 1500,
    }
}

pub fn tiny_en_dims(fx: &Path) -> DecoderDims {
    let c: serde_json::Value = serde_json::from_slice(
        &std::fs::read(fx.join("models/whisper-tiny.en/config.json")).unwrap(),
    )
    .unwrap();
    let u = |k: &str| {
        c[k].as_u64()
            .unwrap_or_else(|| panic!("config.json lacks {k}")) as usize
    };
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

pub fn tiny_en_heads(fx: &Path) -> Vec<(usize, usize)> {
    common::alignment_heads(&fx.join("models/whisper-tiny.en"))
}

pub fn opts(
    heads: Vec<(usize, usize)>,
    chunks: usize,
    kv: KvCache,
    cross: CrossKv,
) -> DecoderOptions {
    DecoderOptions {
        alignment_heads: heads,
        per_head_alignment: false,
        head_chunks: chunks,
        kv_cache: kv,
        cross_kv: cross,
    }
}

/// (name, dtype, shape) of a feature list.
pub fn abi(fs: &[milkit::ir::Feature]) -> Vec<(String, ArrayDType, Vec<usize>)> {
    fs.iter()
        .map(|f| (f.name.clone(), f.dtype, f.shape.clone()))
        .collect()
}

pub fn f(name: &str, dt: ArrayDType, shape: &[usize]) -> (String, ArrayDType, Vec<usize>) {
    (name.to_string(), dt, shape.to_vec())
}

/// Saves, reloads (every op re-inferred; must equal the built model) and returns the path.
pub fn save_roundtrip(m: &Model, dir: &Path, name: &str) -> std::path::PathBuf {
    let p = dir.join(format!("{name}.mlpackage"));
    save_package(m, &p, false, &mut |_| {}).unwrap_or_else(|e| panic!("save {name}: {e:#}"));
    let back = load_package(&p).unwrap_or_else(|e| panic!("reload {name}: {e:#}"));
    assert!(
        back == *m,
        "{name}: reloaded model differs from the built one"
    );
    p
}

/// Runs the validator on a stateful package. coremltools 9 itself writes states only in the
/// description's `state` list (not `input`), and validate_mlpackage.py compares the number of
/// description inputs with all function inputs, states included — so it rejects even
/// coremltools' own stateful packages with exactly "N description inputs vs N+k function
/// inputs". Every other check (load with type re-inference, prog.validate, names, shapes,
/// dtypes, opsets) runs before that verdict, and all problems are reported together, so an
/// error equal to that single message means everything else passed.
pub fn validate_stateful(pkg: &Path, n_inputs: usize, n_states: usize) {
    let (Some(fx), Some(py)) = (common::fixtures(), common::python()) else {
        return;
    };
    let out = Command::new(py)
        .arg(fx.join("tools/validate_mlpackage.py"))
        .arg(pkg)
        .arg("--materialize")
        .output()
        .expect("run validator");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("validator JSON");
    if report["ok"] == true {
        return;
    }
    let known = format!(
        "AssertionError: {n_inputs} description inputs vs {} function inputs",
        n_inputs + n_states
    );
    assert_eq!(
        report["error"].as_str(),
        Some(known.as_str()),
        "validator rejected {} for another reason:\n{}",
        pkg.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!(
        "validator: {} passes every check except its state-count comparison",
        pkg.display()
    );
}

/// Encoder output for the synthetic model, [n_audio][d] (position-major) and as the graph's
/// [1, d, 1, n_audio] input.
pub fn synthetic_encoder(d: &DecoderDims) -> (Vec<f32>, T) {
    let rows: Vec<f32> = (0..d.n_audio_ctx * d.d_model)
        .map(|i| ((i * 7919 % 1009) as f32 / 1009.0 - 0.5) * 2.0)
        .collect();
    (
        rows.clone(),
        T::new(
            &[1, d.d_model, 1, d.n_audio_ctx],
            transpose(&rows, d.n_audio_ctx, d.d_model),
        ),
    )
}

pub fn transpose(x: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut t = vec![0.0; x.len()];
    for r in 0..rows {
        for c in 0..cols {
            t[c * rows + r] = x[r * cols + c];
        }
    }
    t
}

/// Flattens per-layer [positions][d] rows into a [1, d·layers, 1, positions] tensor.
pub fn bc1s_layers(kv: &[Vec<f32>], d: usize, positions: usize) -> T {
    let mut data = vec![];
    for rows in kv {
        data.extend(transpose(rows, positions, d));
    }
    T::new(&[1, d * kv.len(), 1, positions], data)
}

/// WhisperKit's host loop around the cache-I/O decoder: per step the update mask marks the
/// current position, the padding mask opens positions 0..=t, and the returned updates are
/// written into the caches at t. The stateful decoder gets the same masks and no caches.
pub struct Host {
    d: DecoderDims,
    key: T,
    value: T,
    states: HashMap<String, T>,
}

impl Host {
    pub fn new(d: &DecoderDims) -> Host {
        let shape = [1, d.d_model * d.layers, 1, d.n_text_ctx];
        let z = T::new(&shape, vec![0.0; shape.iter().product()]);
        let states = [
            ("key_cache".to_string(), z.clone()),
            ("value_cache".to_string(), z.clone()),
        ]
        .into();
        Host {
            d: d.clone(),
            key: z.clone(),
            value: z,
            states,
        }
    }

    pub fn step(
        &mut self,
        m: &Model,
        token: usize,
        t: usize,
        cross: &HashMap<&str, T>,
    ) -> HashMap<String, T> {
        let s = self.d.n_text_ctx;
        let mut ins: HashMap<&str, T> = cross.clone();
        ins.insert("input_ids", T::new(&[1], vec![token as f32]));
        ins.insert("cache_length", T::new(&[1], vec![t as f32]));
        ins.insert(
            "decoder_key_padding_mask",
            T::new(
                &[1, s],
                (0..s)
                    .map(|j| if j <= t { 0.0 } else { MASK_HIDDEN })
                    .collect(),
            ),
        );
        let stateful = !m.description.states.is_empty();
        if !stateful {
            ins.insert(
                "kv_cache_update_mask",
                T::new(&[1, s], (0..s).map(|j| (j == t) as u8 as f32).collect()),
            );
            ins.insert("key_cache", self.key.clone());
            ins.insert("value_cache", self.value.clone());
        }
        let out = run_f32(m, &ins, &mut self.states)
            .unwrap_or_else(|e| panic!("evaluate step {t}: {e:#}"));
        if !stateful {
            for (cache, upd) in [
                (&mut self.key, &out["key_cache_updates"]),
                (&mut self.value, &out["value_cache_updates"]),
            ] {
                for c in 0..upd.data.len() {
                    cache.data[c * s + t] = upd.data[c];
                }
            }
        }
        out
    }
}

/// A host-side f32 tensor (integers ride along as f32, exact below 2^24).
#[derive(Clone, Debug)]
pub struct T {
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
}

impl T {
    pub fn new(shape: &[usize], data: Vec<f32>) -> T {
        assert_eq!(
            shape.iter().product::<usize>(),
            data.len(),
            "shape/data mismatch"
        );
        T {
            shape: shape.to_vec(),
            data,
        }
    }

    fn to_tensor(&self, dtype: milkit::ir::DType) -> Result<Tensor> {
        let dev = candle_core::Device::Cpu;
        Ok(if dtype.is_float() {
            Tensor::from_vec(self.data.clone(), self.shape.as_slice(), &dev)?
        } else {
            let v: Vec<i32> = self.data.iter().map(|&x| x as i32).collect();
            Tensor::from_vec(v, self.shape.as_slice(), &dev)?
        })
    }

    fn from_tensor(t: &Tensor) -> Result<T> {
        let data = t
            .to_dtype(candle_core::DType::F32)?
            .flatten_all()?
            .to_vec1::<f32>()?;
        Ok(T::new(t.dims(), data))
    }
}

/// Runs `m` once with milkit's runtime, every fp16 tensor widened to f32 (`--compute fp32`)
/// so that the graph, not fp16 rounding, is compared with the f32 reference. `states` holds
/// the state tensors by name: read before the call, written back after it.
pub fn run_f32(
    m: &Model,
    inputs: &HashMap<&str, T>,
    states: &mut HashMap<String, T>,
) -> Result<HashMap<String, T>> {
    let opts = Options {
        compute: Compute::Fp32,
        ..Options::default()
    };
    let mut s = Session::from_model_with(m.clone(), &opts)?;
    let mut feeds = vec![];
    for (name, ty) in s.inputs(None)? {
        if matches!(ty, milkit::ir::ValueType::State(_)) {
            continue;
        }
        let tt = ty
            .as_tensor()
            .ok_or_else(|| anyhow!("input {name} is not a tensor"))?;
        let t = inputs
            .get(name.as_str())
            .ok_or_else(|| anyhow!("missing input {name}"))?;
        feeds.push((name, t.to_tensor(tt.dtype)?));
    }
    let state_names: Vec<String> = s.state_names().iter().map(|n| n.to_string()).collect();
    for n in &state_names {
        if let Some(t) = states.get(n) {
            let d = s
                .state(n)
                .map(|z| z.dtype())
                .unwrap_or(candle_core::DType::F32);
            s.set_state(n, t.to_tensor(milkit::ir::DType::F32)?.to_dtype(d)?)?;
        }
    }
    let feeds: Vec<(&str, Tensor)> = feeds.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
    let out = s.predict(&feeds)?;
    for n in &state_names {
        if let Some(t) = s.state(n) {
            states.insert(n.clone(), T::from_tensor(&t)?);
        }
    }
    out.iter()
        .map(|(n, t)| Ok((n.clone(), T::from_tensor(t)?)))
        .collect()
}

pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Runs `steps` tokens through `m` and the reference; returns the worst logits PSNR and checks
/// cache updates and alignment weights along the way.
pub fn compare_with_reference(
    m: &Model,
    r: &RefDecoder,
    d: &DecoderDims,
    heads: &[(usize, usize)],
    tokens: &[usize],
    enc_rows: &[f32],
    cross_inputs: &HashMap<&str, T>,
) -> f64 {
    let cross = r.cross_kv(enc_rows);
    let mut cache: reference::Kv = vec![(vec![], vec![]); d.layers];
    let mut host = Host::new(d);
    let mut worst = f64::INFINITY;
    for (t, &tok) in tokens.iter().enumerate() {
        let want = r.step(tok, t, &cross, &mut cache, heads);
        let got = host.step(m, tok, t, cross_inputs);
        let p = psnr(&want.logits, &got["logits"].data);
        worst = worst.min(p);
        if let Some(k) = got.get("key_cache_updates") {
            let wk: Vec<f32> = want.k_new.concat();
            let wv: Vec<f32> = want.v_new.concat();
            assert!(psnr(&wk, &k.data) > 60.0, "key_cache_updates at step {t}");
            assert!(
                psnr(&wv, &got["value_cache_updates"].data) > 60.0,
                "value_cache_updates at step {t}"
            );
        }
        if !heads.is_empty() {
            let a = &got["alignment_heads_weights"].data;
            assert!(
                max_abs_diff(&want.alignment, a) < 1e-4,
                "alignment weights at step {t}"
            );
            let total: f32 = a.iter().sum();
            assert!(
                (total - 1.0).abs() < 1e-3,
                "alignment weights sum to {total}"
            );
        }
    }
    worst
}
