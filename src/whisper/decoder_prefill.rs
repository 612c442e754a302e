//! WhisperKit's `TextDecoderContextPrefill` for multilingual Whisper: the self-attention
//! key/value caches of the forced prefix `<|startoftranscript|> <|lang|> <|task|>` for every
//! (language, task) pair, precomputed here and stored as two lookup tables; the model maps
//! `task` (0 transcribe, 1 translate) and `language` (the language token id) to row
//! `2·(language − first_language) + task` and returns it as [1, d·layers, 1, 3].
//!
//! The caches of layers above the first depend weakly on the audio through cross-attention;
//! WhisperKit estimates them as a mean over random encoder outputs. We condition on an
//! all-zero encoder output instead: no k_proj bias means every cross-attention key is zero,
//! the weights are uniform and the context is exactly the v_proj bias — deterministic, and
//! free of the 1500-position projections.

use super::config::GenerationConfig;
use super::decoder_spec::{finish_model, DecoderDims};
use super::graph::WeightSource;
use crate::ir::{ArrayDType, Description, Feature, Model, Opset, Tensor, Value, ValueType};
use crate::ops::builder::{int, ints};
use crate::ops::{Builder, In};
use anyhow::{bail, ensure, Context, Result};
use half::f16;
use rayon::prelude::*;

/// The prefix tokens of a multilingual checkpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PrefillSpec {
    /// `<|startoftranscript|>`
    pub sot: usize,
    /// Id of the first language token (`<|en|>`); languages are contiguous from here.
    pub first_language: usize,
    pub languages: usize,
    pub transcribe: usize,
    pub translate: usize,
}

/// Number of forced prefix tokens (sot, language, task).
pub const PREFILL_LEN: usize = 3;

impl PrefillSpec {
    /// From a generation config (`is_multilingual`, `decoder_start_token_id`, `lang_to_id`,
    /// `task_to_id`). English-only checkpoints have no language or task tokens: an error.
    pub fn from_generation_config(g: &GenerationConfig) -> Result<PrefillSpec> {
        let Some(langs) = g
            .lang_to_id
            .as_ref()
            .filter(|_| g.is_multilingual != Some(false))
        else {
            bail!(
                "the decoder context prefill needs a multilingual checkpoint: English-only (.en) models \
                 have no language or task tokens, their prefix is just <|startoftranscript|>"
            );
        };
        let id = |v: Option<u32>, what: &str| -> Result<usize> {
            v.map(|x| x as usize)
                .with_context(|| format!("generation_config.json: no {what}"))
        };
        let mut ids: Vec<usize> = langs.values().map(|&v| v as usize).collect();
        ids.sort_unstable();
        ensure!(
            !ids.is_empty(),
            "generation_config.json: lang_to_id is empty"
        );
        ensure!(
            ids.windows(2).all(|w| w[1] == w[0] + 1),
            "generation_config.json: language token ids are not contiguous"
        );
        let task = |t: &str| g.task_to_id.as_ref().and_then(|m| m.get(t).copied());
        Ok(PrefillSpec {
            sot: id(g.decoder_start_token_id, "decoder_start_token_id")?,
            first_language: ids[0],
            languages: ids.len(),
            transcribe: id(task("transcribe"), "task_to_id.transcribe")?,
            translate: id(task("translate"), "task_to_id.translate")?,
        })
    }

    /// Prefix tokens of lookup row `row` (= 2·language index + task).
    pub fn prefix(&self, row: usize) -> [usize; PREFILL_LEN] {
        let task = if row.is_multiple_of(2) {
            self.transcribe
        } else {
            self.translate
        };
        [self.sot, self.first_language + row / 2, task]
    }
}

fn load(w: &dyn WeightSource, name: &str, n: usize) -> Result<Vec<f32>> {
    let (s, b) = w.f16(name)?;
    ensure!(
        s.iter().product::<usize>() == n,
        "{name} has shape {s:?}, expected {n} elements"
    );
    Ok(b.to_f16_vec().iter().map(|x| x.to_f32()).collect())
}

