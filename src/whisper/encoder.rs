//! The Whisper audio encoder as an fp16 MIL program in BC1S layout: two stem `conv`s with
//! GELU, a fixed positional embedding added once, pre-norm transformer layers whose linears
//! are 1x1 `conv`s, and a final layer norm. Two I/O ABIs: whisper.cpp's and WhisperKit's.

use super::graph::{attention, query_scale, scaled, weight, WeightSource};
use crate::ir::{ArrayDType, DType, Description, Feature, Model, Opset, Tensor, Value, ValueType};
use crate::ops::builder::{int, ints};
use crate::ops::{Builder, In};
use anyhow::{bail, Result};
use half::f16;

/// Which runtime's encoder interface to emit (`export --abi`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum EncoderAbi {
    /// whisper.cpp's Core ML encoder: `logmel_data` fp32 [1, n_mels, 3000] →
    /// `output` fp32 [1, 1500, d_model].
    #[value(name = "whispercpp")]
    WhisperCpp,
    /// WhisperKit's AudioEncoder: `melspectrogram_features` fp16 [1, n_mels, 1, 3000] →
    /// `encoder_output_embeds` fp16 [1, d_model, 1, 1500].
    #[value(name = "whisperkit")]
    WhisperKit,
}

impl EncoderAbi {
    pub fn name(self) -> &'static str {
        match self {
            EncoderAbi::WhisperCpp => "whispercpp",
            EncoderAbi::WhisperKit => "whisperkit",
        }
    }
    pub fn parse(s: &str) -> Result<EncoderAbi> {
        match s {
            "whispercpp" => Ok(EncoderAbi::WhisperCpp),
            "whisperkit" => Ok(EncoderAbi::WhisperKit),
            o => bail!("unknown ABI `{o}` (expected whispercpp or whisperkit)"),
        }
    }
    /// (input name, dtype, shape), (output name, dtype, shape).
    pub fn features(self, d: &EncoderDims) -> (Feature, Feature) {
        let frames = 2 * d.n_ctx;
        match self {
            EncoderAbi::WhisperCpp => (
                Feature::new("logmel_data", ArrayDType::F32, &[1, d.n_mels, frames]),
                Feature::new("output", ArrayDType::F32, &[1, d.n_ctx, d.d_model]),
            ),
            EncoderAbi::WhisperKit => (
                Feature::new(
                    "melspectrogram_features",
                    ArrayDType::F16,
                    &[1, d.n_mels, 1, frames],
                ),
                Feature::new(
                    "encoder_output_embeds",
                    ArrayDType::F16,
                    &[1, d.d_model, 1, d.n_ctx],
                ),
            ),
        }
    }
}

/// The encoder's dimensions.
#[derive(Clone, Debug)]
pub struct EncoderDims {
    pub d_model: usize,
    pub layers: usize,
    pub heads: usize,
    pub ffn: usize,
    pub n_mels: usize,
    /// Audio positions after the stride-2 stem (1500).
    pub n_ctx: usize,
}

const LN_EPS: f32 = 1e-5;

