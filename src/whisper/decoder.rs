//! The Whisper text decoder as fp16 MIL programs in BC1S layout, one token per call, with
//! WhisperKit's `TextDecoder` I/O ABI: the self-attention caches of all layers concatenated
//! on the channel axis ([1, d_model·layers, 1, 448]), merged with the new token's key/value
//! in-graph by a mask blend, an additive padding mask (0 visible, −1e4 hidden), cross-attention
//! on the encoder output, an untied vocabulary head (its own `lm_head` constant, optionally in
//! row chunks) and the mean cross-attention weights of the alignment heads.
//!
//! Variants: the caches as Core ML states (iOS18), and cross-attention keys/values computed
//! once per audio window by a separate CrossKV model. The forced-prefix cache lookup table
//! (WhisperKit's TextDecoderContextPrefill) lives in `decoder_prefill`; graph pieces and the
//! CrossKV model in `decoder_parts`;
//! the dimensions, options and names every decoder-side builder shares in `decoder_spec`.

pub use super::decoder_parts::build_cross_kv;
use super::decoder_parts::{embed, head, key_value, query, split_layers, vec1, w4, SelfKv};
pub(crate) use super::decoder_spec::finish_model;
use super::decoder_spec::{check, head_op_names, HEAD_OPS_KEY, P};
pub use super::decoder_spec::{
    CrossKv, DecoderDims, DecoderOptions, KvCache, CROSS_KV_NAMES, PER_HEAD_ALIGNMENT_OUTPUT,
};
use super::graph::{attention, WeightSource};
use crate::ir::{ArrayDType, Description, Feature, Model, Opset, Value, ValueType};
use crate::ops::builder::{int, ints};
use crate::ops::{Builder, In, V};
use anyhow::{Context, Result};

/// Largest head chunk the Neural Engine takes comfortably (whisper.cpp's split size).
pub const ANE_MAX_HEAD_ROWS: usize = 16_384;

/// Fewest chunks that keep every head chunk within [`ANE_MAX_HEAD_ROWS`] rows.
pub fn min_head_chunks(vocab: usize) -> usize {
    vocab.div_ceil(ANE_MAX_HEAD_ROWS).max(1)
}

/// The additive padding-mask value WhisperKit uses for hidden positions.
pub const MASK_HIDDEN: f32 = -1e4;
pub(super) const LN_EPS: f32 = 1e-5;

/// The ABI of one decoder variant: description inputs, states and outputs, in order.
pub fn decoder_features(
    d: &DecoderDims,
    o: &DecoderOptions,
) -> (Vec<Feature>, Vec<Feature>, Vec<Feature>) {
    let dl = d.d_model * d.layers;
    let s = d.n_text_ctx;
    let mut inputs = vec![
        Feature::new("input_ids", ArrayDType::I32, &[1]),
        Feature::new("cache_length", ArrayDType::I32, &[1]),
    ];
    let mut states = vec![];
    match o.kv_cache {
        KvCache::Io => {
            inputs.push(Feature::new("key_cache", ArrayDType::F16, &[1, dl, 1, s]));
            inputs.push(Feature::new("value_cache", ArrayDType::F16, &[1, dl, 1, s]));
            inputs.push(Feature::new(
                "kv_cache_update_mask",
                ArrayDType::F16,
                &[1, s],
            ));
        }
        KvCache::State => {
            states.push(Feature::new("key_cache", ArrayDType::F16, &[1, dl, 1, s]));
            states.push(Feature::new("value_cache", ArrayDType::F16, &[1, dl, 1, s]));
        }
    }
    match o.cross_kv {
        CrossKv::InGraph => inputs.push(Feature::new(
            "encoder_output_embeds",
            ArrayDType::F16,
            &[1, d.d_model, 1, d.n_audio_ctx],
        )),
        CrossKv::Precomputed => {
            for n in CROSS_KV_NAMES {
                inputs.push(Feature::new(n, ArrayDType::F16, &[1, dl, 1, d.n_audio_ctx]));
            }
        }
    }
    inputs.push(Feature::new(
        "decoder_key_padding_mask",
        ArrayDType::F16,
        &[1, s],
    ));
    let mut outputs = vec![Feature::new("logits", ArrayDType::F16, &[1, 1, d.vocab])];
    if o.kv_cache == KvCache::Io {
        outputs.push(Feature::new(
            "key_cache_updates",
            ArrayDType::F16,
            &[1, dl, 1, 1],
        ));
        outputs.push(Feature::new(
            "value_cache_updates",
            ArrayDType::F16,
            &[1, dl, 1, 1],
        ));
    }
    if !o.alignment_heads.is_empty() {
        outputs.push(Feature::new(
            "alignment_heads_weights",
            ArrayDType::F16,
            &[1, d.n_audio_ctx],
        ));
        if o.per_head_alignment {
            outputs.push(Feature::new(
                PER_HEAD_ALIGNMENT_OUTPUT,
                ArrayDType::F16,
                &[1, o.alignment_heads.len(), d.n_audio_ctx],
            ));
        }
    }
    (inputs, states, outputs)
}