fn linear(w: &[f32], b: Option<&[f32]>, x: &[f32]) -> Vec<f32> {
    let cols = x.len();
    w.chunks_exact(cols)
        .enumerate()
        .map(|(r, row)| {
            row.iter().zip(x).map(|(a, v)| a * v).sum::<f32>() + b.map_or(0.0, |b| b[r])
        })
        .collect()
}

fn layer_norm(x: &[f32], g: &[f32], b: &[f32]) -> Vec<f32> {
    let n = x.len() as f32;
    let mean = x.iter().sum::<f32>() / n;
    let var = x.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / n;
    let inv = 1.0 / (var + 1e-5).sqrt();
    x.iter()
        .enumerate()
        .map(|(i, v)| (v - mean) * inv * g[i] + b[i])
        .collect()
}

/// erf in f64: Taylor series for |x| < 3 (80 terms reach ~1e-13), else the continued
/// fraction of erfc, which converges quickly there.
fn erf(x: f64) -> f64 {
    let sqrt_pi = std::f64::consts::PI.sqrt();
    if x.abs() < 3.0 {
        let (mut term, mut sum) = (x, x);
        for n in 1..80 {
            term *= -x * x / n as f64;
            sum += term / (2 * n + 1) as f64;
        }
        return sum * 2.0 / sqrt_pi;
    }
    let z = x.abs();
    let f = (1..60).rev().fold(0.0, |f, k| (k as f64 / 2.0) / (z + f));
    let erfc = (-z * z).exp() / sqrt_pi / (z + f);
    (1.0 - erfc).copysign(x)
}

/// Exact GELU, as the graphs' `gelu` (mode EXACT).
fn gelu(x: f32) -> f32 {
    (0.5 * x as f64 * (1.0 + erf(x as f64 / std::f64::consts::SQRT_2))) as f32
}

/// One prefix position: its token and the node of the previous position. The prefixes share
/// their first token and, per language, their second, so they form a tree of
/// 1 + languages + 2·languages nodes instead of 6·languages positions.
struct Node {
    token: usize,
    parent: Option<usize>,
}

fn tree(spec: &PrefillSpec) -> Vec<Node> {
    let n = spec.languages;
    let mut nodes = vec![Node {
        token: spec.sot,
        parent: None,
    }];
    nodes.extend((0..n).map(|i| Node {
        token: spec.first_language + i,
        parent: Some(0),
    }));
    nodes.extend((0..2 * n).map(|r| Node {
        token: spec.prefix(r)[2],
        parent: Some(1 + r / 2),
    }));
    nodes
}

/// The node chain (position 0 first) ending at `n`.
fn chain(nodes: &[Node], n: usize) -> Vec<usize> {
    let mut c = vec![n];
    while let Some(p) = nodes[*c.last().unwrap_or(&n)].parent {
        c.push(p);
    }
    c.reverse();
    c
}