/// Builds the encoder program. `progress` is called after each layer.
pub fn build_encoder(
    dims: &EncoderDims,
    w: &dyn WeightSource,
    abi: EncoderAbi,
    opset: Opset,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<Model> {
    let d = dims.d_model;
    let dh = d / dims.heads;
    let p = "model.encoder";
    let mut b = Builder::new(opset);
    let (fin, fout) = abi.features(dims);
    let x_in = b.input(&fin.name, ValueType::Tensor(fin.tensor_type()));
    let x = match abi {
        EncoderAbi::WhisperCpp => {
            let h = b.op1(
                "cast",
                "logmel_fp16",
                vec![("x", (&x_in).into()), ("dtype", In::C(Value::str("fp16")))],
            )?;
            b.op1(
                "expand_dims",
                "logmel_bc1s",
                vec![("x", In::V(h)), ("axes", ints(&[2]))],
            )?
        }
        EncoderAbi::WhisperKit => x_in,
    };

    // Stem: conv(k=3, pad 1) → GELU → conv(k=3, stride 2, pad 1) → GELU, as 2-D convs on BC1S.
    let stem = |b: &mut Builder,
                name: &str,
                x: &crate::ops::V,
                cin: usize,
                stride: i32|
     -> Result<crate::ops::V> {
        let wv = b.konst(
            &format!("{name}_weight"),
            weight(w, &format!("{p}.{name}.weight"), &[d, cin, 1, 3])?,
        );
        let bv = b.konst(
            &format!("{name}_bias"),
            weight(w, &format!("{p}.{name}.bias"), &[d])?,
        );
        let y = b.op1(
            "conv",
            name,
            vec![
                ("x", x.into()),
                ("weight", In::V(wv)),
                ("bias", In::V(bv)),
                ("strides", ints(&[1, stride])),
                ("pad_type", In::C(Value::str("custom"))),
                ("pad", ints(&[0, 0, 1, 1])),
                ("dilations", ints(&[1, 1])),
                ("groups", int(1)),
            ],
        )?;
        b.gelu(&format!("{name}_gelu"), &y, "EXACT")
    };
    let h = stem(&mut b, "conv1", &x, dims.n_mels, 1)?;
    let h = stem(&mut b, "conv2", &h, d, 2)?;

    // Positional embedding [n_ctx, d] → [1, d, 1, n_ctx]: an fp16 constant added once.
    let (ps, pdata) = w.f16(&format!("{p}.embed_positions.weight"))?;
    anyhow::ensure!(
        ps == [dims.n_ctx, d],
        "{p}.embed_positions.weight has shape {ps:?}, expected [{}, {d}]",
        dims.n_ctx
    );
    let pv = pdata.to_f16_vec();
    let mut pt = vec![f16::ZERO; pv.len()];
    for s in 0..dims.n_ctx {
        for c in 0..d {
            pt[c * dims.n_ctx + s] = pv[s * d + c];
        }
    }
    let pos = b.konst(
        "embed_positions",
        Value::Tensor(Tensor::f16(&[1, d, 1, dims.n_ctx], &pt)),
    );
    let mut h = b.add("add_positions", &h, &pos)?;

    let (qs, exact) = query_scale(dh);
    for l in 0..dims.layers {
        let lp = format!("{p}.layers.{l}");
        let n = format!("layers_{l}");
        let ln = b.layer_norm(
            &format!("{n}_self_attn_layer_norm"),
            &h,
            &[1],
            weight(w, &format!("{lp}.self_attn_layer_norm.weight"), &[d])?,
            weight(w, &format!("{lp}.self_attn_layer_norm.bias"), &[d])?,
            Value::f16_scalar(LN_EPS),
        )?;
        let a = format!("{lp}.self_attn");
        let (qw, qb) = if exact {
            (
                scaled(w, &format!("{a}.q_proj.weight"), &[d, d, 1, 1], qs)?,
                scaled(w, &format!("{a}.q_proj.bias"), &[d], qs)?,
            )
        } else {
            (
                weight(w, &format!("{a}.q_proj.weight"), &[d, d, 1, 1])?,
                weight(w, &format!("{a}.q_proj.bias"), &[d])?,
            )
        };
        let mut q = b.conv(&format!("{n}_self_attn_q_proj"), &ln, qw, Some(qb))?;
        if !exact {
            let s = b.konst(&format!("{n}_q_scale"), Value::f16_scalar(qs));
            q = b.op1(
                "mul",
                &format!("{n}_q_scaled"),
                vec![("x", In::V(q)), ("y", In::V(s))],
            )?;
        }
        // No key bias: a constant added to every key shifts all logits of a query equally.
        let k = b.conv(
            &format!("{n}_self_attn_k_proj"),
            &ln,
            weight(w, &format!("{a}.k_proj.weight"), &[d, d, 1, 1])?,
            None,
        )?;
        let v = b.conv(
            &format!("{n}_self_attn_v_proj"),
            &ln,
            weight(w, &format!("{a}.v_proj.weight"), &[d, d, 1, 1])?,
            Some(weight(w, &format!("{a}.v_proj.bias"), &[d])?),
        )?;
        let (ctx, _) = attention(
            &mut b,
            &format!("{n}_self_attn"),
            &q,
            &k,
            &v,
            dims.heads,
            d,
            None,
        )?;
        let o = b.conv(
            &format!("{n}_self_attn_out_proj"),
            &ctx,
            weight(w, &format!("{a}.out_proj.weight"), &[d, d, 1, 1])?,
            Some(weight(w, &format!("{a}.out_proj.bias"), &[d])?),
        )?;
        h = b.add(&format!("{n}_attn_residual"), &h, &o)?;
        let ln2 = b.layer_norm(
            &format!("{n}_final_layer_norm"),
            &h,
            &[1],
            weight(w, &format!("{lp}.final_layer_norm.weight"), &[d])?,
            weight(w, &format!("{lp}.final_layer_norm.bias"), &[d])?,
            Value::f16_scalar(LN_EPS),
        )?;
        let f = b.conv(
            &format!("{n}_fc1"),
            &ln2,
            weight(w, &format!("{lp}.fc1.weight"), &[dims.ffn, d, 1, 1])?,
            Some(weight(w, &format!("{lp}.fc1.bias"), &[dims.ffn])?),
        )?;
        let f = b.gelu(&format!("{n}_fc1_gelu"), &f, "EXACT")?;
        let f = b.conv(
            &format!("{n}_fc2"),
            &f,
            weight(w, &format!("{lp}.fc2.weight"), &[d, dims.ffn, 1, 1])?,
            Some(weight(w, &format!("{lp}.fc2.bias"), &[d])?),
        )?;
        h = b.add(&format!("{n}_mlp_residual"), &h, &f)?;
        progress(l + 1, dims.layers);
    }
    let h = b.layer_norm(
        "layer_norm",
        &h,
        &[1],
        weight(w, &format!("{p}.layer_norm.weight"), &[d])?,
        weight(w, &format!("{p}.layer_norm.bias"), &[d])?,
        Value::f16_scalar(LN_EPS),
    )?;
    let out = match abi {
        EncoderAbi::WhisperCpp => {
            let s = b.reshape("output_bcs", &h, &[1, d as i32, dims.n_ctx as i32])?;
            let t = b.op1(
                "transpose",
                "output_bsc",
                vec![("x", In::V(s)), ("perm", ints(&[0, 2, 1]))],
            )?;
            b.op1(
                "cast",
                "output_fp32",
                vec![("x", In::V(t)), ("dtype", In::C(Value::str("fp32")))],
            )?
        }
        EncoderAbi::WhisperKit => h,
    };
    let (inputs, block) = b.finish(&[(out, fout.name.as_str())])?;
    let mut description = Description {
        inputs: vec![fin],
        outputs: vec![fout],
        ..Default::default()
    };
    description.short_description = format!(
        "Whisper audio encoder ({} ABI), fp16, BC1S layout",
        abi.name()
    );
    description
        .user_defined
        .insert("milkit.component".into(), "encoder".into());
    description
        .user_defined
        .insert("milkit.abi".into(), abi.name().into());
    description
        .user_defined
        .insert("milkit.version".into(), env!("CARGO_PKG_VERSION").into());
    let _ = DType::F16;
    Ok(Model::single(opset, inputs, block, description))
}

impl EncoderDims {
    pub fn from_config(c: &super::config::WhisperConfig) -> EncoderDims {
        EncoderDims {
            d_model: c.d_model,
            layers: c.encoder_layers,
            heads: c.encoder_attention_heads,
            ffn: c.encoder_ffn_dim,
            n_mels: c.num_mel_bins,
            n_ctx: c.max_source_positions,
        }
    }
}