/// Builds the one-token decoder program (see the module doc and [`DecoderOptions`]).
pub fn build_decoder(
    dims: &DecoderDims,
    w: &dyn WeightSource,
    opts: &DecoderOptions,
    opset: Opset,
) -> Result<Model> {
    check(dims, opts, opset)?;
    let (d, s, l_n) = (dims.d_model, dims.n_text_ctx, dims.layers);
    let (fin, fstates, fout) = decoder_features(dims, opts);
    let mut b = Builder::new(opset);
    let mut vars = std::collections::HashMap::new();
    for f in &fin {
        vars.insert(
            f.name.clone(),
            b.input(&f.name, ValueType::Tensor(f.tensor_type())),
        );
    }
    for f in &fstates {
        vars.insert(
            f.name.clone(),
            b.input(&f.name, ValueType::State(f.tensor_type())),
        );
    }
    let var = |n: &str| {
        vars.get(n)
            .cloned()
            .with_context(|| format!("decoder input `{n}` missing"))
    };

    // Token + position embedding → [1, d, 1, 1].
    let tok = embed(&mut b, w, "embed_tokens", dims.vocab, d, &var("input_ids")?)?;
    let pos = embed(&mut b, w, "embed_positions", s, d, &var("cache_length")?)?;
    let h = b.add("embed", &tok, &pos)?;
    let mut h = b.reshape("embed_bc1s", &h, &[1, d as i32, 1, 1])?;

    let pad = b.reshape(
        "decoder_key_padding_mask_4d",
        &var("decoder_key_padding_mask")?,
        &[1, 1, 1, s as i32],
    )?;
    let self_kv = match opts.kv_cache {
        KvCache::Io => {
            let mask = b.reshape(
                "kv_cache_update_mask_4d",
                &var("kv_cache_update_mask")?,
                &[1, 1, 1, s as i32],
            )?;
            let keep = b.op1(
                "sub",
                "kv_cache_keep_mask",
                vec![
                    ("x", In::C(Value::f16_scalar(1.0))),
                    ("y", In::V(mask.clone())),
                ],
            )?;
            let keys = split_layers(&mut b, "key_cache_layers", &var("key_cache")?, l_n)?;
            let values = split_layers(&mut b, "value_cache_layers", &var("value_cache")?, l_n)?;
            SelfKv::Blend {
                keys,
                values,
                mask,
                keep,
            }
        }
        KvCache::State => SelfKv::State {
            key: var("key_cache")?,
            value: var("value_cache")?,
            pos: var("cache_length")?,
            d,
            len: s,
        },
    };
    let cross: Option<(Vec<V>, Vec<V>)> = match opts.cross_kv {
        CrossKv::InGraph => None,
        CrossKv::Precomputed => Some((
            split_layers(
                &mut b,
                "encoder_attn_key_layers",
                &var(CROSS_KV_NAMES[0])?,
                l_n,
            )?,
            split_layers(
                &mut b,
                "encoder_attn_value_layers",
                &var(CROSS_KV_NAMES[1])?,
                l_n,
            )?,
        )),
    };

    let mut k_updates = vec![];
    let mut v_updates = vec![];
    let mut align = vec![];
    for l in 0..l_n {
        let lp = format!("{P}.layers.{l}");
        let n = format!("layers_{l}");
        let ln_w = |b: &mut Builder, what: &str, x: &V| -> Result<V> {
            b.layer_norm(
                &format!("{n}_{what}"),
                x,
                &[1],
                vec1(w, &format!("{lp}.{what}.weight"), d)?,
                vec1(w, &format!("{lp}.{what}.bias"), d)?,
                Value::f16_scalar(LN_EPS),
            )
        };
        let out_proj = |b: &mut Builder, what: &str, x: &V| -> Result<V> {
            b.conv(
                &format!("{n}_{what}_out_proj"),
                x,
                w4(w, &format!("{lp}.{what}.out_proj.weight"), d, d)?,
                Some(vec1(w, &format!("{lp}.{what}.out_proj.bias"), d)?),
            )
        };

        // Self-attention over the cache with this token merged in.
        let x = ln_w(&mut b, "self_attn_layer_norm", &h)?;
        let q = query(
            &mut b,
            &format!("{n}_self_attn_q_proj"),
            &x,
            w,
            &format!("{lp}.self_attn.q_proj"),
            d,
            dims.heads,
        )?;
        let (k, v) = key_value(
            &mut b,
            &format!("{n}_self_attn"),
            &x,
            w,
            &format!("{lp}.self_attn"),
            d,
        )?;
        let (kc, vc) = self_kv.merge(&mut b, &format!("{n}_self_attn"), l, &k, &v)?;
        k_updates.push(k);
        v_updates.push(v);
        let (ctx, _) = attention(
            &mut b,
            &format!("{n}_self_attn"),
            &q,
            &kc,
            &vc,
            dims.heads,
            d,
            Some(&pad),
        )?;
        let o = out_proj(&mut b, "self_attn", &ctx)?;
        h = b.add(&format!("{n}_self_attn_residual"), &h, &o)?;

        // Cross-attention on the encoder output.
        let x = ln_w(&mut b, "encoder_attn_layer_norm", &h)?;
        let q = query(
            &mut b,
            &format!("{n}_encoder_attn_q_proj"),
            &x,
            w,
            &format!("{lp}.encoder_attn.q_proj"),
            d,
            dims.heads,
        )?;
        let (ek, ev) = match &cross {
            Some((ks, vs)) => (ks[l].clone(), vs[l].clone()),
            None => key_value(
                &mut b,
                &format!("{n}_encoder_attn"),
                &var("encoder_output_embeds")?,
                w,
                &format!("{lp}.encoder_attn"),
                d,
            )?,
        };
        let (ctx, weights) = attention(
            &mut b,
            &format!("{n}_encoder_attn"),
            &q,
            &ek,
            &ev,
            dims.heads,
            d,
            None,
        )?;
        let heads: Vec<i32> = opts
            .alignment_heads
            .iter()
            .filter(|a| a.0 == l)
            .map(|a| a.1 as i32)
            .collect();
        if !heads.is_empty() {
            align.push(b.op1(
                "gather",
                &format!("{n}_alignment_heads"),
                vec![
                    ("x", In::V(weights)),
                    ("indices", ints(&heads)),
                    ("axis", int(1)),
                ],
            )?);
        }
        let o = out_proj(&mut b, "encoder_attn", &ctx)?;
        h = b.add(&format!("{n}_encoder_attn_residual"), &h, &o)?;

        // Feed-forward.
        let x = ln_w(&mut b, "final_layer_norm", &h)?;
        let f = b.conv(
            &format!("{n}_fc1"),
            &x,
            w4(w, &format!("{lp}.fc1.weight"), dims.ffn, d)?,
            Some(vec1(w, &format!("{lp}.fc1.bias"), dims.ffn)?),
        )?;
        let f = b.gelu(&format!("{n}_fc1_gelu"), &f, "EXACT")?;
        let f = b.conv(
            &format!("{n}_fc2"),
            &f,
            w4(w, &format!("{lp}.fc2.weight"), d, dims.ffn)?,
            Some(vec1(w, &format!("{lp}.fc2.bias"), d)?),
        )?;
        h = b.add(&format!("{n}_mlp_residual"), &h, &f)?;
    }
    let h = b.layer_norm(
        "layer_norm",
        &h,
        &[1],
        vec1(w, &format!("{P}.layer_norm.weight"), d)?,
        vec1(w, &format!("{P}.layer_norm.bias"), d)?,
        Value::f16_scalar(LN_EPS),
    )?;
    let mut outs = vec![head(&mut b, w, &h, d, dims.vocab, opts.head_chunks)?];
    if opts.kv_cache == KvCache::Io {
        for (name, parts) in [
            ("key_cache_updates_concat", k_updates),
            ("value_cache_updates_concat", v_updates),
        ] {
            outs.push(if parts.len() == 1 {
                b.op1("identity", name, vec![("x", In::V(parts[0].clone()))])?
            } else {
                b.op1(
                    "concat",
                    name,
                    vec![("values", In::Vs(parts)), ("axis", int(1))],
                )?
            });
        }
    }
    if !align.is_empty() {
        let all = if align.len() == 1 {
            align.remove(0)
        } else {
            b.op1(
                "concat",
                "alignment_heads_concat",
                vec![("values", In::Vs(align)), ("axis", int(1))],
            )?
        };
        // [1, n, 1, n_audio] → mean over the n heads → [1, n_audio].
        outs.push(b.op1(
            "reduce_mean",
            "alignment_heads_mean",
            vec![
                ("x", In::V(all.clone())),
                ("axes", ints(&[1, 2])),
                ("keep_dims", In::C(Value::bool_scalar(false))),
            ],
        )?);
        if opts.per_head_alignment {
            // [1, n, 1, n_audio] → [1, n, n_audio].
            outs.push(b.op1(
                "squeeze",
                "alignment_heads_per_head",
                vec![("x", In::V(all)), ("axes", ints(&[2]))],
            )?);
        }
    }
    let named: Vec<(V, &str)> = outs
        .into_iter()
        .zip(fout.iter().map(|f| f.name.as_str()))
        .collect();
    let (inputs, block) = b.finish(&named)?;
    let component = match (opts.kv_cache, opts.cross_kv) {
        (KvCache::Io, CrossKv::InGraph) => "decoder",
        (KvCache::Io, CrossKv::Precomputed) => "decoder_cross_kv",
        (KvCache::State, CrossKv::InGraph) => "decoder_stateful",
        (KvCache::State, CrossKv::Precomputed) => "decoder_stateful_cross_kv",
    };
    let mut description = Description {
        inputs: fin,
        outputs: fout,
        states: fstates,
        ..Default::default()
    };
    description.short_description = format!(
        "Whisper text decoder, one token per call (WhisperKit TextDecoder ABI{}), fp16, BC1S layout",
        if opts.kv_cache == KvCache::State { ", caches as states" } else { "" }
    );
    let heads = opts
        .alignment_heads
        .iter()
        .map(|(l, h)| format!("[{l},{h}]"))
        .collect::<Vec<_>>()
        .join(",");
    description
        .user_defined
        .insert("milkit.alignment_heads".into(), format!("[{heads}]"));
    description
        .user_defined
        .insert("milkit.head_chunks".into(), opts.head_chunks.to_string());
    description.user_defined.insert(
        HEAD_OPS_KEY.into(),
        head_op_names(opts.head_chunks).join(","),
    );
    Ok(finish_model(component, inputs, block, opset, description))
}