/// Self-attention keys and values of every tree node, per layer: [layers][nodes][d].
#[allow(clippy::type_complexity)]
fn tree_kv(
    d: &DecoderDims,
    w: &dyn WeightSource,
    nodes: &[Node],
) -> Result<(Vec<Vec<Vec<f32>>>, Vec<Vec<Vec<f32>>>)> {
    let (dm, p) = (d.d_model, "model.decoder");
    let te = w.f16(&format!("{p}.embed_tokens.weight"))?.1.to_f16_vec();
    let pe = w
        .f16(&format!("{p}.embed_positions.weight"))?
        .1
        .to_f16_vec();
    let chains: Vec<Vec<usize>> = (0..nodes.len()).map(|n| chain(nodes, n)).collect();
    let mut hs: Vec<Vec<f32>> = nodes
        .iter()
        .zip(&chains)
        .map(|(nd, c)| {
            let t = c.len() - 1;
            (0..dm)
                .map(|i| te[nd.token * dm + i].to_f32() + pe[t * dm + i].to_f32())
                .collect()
        })
        .collect();
    let hd = dm / d.heads;
    let scale = 1.0 / (hd as f32).sqrt();
    let (mut ks, mut vs) = (vec![], vec![]);
    for l in 0..d.layers {
        let lp = format!("{p}.layers.{l}");
        let g = |n: &str, len: usize| load(w, &format!("{lp}.{n}"), len);
        let (l1g, l1b) = (
            g("self_attn_layer_norm.weight", dm)?,
            g("self_attn_layer_norm.bias", dm)?,
        );
        let (qw, qb) = (
            g("self_attn.q_proj.weight", dm * dm)?,
            g("self_attn.q_proj.bias", dm)?,
        );
        let kw = g("self_attn.k_proj.weight", dm * dm)?;
        let (vw, vb) = (
            g("self_attn.v_proj.weight", dm * dm)?,
            g("self_attn.v_proj.bias", dm)?,
        );
        let (ow, ob) = (
            g("self_attn.out_proj.weight", dm * dm)?,
            g("self_attn.out_proj.bias", dm)?,
        );
        // Zero encoder output: the cross-attention context is the v_proj bias for every query,
        // so its output is a constant and encoder_attn_layer_norm does not matter.
        let cross = linear(
            &g("encoder_attn.out_proj.weight", dm * dm)?,
            Some(&g("encoder_attn.out_proj.bias", dm)?),
            &g("encoder_attn.v_proj.bias", dm)?,
        );
        let (l3g, l3b) = (
            g("final_layer_norm.weight", dm)?,
            g("final_layer_norm.bias", dm)?,
        );
        let (f1w, f1b) = (g("fc1.weight", d.ffn * dm)?, g("fc1.bias", d.ffn)?);
        let (f2w, f2b) = (g("fc2.weight", dm * d.ffn)?, g("fc2.bias", dm)?);
        let qkv: Vec<(Vec<f32>, Vec<f32>, Vec<f32>)> = hs
            .par_iter()
            .map(|h| {
                let x = layer_norm(h, &l1g, &l1b);
                (
                    linear(&qw, Some(&qb), &x),
                    linear(&kw, None, &x),
                    linear(&vw, Some(&vb), &x),
                )
            })
            .collect();
        hs.par_iter_mut().enumerate().for_each(|(n, h)| {
            let q = &qkv[n].0;
            let mut ctx = vec![0.0; dm];
            for hh in 0..d.heads {
                let r = hh * hd..(hh + 1) * hd;
                // Causal attention over this prefix's own earlier positions and itself.
                let s: Vec<f32> = chains[n]
                    .iter()
                    .map(|&j| {
                        q[r.clone()]
                            .iter()
                            .zip(&qkv[j].1[r.clone()])
                            .map(|(a, b)| a * b)
                            .sum::<f32>()
                            * scale
                    })
                    .collect();
                let m = s.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
                let e: Vec<f32> = s.iter().map(|x| (x - m).exp()).collect();
                let z: f32 = e.iter().sum();
                for (ej, &j) in e.iter().zip(&chains[n]) {
                    for c in r.clone() {
                        ctx[c] += ej / z * qkv[j].2[c];
                    }
                }
            }
            h.iter_mut()
                .zip(linear(&ow, Some(&ob), &ctx))
                .for_each(|(a, b)| *a += b);
            h.iter_mut().zip(&cross).for_each(|(a, b)| *a += b);
            let x = layer_norm(h, &l3g, &l3b);
            let f: Vec<f32> = linear(&f1w, Some(&f1b), &x).into_iter().map(gelu).collect();
            h.iter_mut()
                .zip(linear(&f2w, Some(&f2b), &f))
                .for_each(|(a, b)| *a += b);
        });
        let (k, v): (Vec<_>, Vec<_>) = qkv.into_iter().map(|(_, k, v)| (k, v)).unzip();
        ks.push(k);
        vs.push(v);
    }
    Ok((ks, vs))
}

/// Flattens per-layer [positions][d] rows as a [1, d·layers, 1, positions] tensor would be.
fn bc1s(layers: &[Vec<f32>], dm: usize, n: usize) -> Vec<f16> {
    let mut out = vec![f16::ZERO; layers.len() * dm * n];
    for (l, rows) in layers.iter().enumerate() {
        for t in 0..n {
            for c in 0..dm {
                out[(l * dm + c) * n + t] = f16::from_f32(rows[t * dm + c]);
            }
        }
    }
    out
}

/// The lookup tables' rows: for each (language, task) row, the key and value caches of the
/// prefix as a flattened [1, d·layers, 1, 3].
pub fn prefill_tables(
    d: &DecoderDims,
    w: &dyn WeightSource,
    spec: &PrefillSpec,
) -> Result<(Vec<f16>, Vec<f16>)> {
    ensure!(
        spec.languages > 0,
        "the prefill needs at least one language"
    );
    let rows = 2 * spec.languages;
    for r in [0, rows - 1] {
        for t in spec.prefix(r) {
            ensure!(
                t < d.vocab,
                "prefix token {t} is outside the vocabulary of {}",
                d.vocab
            );
        }
    }
    let nodes = tree(spec);
    let (k, v) = tree_kv(d, w, &nodes)?;
    let (mut kt, mut vt) = (vec![], vec![]);
    for r in 0..rows {
        let c = chain(&nodes, 1 + spec.languages + r);
        let pick = |per_layer: &Vec<Vec<Vec<f32>>>| -> Vec<Vec<f32>> {
            per_layer
                .iter()
                .map(|nodes_kv| {
                    c.iter()
                        .flat_map(|&n| nodes_kv[n].iter().copied())
                        .collect()
                })
                .collect()
        };
        kt.extend(bc1s(&pick(&k), d.d_model, PREFILL_LEN));
        vt.extend(bc1s(&pick(&v), d.d_model, PREFILL_LEN));
    }
    Ok((kt, vt))
}

/// Builds the `TextDecoderContextPrefill` model: `task` int32 [1], `language` int32 [1] →
/// `key_cache_prefill`, `value_cache_prefill` fp16 [1, d·layers, 1, 3].
pub fn build_prefill(
    d: &DecoderDims,
    w: &dyn WeightSource,
    spec: &PrefillSpec,
    opset: Opset,
) -> Result<Model> {
    let dl = d.d_model * d.layers;
    let width = dl * PREFILL_LEN;
    let rows = 2 * spec.languages;
    let (kt, vt) = prefill_tables(d, w, spec)?;
    let fin = vec![
        Feature::new("task", ArrayDType::I32, &[1]),
        Feature::new("language", ArrayDType::I32, &[1]),
    ];
    let fout: Vec<Feature> = ["key_cache_prefill", "value_cache_prefill"]
        .iter()
        .map(|n| Feature::new(n, ArrayDType::F16, &[1, dl, 1, PREFILL_LEN]))
        .collect();
    let mut b = Builder::new(opset);
    let task = b.input("task", ValueType::Tensor(fin[0].tensor_type()));
    let lang = b.input("language", ValueType::Tensor(fin[1].tensor_type()));
    let li = b.op1(
        "sub",
        "language_index",
        vec![
            ("x", In::V(lang)),
            ("y", ints(&[spec.first_language as i32])),
        ],
    )?;
    let li2 = b.op1(
        "mul",
        "language_row",
        vec![("x", In::V(li)), ("y", ints(&[2]))],
    )?;
    let row = b.op1(
        "add",
        "task_row",
        vec![("x", In::V(li2)), ("y", In::V(task))],
    )?;
    let mut outs = vec![];
    for (name, table) in [("key_cache_lut", kt), ("value_cache_lut", vt)] {
        let t = b.konst(name, Value::Tensor(Tensor::f16(&[rows, width], &table)));
        let g = b.op1(
            "gather",
            &format!("{name}_row"),
            vec![
                ("x", In::V(t)),
                ("indices", In::V(row.clone())),
                ("axis", int(0)),
            ],
        )?;
        outs.push(b.reshape(
            &format!("{name}_bc1s"),
            &g,
            &[1, dl as i32, 1, PREFILL_LEN as i32],
        )?);
    }
    let named: Vec<(crate::ops::V, &str)> = outs
        .into_iter()
        .zip(fout.iter().map(|f| f.name.as_str()))
        .collect();
    let (inputs, block) = b.finish(&named)?;
    let mut description = Description {
        inputs: fin,
        outputs: fout,
        ..Default::default()
    };
    description.short_description = format!(
        "Whisper decoder context prefill: KV caches of <|startoftranscript|> <|lang|> <|task|> for {} languages × 2 tasks, fp16",
        spec.languages
    );
    Ok(finish_model("prefill", inputs, block, opset, description))
}
