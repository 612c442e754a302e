//! One definition per NeuralNetwork layer type: what its parameters mean in MIL ops. The
//! rank-5 layers of the first specifications act on the last three axes, `[C, H, W]`, with
//! every axis before them a batch (a rank-1 or rank-2 blob is `[C]` or `[B, C]` with
//! `H = W = 1`); the rank-N layers of specification 4 and later act on exact shapes with
//! numpy broadcasting, as the MIL ops do.

use super::{weights, Translator};
use crate::ops::builder::{int, ints, In, V};
use crate::proto::specification as spec;
use anyhow::{anyhow, bail, ensure, Context, Result};
use spec::neural_network_layer::Layer as L;

/// A layer type's name as `NeuralNetwork.proto` spells its field (`convolution`,
/// `innerProduct`), from the generated variant's name.
pub fn layer_type_name(layer: &L) -> String {
    let debug = format!("{layer:?}");
    let variant = debug.split('(').next().unwrap_or_default();
    let mut c = variant.chars();
    match c.next() {
        Some(f) => f.to_lowercase().chain(c).collect(),
        None => String::new(),
    }
}

/// Translates one layer: reads its input blobs, writes its output blobs.
pub fn translate(t: &mut Translator, layer: &spec::NeuralNetworkLayer) -> Result<()> {
    let kind = layer
        .layer
        .as_ref()
        .ok_or_else(|| anyhow!("the layer has no type"))?;
    let inputs = layer
        .input
        .iter()
        .map(|n| t.blob(n))
        .collect::<Result<Vec<_>>>()?;
    let name = sanitize(&layer.name);
    let one = |n: usize| -> Result<()> {
        ensure!(
            inputs.len() == n,
            "takes {n} input(s), the layer names {}",
            inputs.len()
        );
        Ok(())
    };
    if let Some(outs) = super::rank_n::translate(t, &name, kind, &inputs, layer.output.len())? {
        return bind(t, layer, outs);
    }
    let outs: Vec<V> = match kind {
        L::Convolution(p) => {
            ensure!(
                inputs.len() == 1 || (inputs.len() == 2 && !p.is_deconvolution),
                "takes 1 input (2 for a convolution whose weights are an input), the layer \
                 names {}",
                inputs.len()
            );
            vec![convolution(t, &name, &inputs[0], inputs.get(1), p)?]
        }
        L::InnerProduct(p) => {
            one(1)?;
            vec![inner_product(t, &name, &inputs[0], p)?]
        }
        L::Activation(p) => {
            one(1)?;
            vec![activation(t, &name, &inputs[0], p)?]
        }
        L::Pooling(p) => {
            one(1)?;
            vec![pooling(t, &name, &inputs[0], p)?]
        }
        L::Batchnorm(p) => {
            one(1)?;
            vec![batchnorm(t, &name, &inputs[0], p)?]
        }
        L::Softmax(_) => {
            one(1)?;
            let axis = if t.shape(&inputs[0])?.len() >= 3 {
                -3
            } else {
                -1
            };
            vec![t.b.softmax(&name, &inputs[0], axis)?]
        }
        L::SoftmaxNd(p) => {
            one(1)?;
            vec![t.b.softmax(&name, &inputs[0], p.axis as i32)?]
        }
        L::Flatten(p) => {
            one(1)?;
            vec![flatten(t, &name, &inputs[0], p.mode)?]
        }
        L::Reshape(p) => {
            one(1)?;
            vec![reshape(t, &name, &inputs[0], p)?]
        }
        L::Concat(p) => {
            ensure!(!inputs.is_empty(), "a concat of no inputs");
            let axis = if p.sequence_concat {
                ensure!(t.rank5, "a sequence concat outside the rank-5 mapping");
                0
            } else {
                -3
            };
            vec![t.b.op1(
                "concat",
                &name,
                vec![
                    ("values", In::Vs(inputs.clone())),
                    ("axis", int(axis)),
                    ("interleave", In::C(crate::ir::Value::bool_scalar(false))),
                ],
            )?]
        }
        L::Add(p) => vec![fold(t, &name, &inputs, "add", p.alpha, 0.0)?],
        L::Multiply(p) => vec![fold(t, &name, &inputs, "mul", p.alpha, 1.0)?],
        L::Max(_) => vec![fold(t, &name, &inputs, "maximum", 0.0, 0.0)?],
        L::Min(_) => vec![fold(t, &name, &inputs, "minimum", 0.0, 0.0)?],
        L::Average(_) => {
            ensure!(!inputs.is_empty(), "an average of no inputs");
            let s = fold(t, &format!("{name}_sum"), &inputs, "add", 0.0, 0.0)?;
            let k = t.konst(&format!("{name}_n"), &[], &[1.0 / inputs.len() as f32]);
            vec![binary(t, "mul", &name, &s, &k)?]
        }
        L::Unary(p) => {
            one(1)?;
            vec![unary(t, &name, &inputs[0], p)?]
        }
        L::Scale(p) => {
            one(1)?;
            let n: usize = p.shape_scale.iter().product::<u64>() as usize;
            let s = weights(p.scale.as_ref(), n, "scale")?;
            let sv = chw_const(t, &format!("{name}_scale"), &p.shape_scale, &s)?;
            let y = binary(t, "mul", &format!("{name}_scaled"), &inputs[0], &sv)?;
            if p.has_bias {
                let n: usize = p.shape_bias.iter().product::<u64>() as usize;
                let b = weights(p.bias.as_ref(), n, "bias")?;
                let bv = chw_const(t, &format!("{name}_bias"), &p.shape_bias, &b)?;
                vec![binary(t, "add", &name, &y, &bv)?]
            } else {
                vec![y]
            }
        }
        L::Bias(p) => {
            one(1)?;
            let n: usize = p.shape.iter().product::<u64>() as usize;
            let b = weights(p.bias.as_ref(), n, "bias")?;
            let bv = chw_const(t, &format!("{name}_bias"), &p.shape, &b)?;
            vec![binary(t, "add", &name, &inputs[0], &bv)?]
        }
        L::LoadConstant(p) => {
            one(0)?;
            let shape: Vec<usize> = p.shape.iter().map(|&d| d as usize).collect();
            ensure!(
                shape.len() == 3,
                "a constant of shape {shape:?} (it must be [C, H, W])"
            );
            let n = shape.iter().product();
            let v = weights(p.data.as_ref(), n, "data")?;
            let full = if t.rank5 {
                vec![1, 1, shape[0], shape[1], shape[2]]
            } else {
                shape
            };
            vec![t.konst(&name, &full, &v)]
        }
        L::LoadConstantNd(p) => {
            one(0)?;
            let shape: Vec<usize> = p.shape.iter().map(|&d| d as usize).collect();
            let v = weights(p.data.as_ref(), shape.iter().product(), "data")?;
            vec![t.konst(&name, &shape, &v)]
        }
        L::Split(p) => {
            one(1)?;
            let n = p.n_outputs as usize;
            ensure!(
                n == layer.output.len(),
                "{n} outputs, {} named",
                layer.output.len()
            );
            t.b.op(
                "split",
                &name,
                vec![
                    ("x", (&inputs[0]).into()),
                    ("num_splits", int(n as i32)),
                    ("axis", int(-3)),
                ],
            )?
        }
        L::AddBroadcastable(_) => vec![binary2(t, "add", &name, &inputs)?],
        L::SubtractBroadcastable(_) => vec![binary2(t, "sub", &name, &inputs)?],
        L::MultiplyBroadcastable(_) => vec![binary2(t, "mul", &name, &inputs)?],
        L::DivideBroadcastable(_) => vec![binary2(t, "real_div", &name, &inputs)?],
        L::PowBroadcastable(_) => vec![binary2(t, "pow", &name, &inputs)?],
        L::MaxBroadcastable(_) => vec![binary2(t, "maximum", &name, &inputs)?],
        L::MinBroadcastable(_) => vec![binary2(t, "minimum", &name, &inputs)?],
        L::ModBroadcastable(_) => vec![binary2(t, "mod", &name, &inputs)?],
        L::FloorDivBroadcastable(_) => vec![binary2(t, "floor_div", &name, &inputs)?],
        L::Ceil(_) => vec![unary_op(t, "ceil", &name, &inputs)?],
        L::Floor(_) => vec![unary_op(t, "floor", &name, &inputs)?],
        L::Sign(_) => vec![unary_op(t, "sign", &name, &inputs)?],
        L::Round(_) => vec![unary_op(t, "round", &name, &inputs)?],
        L::Exp2(_) => vec![unary_op(t, "exp2", &name, &inputs)?],
        L::Sin(_) => vec![unary_op(t, "sin", &name, &inputs)?],
        L::Cos(_) => vec![unary_op(t, "cos", &name, &inputs)?],
        L::Tan(_) => vec![unary_op(t, "tan", &name, &inputs)?],
        L::Asin(_) => vec![unary_op(t, "asin", &name, &inputs)?],
        L::Acos(_) => vec![unary_op(t, "acos", &name, &inputs)?],
        L::Atan(_) => vec![unary_op(t, "atan", &name, &inputs)?],
        L::Sinh(_) => vec![unary_op(t, "sinh", &name, &inputs)?],
        L::Cosh(_) => vec![unary_op(t, "cosh", &name, &inputs)?],
        L::Tanh(_) => vec![unary_op(t, "tanh", &name, &inputs)?],
        L::Asinh(_) => {
            one(1)?;
            vec![inverse_hyperbolic(t, &name, &inputs[0], true)?]
        }
        L::Acosh(_) => {
            one(1)?;
            vec![inverse_hyperbolic(t, &name, &inputs[0], false)?]
        }
        L::Atanh(_) => vec![unary_op(t, "atanh", &name, &inputs)?],
        L::Erf(_) => vec![unary_op(t, "erf", &name, &inputs)?],
        L::Gelu(p) => {
            one(1)?;
            let mode = match p.mode {
                0 => "EXACT",
                1 => "TANH_APPROXIMATION",
                2 => "SIGMOID_APPROXIMATION",
                m => bail!("unknown GELU mode {m}"),
            };
            vec![t.b.gelu(&name, &inputs[0], mode)?]
        }
        L::Clip(p) => {
            one(1)?;
            vec![t.b.op1(
                "clip",
                &name,
                vec![
                    ("x", (&inputs[0]).into()),
                    ("alpha", In::C(crate::ir::Value::f32_scalar(p.min_val))),
                    ("beta", In::C(crate::ir::Value::f32_scalar(p.max_val))),
                ],
            )?]
        }
        L::Reduce(p) => {
            one(1)?;
            vec![reduce5(t, &name, &inputs[0], p)?]
        }
        L::Permute(p) => {
            one(1)?;
            let r = t.shape(&inputs[0])?.len();
            ensure!(
                p.axis.len() == 4,
                "a permutation of {} axes (it takes 4)",
                p.axis.len()
            );
            // Axes of [Seq, C, H, W]; the batch axis stays where it is.
            let m = [0, 2, 3, 4];
            let mut perm: Vec<i32> = vec![
                m[p.axis[0] as usize % 4],
                1,
                m[p.axis[1] as usize % 4],
                m[p.axis[2] as usize % 4],
                m[p.axis[3] as usize % 4],
            ];
            if r == 4 {
                perm = p.axis.iter().map(|&a| a as i32).collect();
            }
            ensure!(r == 4 || r == 5, "a permutation of a rank-{r} blob");
            vec![t.b.op1(
                "transpose",
                &name,
                vec![("x", (&inputs[0]).into()), ("perm", ints(&perm))],
            )?]
        }
        L::Padding(p) => {
            one(1)?;
            vec![padding(t, &name, &inputs[0], p)?]
        }
        L::Upsample(p) => {
            one(1)?;
            vec![upsample(t, &name, &inputs[0], p)?]
        }
        L::L2normalize(p) => {
            one(1)?;
            let (x4, _, f) = to_nchw(t, &inputs[0])?;
            let sq = binary(t, "mul", &format!("{name}_sq"), &x4, &x4)?;
            let sum = reduce_keep(t, "reduce_sum", &format!("{name}_sum"), &sq, &[1, 2, 3])?;
            let inv = t.b.op1(
                "rsqrt",
                &format!("{name}_inv"),
                vec![
                    ("x", In::from(&sum)),
                    ("epsilon", In::C(crate::ir::Value::f32_scalar(p.epsilon))),
                ],
            )?;
            let y = binary(t, "mul", &format!("{name}_nchw"), &x4, &inv)?;
            vec![from_nchw(t, &y, &f)?]
        }
        L::Lrn(p) => {
            one(1)?;
            let (x4, _, f) = to_nchw(t, &inputs[0])?;
            let y = t.b.op1(
                "local_response_norm",
                &format!("{name}_nchw"),
                vec![
                    ("x", In::from(&x4)),
                    ("size", int(p.local_size as i32)),
                    ("alpha", In::C(crate::ir::Value::f32_scalar(p.alpha))),
                    ("beta", In::C(crate::ir::Value::f32_scalar(p.beta))),
                    ("k", In::C(crate::ir::Value::f32_scalar(p.k))),
                ],
            )?;
            vec![from_nchw(t, &y, &f)?]
        }
        L::Mvn(p) => {
            one(1)?;
            vec![mvn(t, &name, &inputs[0], p)?]
        }
        L::ReorganizeData(p) => {
            one(1)?;
            let (x4, _, f) = to_nchw(t, &inputs[0])?;
            let bs = int(p.block_size as i32);
            let y = match p.mode {
                0 => t.b.op1(
                    "space_to_depth",
                    &format!("{name}_nchw"),
                    vec![("x", In::from(&x4)), ("block_size", bs)],
                )?,
                1 => t.b.op1(
                    "depth_to_space",
                    &format!("{name}_nchw"),
                    vec![("x", In::from(&x4)), ("block_size", bs)],
                )?,
                2 => t.b.op1(
                    "pixel_shuffle",
                    &format!("{name}_nchw"),
                    vec![("x", In::from(&x4)), ("upscale_factor", bs)],
                )?,
                m => bail!("unknown reorganization {m}"),
            };
            vec![from_nchw(t, &y, &f)?]
        }
        L::Embedding(p) => {
            one(1)?;
            let (cin, cout) = (p.input_dim as usize, p.output_channels as usize);
            let w = weights(p.weights.as_ref(), cin * cout, "weights")?;
            let mut rows = vec![0f32; cin * cout];
            for o in 0..cout {
                for i in 0..cin {
                    rows[i * cout + o] = w[o * cin + i];
                }
            }
            let table = t.konst(&format!("{name}_table"), &[cin, cout], &rows);
            let (x4, [n, c, h, w2], f) = to_nchw(t, &inputs[0])?;
            ensure!(
                c == 1 && h == 1 && w2 == 1,
                "embedding indices of [{c}, {h}, {w2}] per batch"
            );
            let flat = t.reshape(&x4, &[n])?;
            let idx = t.b.op1(
                "cast",
                &format!("{name}_idx"),
                vec![
                    ("x", In::from(&flat)),
                    ("dtype", In::C(crate::ir::Value::str("int32"))),
                ],
            )?;
            let g = t.b.op1(
                "gather",
                &format!("{name}_rows"),
                vec![
                    ("x", table.into()),
                    ("indices", idx.into()),
                    ("axis", int(0)),
                ],
            )?;
            let g = if p.has_bias {
                let bias = weights(p.bias.as_ref(), cout, "bias")?;
                let bv = t.konst(&format!("{name}_bias"), &[cout], &bias);
                t.b.add(&format!("{name}_biased"), &g, &bv)?
            } else {
                g
            };
            let y = t.reshape(&g, &[n, cout, 1, 1])?;
            vec![from_nchw(t, &y, &f)?]
        }
        L::Slice(p) => {
            one(1)?;
            vec![slice5(t, &name, &inputs[0], p)?]
        }
        L::Crop(p) => {
            vec![crop(t, &name, &inputs, p)?]
        }
        L::SequenceRepeat(p) => {
            one(1)?;
            let r = t.shape(&inputs[0])?.len();
            let mut reps = vec![1i32; r];
            reps[0] = p.n_repetitions.max(1) as i32;
            vec![t.b.op1(
                "tile",
                &name,
                vec![("x", (&inputs[0]).into()), ("reps", ints(&reps))],
            )?]
        }
        L::Dot(p) => {
            one(2)?;
            vec![dot(t, &name, &inputs[0], &inputs[1], p.cosine_similarity)?]
        }
        L::Convolution3d(p) => {
            one(1)?;
            vec![convolution3d(t, &name, &inputs[0], p)?]
        }
        L::Pooling3d(p) => {
            one(1)?;
            vec![pooling3d(t, &name, &inputs[0], p)?]
        }
        L::GlobalPooling3d(p) => {
            one(1)?;
            let r = t.shape(&inputs[0])?.len();
            ensure!(
                r == 5,
                "a 3-D pooling of a rank-{r} blob (it takes [B, C, D, H, W])"
            );
            let op = if p.r#type == 0 {
                "reduce_max"
            } else {
                "reduce_mean"
            };
            vec![t.b.op1(
                op,
                &name,
                vec![
                    ("x", (&inputs[0]).into()),
                    ("axes", ints(&[2, 3, 4])),
                    ("keep_dims", In::C(crate::ir::Value::bool_scalar(true))),
                ],
            )?]
        }
        other => bail!(
            "layer type `{}` is not translated yet (milkit runs NeuralNetwork layers it has a \
             definition for; see docs/runtime.md)",
            layer_type_name(other)
        ),
    };
    bind(t, layer, outs)
}

/// Names a layer's results with its output blob names.
fn bind(t: &mut Translator, layer: &spec::NeuralNetworkLayer, outs: Vec<V>) -> Result<()> {
    ensure!(
        outs.len() == layer.output.len(),
        "makes {} output(s), the layer names {}",
        outs.len(),
        layer.output.len()
    );
    for (o, v) in layer.output.iter().zip(outs) {
        t.blobs.insert(o.clone(), v);
    }
    Ok(())
}

/// A layer name as a MIL variable name base: letters, digits and `_` only.
fn sanitize(s: &str) -> String {
    let mut n: String = s
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    if n.is_empty() || n.starts_with(|c: char| c.is_ascii_digit()) {
        n.insert(0, 'l');
    }
    n
}

fn binary(t: &mut Translator, op: &str, name: &str, x: &V, y: &V) -> Result<V> {
    t.b.op1(op, name, vec![("x", x.into()), ("y", y.into())])
}

/// A rank-N binary layer of exactly two inputs.
fn binary2(t: &mut Translator, op: &str, name: &str, inputs: &[V]) -> Result<V> {
    ensure!(
        inputs.len() == 2,
        "takes 2 inputs, the layer names {}",
        inputs.len()
    );
    binary(t, op, name, &inputs[0], &inputs[1])
}

fn unary_op(t: &mut Translator, op: &str, name: &str, inputs: &[V]) -> Result<V> {
    ensure!(
        inputs.len() == 1,
        "takes 1 input, the layer names {}",
        inputs.len()
    );
    t.b.op1(op, name, vec![("x", (&inputs[0]).into())])
}

/// `add` / `multiply` / `max` / `min` over one or more inputs; with one input, `alpha` is
/// the other operand (unless it is the operation's identity).
fn fold(t: &mut Translator, name: &str, inputs: &[V], op: &str, alpha: f32, id: f32) -> Result<V> {
    ensure!(!inputs.is_empty(), "a `{op}` of no inputs");
    if inputs.len() == 1 {
        if alpha == id && (op == "add" || op == "mul") {
            return t.b.op1("identity", name, vec![("x", (&inputs[0]).into())]);
        }
        let a = t.konst(&format!("{name}_alpha"), &[], &[alpha]);
        return binary(t, op, name, &inputs[0], &a);
    }
    let mut acc = inputs[0].clone();
    for (i, x) in inputs[1..].iter().enumerate() {
        let n = if i + 2 == inputs.len() {
            name.to_string()
        } else {
            format!("{name}_{i}")
        };
        acc = binary(t, op, &n, &acc, x)?;
    }
    Ok(acc)
}

/// A `[C]`, `[1]`, `[1, H, W]` or `[C, H, W]` parameter as a constant that broadcasts
/// against the last three axes.
fn chw_const(t: &mut Translator, name: &str, shape: &[u64], v: &[f32]) -> Result<V> {
    let s: Vec<usize> = match *shape {
        [] | [1] => vec![1, 1, 1],
        [c] => vec![c as usize, 1, 1],
        [c, h, w] => vec![c as usize, h as usize, w as usize],
        _ => bail!("a parameter of shape {shape:?} (it must be [1], [C], [1, H, W] or [C, H, W])"),
    };
    Ok(t.konst(name, &s, v))
}

/// A blob as `[N, C, H, W]` (every axis before the last three folded into N), with what
/// [`from_nchw`] needs to give a result the blob's own rank back.
struct Nchw {
    lead: Vec<usize>,
    rank: usize,
}

fn to_nchw(t: &mut Translator, x: &V) -> Result<(V, [usize; 4], Nchw)> {
    let s = t.shape(x)?;
    let r = s.len();
    let (lead, c, h, w) = match r {
        0 => bail!("a scalar where a [C, H, W] blob is expected"),
        1 => (vec![], s[0], 1, 1),
        2 => (vec![s[0]], s[1], 1, 1),
        _ => (s[..r - 3].to_vec(), s[r - 3], s[r - 2], s[r - 1]),
    };
    let n = lead.iter().product::<usize>();
    let v = t.reshape(x, &[n, c, h, w])?;
    Ok((v, [n, c, h, w], Nchw { lead, rank: r }))
}

fn from_nchw(t: &mut Translator, y: &V, f: &Nchw) -> Result<V> {
    let s = t.shape(y)?;
    let (c, h, w) = (s[1], s[2], s[3]);
    let mut out = f.lead.clone();
    if f.rank >= 3 {
        out.extend([c, h, w]);
    } else {
        ensure!(
            h == 1 && w == 1,
            "a [C] blob becomes [{c}, {h}, {w}], which has no rank-{} form",
            f.rank
        );
        out.push(c);
    }
    t.reshape(y, &out)
}

/// Explicit `[top, bottom, left, right]` padding for `same` padding: the output is
/// `ceil(in / stride)` and the odd pixel goes to the end (`BOTTOM_RIGHT_HEAVY`) or the start
/// (`TOP_LEFT_HEAVY`).
fn same_pads(
    input: [usize; 2],
    k: [usize; 2],
    s: [usize; 2],
    d: [usize; 2],
    top_left: bool,
) -> Vec<i32> {
    let mut pads = vec![];
    for a in 0..2 {
        let out = input[a].div_ceil(s[a]);
        let need = ((out - 1) * s[a] + (k[a] - 1) * d[a] + 1).saturating_sub(input[a]);
        let (small, big) = (need / 2, need - need / 2);
        if top_left {
            pads.extend([big as i32, small as i32]);
        } else {
            pads.extend([small as i32, big as i32]);
        }
    }
    pads
}

fn border_pads(v: &Option<spec::ValidPadding>) -> Result<Vec<i32>> {
    let Some(b) = v.as_ref().and_then(|v| v.padding_amounts.as_ref()) else {
        return Ok(vec![0; 4]);
    };
    match b.border_amounts.as_slice() {
        [] => Ok(vec![0; 4]),
        [h, w] => Ok(vec![
            h.start_edge_size as i32,
            h.end_edge_size as i32,
            w.start_edge_size as i32,
            w.end_edge_size as i32,
        ]),
        other => bail!("{} border amounts (it takes 2: height, width)", other.len()),
    }
}

/// Two values of a kernel / stride / dilation list, or its default.
fn pair(v: &[u64], default: usize, what: &str) -> Result<[usize; 2]> {
    match *v {
        [] => Ok([default, default]),
        [a, b] if a > 0 && b > 0 => Ok([a as usize, b as usize]),
        _ => bail!("{what} {v:?} (it takes two positive values)"),
    }
}

fn convolution(
    t: &mut Translator,
    name: &str,
    x: &V,
    dynamic_weight: Option<&V>,
    p: &spec::ConvolutionLayerParams,
) -> Result<V> {
    use spec::convolution_layer_params::ConvolutionPaddingType as P;
    let (x4, [_, c, h, w], f) = to_nchw(t, x)?;
    let k = pair(&p.kernel_size, 3, "kernel size")?;
    let s = pair(&p.stride, 1, "stride")?;
    let d = pair(&p.dilation_factor, 1, "dilation")?;
    let groups = p.n_groups.max(1) as usize;
    let (cout, kc) = (p.output_channels as usize, p.kernel_channels as usize);
    // A convolution's kernel channels are per group; a deconvolution's are all of them.
    let want_c = if p.is_deconvolution { kc } else { kc * groups };
    ensure!(
        c == want_c,
        "{c} input channels, but {kc} kernel channels in {groups} group(s)"
    );
    let wshape = if p.is_deconvolution {
        vec![kc, cout / groups, k[0], k[1]]
    } else {
        vec![cout, kc, k[0], k[1]]
    };
    let weight = match dynamic_weight {
        Some(w) => t.reshape(w, &wshape)?,
        None => {
            let wv = weights(p.weights.as_ref(), wshape.iter().product(), "weights")
                .context("convolution weights")?;
            t.konst(&format!("{name}_weight"), &wshape, &wv)
        }
    };
    let pad = match &p.convolution_padding_type {
        Some(P::Same(m)) if p.is_deconvolution => {
            ensure!(
                m.asymmetry_mode == 0,
                "a deconvolution with top-left-heavy same padding"
            );
            None
        }
        Some(P::Same(m)) => Some(same_pads([h, w], k, s, d, m.asymmetry_mode == 1)),
        Some(P::Valid(v)) => Some(border_pads(&Some(v.clone()))?),
        None => Some(vec![0; 4]),
    };
    let mut inputs = vec![("x", In::from(&x4)), ("weight", In::V(weight))];
    if p.has_bias {
        let b = weights(p.bias.as_ref(), cout, "bias")?;
        inputs.push(("bias", In::V(t.konst(&format!("{name}_bias"), &[cout], &b))));
    }
    inputs.extend([
        ("strides", ints(&[s[0] as i32, s[1] as i32])),
        ("dilations", ints(&[d[0] as i32, d[1] as i32])),
        ("groups", int(groups as i32)),
    ]);
    match pad {
        None => inputs.push(("pad_type", In::C(crate::ir::Value::str("same")))),
        Some(pad) => {
            inputs.push(("pad_type", In::C(crate::ir::Value::str("custom"))));
            inputs.push(("pad", ints(&pad)));
        }
    }
    let op = if p.is_deconvolution {
        "conv_transpose"
    } else {
        "conv"
    };
    let y = t.b.op1(op, &format!("{name}_nchw"), inputs)?;
    if p.is_deconvolution && !p.output_shape.is_empty() {
        let got = t.shape(&y)?;
        ensure!(
            p.output_shape.len() == 2
                && got[2] == p.output_shape[0] as usize
                && got[3] == p.output_shape[1] as usize,
            "a deconvolution output shape {:?} other than the {:?} its padding gives",
            p.output_shape,
            &got[2..]
        );
    }
    from_nchw(t, &y, &f)
}

fn inner_product(
    t: &mut Translator,
    name: &str,
    x: &V,
    p: &spec::InnerProductLayerParams,
) -> Result<V> {
    let (cin, cout) = (p.input_channels as usize, p.output_channels as usize);
    let s = t.shape(x)?;
    let chw_unit = s.len() >= 3 && s[s.len() - 2..] == [1, 1] && s[s.len() - 3] == cin;
    if !chw_unit && !t.rank5 && s.last() == Some(&cin) {
        // Specification 4 and later: a rank-N input is transformed along its last axis.
        let wv = weights(p.weights.as_ref(), cin * cout, "weights")?;
        let weight = t.konst(&format!("{name}_weight"), &[cout, cin], &wv);
        let mut inputs = vec![("x", In::from(x)), ("weight", In::V(weight))];
        if p.has_bias {
            let b = weights(p.bias.as_ref(), cout, "bias")?;
            inputs.push(("bias", In::V(t.konst(&format!("{name}_bias"), &[cout], &b))));
        }
        return t.b.op1("linear", name, inputs);
    }
    let (x4, [n, c, h, w], f) = to_nchw(t, x)?;
    // [C, 1, 1] per batch, or (specification 4 and later) a whole [C, H, W] flattened.
    ensure!(
        c * h * w == cin,
        "an input of [{c}, {h}, {w}] per batch for {cin} input channels"
    );
    let wv = weights(p.weights.as_ref(), cin * cout, "weights")?;
    let weight = t.konst(&format!("{name}_weight"), &[cout, cin], &wv);
    let x2 = t.reshape(&x4, &[n, cin])?;
    let mut inputs = vec![("x", In::from(&x2)), ("weight", In::V(weight))];
    if p.has_bias {
        let b = weights(p.bias.as_ref(), cout, "bias")?;
        inputs.push(("bias", In::V(t.konst(&format!("{name}_bias"), &[cout], &b))));
    }
    let y = t.b.op1("linear", &format!("{name}_linear"), inputs)?;
    let y4 = t.reshape(&y, &[n, cout, 1, 1])?;
    from_nchw(t, &y4, &f)
}

fn activation(t: &mut Translator, name: &str, x: &V, p: &spec::ActivationParams) -> Result<V> {
    use crate::ir::Value;
    use spec::activation_params::NonlinearityType as N;
    let f = |v: f32| In::C(Value::f32_scalar(v));
    let x_in = || In::from(x);
    let Some(kind) = &p.nonlinearity_type else {
        bail!("an activation without a type")
    };
    let (op, extra): (&str, Vec<(&str, In)>) = match kind {
        N::Linear(a) => (
            "linear_activation",
            vec![("alpha", f(a.alpha)), ("beta", f(a.beta))],
        ),
        N::ReLu(_) => ("relu", vec![]),
        N::LeakyReLu(a) => ("leaky_relu", vec![("alpha", f(a.alpha))]),
        N::ThresholdedReLu(a) => ("thresholded_relu", vec![("alpha", f(a.alpha))]),
        N::Tanh(_) => ("tanh", vec![]),
        N::ScaledTanh(a) => (
            "scaled_tanh",
            vec![("alpha", f(a.alpha)), ("beta", f(a.beta))],
        ),
        N::Sigmoid(_) => ("sigmoid", vec![]),
        N::SigmoidHard(a) => (
            "sigmoid_hard",
            vec![("alpha", f(a.alpha)), ("beta", f(a.beta))],
        ),
        N::Elu(a) => ("elu", vec![("alpha", f(a.alpha))]),
        N::Softsign(_) => ("softsign", vec![]),
        N::Softplus(_) => ("softplus", vec![]),
        N::PReLu(a) => {
            let (x4, [_, c, _, _], nc) = to_nchw(t, x)?;
            let alpha = per_channel(a.alpha.as_ref(), c, "alpha")?;
            let av = t.konst(&format!("{name}_alpha"), &[c], &alpha);
            let y = t.b.op1(
                "prelu",
                &format!("{name}_nchw"),
                vec![("x", In::from(&x4)), ("alpha", In::V(av))],
            )?;
            return from_nchw(t, &y, &nc);
        }
        N::ParametricSoftplus(a) => {
            let (x4, [_, c, _, _], nc) = to_nchw(t, x)?;
            let alpha = per_channel(a.alpha.as_ref(), c, "alpha")?;
            let beta = per_channel(a.beta.as_ref(), c, "beta")?;
            let av = t.konst(&format!("{name}_alpha"), &[c], &alpha);
            let bv = t.konst(&format!("{name}_beta"), &[c], &beta);
            let y = t.b.op1(
                "softplus_parametric",
                &format!("{name}_nchw"),
                vec![
                    ("x", In::from(&x4)),
                    ("alpha", In::V(av)),
                    ("beta", In::V(bv)),
                ],
            )?;
            return from_nchw(t, &y, &nc);
        }
    };
    let mut inputs = vec![("x", x_in())];
    inputs.extend(extra);
    t.b.op1(op, name, inputs)
}

/// A parameter given once or once per channel, as `c` values.
fn per_channel(w: Option<&spec::WeightParams>, c: usize, what: &str) -> Result<Vec<f32>> {
    match weights(w, c, what) {
        Ok(v) => Ok(v),
        Err(_) => Ok(vec![weights(w, 1, what)?[0]; c]),
    }
}

fn pooling(t: &mut Translator, name: &str, x: &V, p: &spec::PoolingLayerParams) -> Result<V> {
    use spec::pooling_layer_params::PoolingPaddingType as P;
    let (x4, [_, _, h, w], f) = to_nchw(t, x)?;
    let op = match p.r#type {
        0 => "max_pool",
        1 => "avg_pool",
        2 => "l2_pool",
        other => bail!("unknown pooling type {other}"),
    };
    let (k, s, pad, ceil) = if p.global_pooling {
        ([h, w], [1, 1], vec![0; 4], false)
    } else {
        let k = pair(&p.kernel_size, 3, "kernel size")?;
        let s = pair(&p.stride, 1, "stride")?;
        match &p.pooling_padding_type {
            Some(P::Same(m)) => (
                k,
                s,
                same_pads([h, w], k, s, [1, 1], m.asymmetry_mode == 1),
                false,
            ),
            Some(P::Valid(v)) => (k, s, border_pads(&Some(v.clone()))?, false),
            Some(P::IncludeLastPixel(c)) => {
                let [ph, pw] = match *c.padding_amounts.as_slice() {
                    [] => [0, 0],
                    [a, b] => [a as i32, b as i32],
                    _ => bail!("include-last-pixel padding of {:?}", c.padding_amounts),
                };
                (k, s, vec![ph, ph, pw, pw], true)
            }
            None => (k, s, vec![0; 4], false),
        }
    };
    let mut inputs = vec![
        ("x", In::from(&x4)),
        ("kernel_sizes", ints(&[k[0] as i32, k[1] as i32])),
        ("strides", ints(&[s[0] as i32, s[1] as i32])),
        ("pad_type", In::C(crate::ir::Value::str("custom"))),
        ("pad", ints(&pad)),
        ("ceil_mode", In::C(crate::ir::Value::bool_scalar(ceil))),
    ];
    if op == "avg_pool" {
        inputs.push((
            "exclude_padding_from_average",
            In::C(crate::ir::Value::bool_scalar(p.avg_pool_exclude_padding)),
        ));
    }
    let y = t.b.op1(op, &format!("{name}_nchw"), inputs)?;
    from_nchw(t, &y, &f)
}

fn batchnorm(t: &mut Translator, name: &str, x: &V, p: &spec::BatchnormLayerParams) -> Result<V> {
    let (x4, [_, c, _, _], f) = to_nchw(t, x)?;
    ensure!(
        p.channels as usize == c,
        "{} channels for an input of {c}",
        p.channels
    );
    let gamma = weights(p.gamma.as_ref(), c, "gamma")?;
    let beta = weights(p.beta.as_ref(), c, "beta")?;
    let g = t.konst(&format!("{name}_gamma"), &[c], &gamma);
    let bt = t.konst(&format!("{name}_beta"), &[c], &beta);
    let eps = In::C(crate::ir::Value::f32_scalar(p.epsilon));
    let y = if p.compute_mean_var {
        // Statistics of the input itself: per instance (instance normalization) or over the
        // batch and both spatial axes.
        let axes: &[i32] = if p.instance_normalization {
            &[2, 3]
        } else {
            &[0, 2, 3]
        };
        let mean = reduce_keep(t, "reduce_mean", &format!("{name}_mean"), &x4, axes)?;
        let centred = binary(t, "sub", &format!("{name}_centred"), &x4, &mean)?;
        let sq = binary(t, "mul", &format!("{name}_sq"), &centred, &centred)?;
        let var = reduce_keep(t, "reduce_mean", &format!("{name}_var"), &sq, axes)?;
        let inv = t.b.op1(
            "rsqrt",
            &format!("{name}_inv_std"),
            vec![("x", In::from(&var)), ("epsilon", eps)],
        )?;
        let z = binary(t, "mul", &format!("{name}_normed"), &centred, &inv)?;
        let g3 = t.reshape(&g, &[c, 1, 1])?;
        let b3 = t.reshape(&bt, &[c, 1, 1])?;
        let zs = binary(t, "mul", &format!("{name}_scaled"), &z, &g3)?;
        binary(t, "add", &format!("{name}_nchw"), &zs, &b3)?
    } else {
        let mean = weights(p.mean.as_ref(), c, "mean")?;
        let var = weights(p.variance.as_ref(), c, "variance")?;
        let m = t.konst(&format!("{name}_mean"), &[c], &mean);
        let v = t.konst(&format!("{name}_variance"), &[c], &var);
        t.b.op1(
            "batch_norm",
            &format!("{name}_nchw"),
            vec![
                ("x", In::from(&x4)),
                ("mean", In::V(m)),
                ("variance", In::V(v)),
                ("gamma", In::V(g)),
                ("beta", In::V(bt)),
                ("epsilon", eps),
            ],
        )?
    };
    from_nchw(t, &y, &f)
}

fn flatten(t: &mut Translator, name: &str, x: &V, mode: i32) -> Result<V> {
    let (x4, [n, c, h, w], f) = to_nchw(t, x)?;
    let x4 = match mode {
        0 => x4,
        1 => t.transpose(&x4, &[0, 2, 3, 1])?,
        m => bail!("unknown flatten mode {m}"),
    };
    let y = t.b.reshape(
        &format!("{name}_nchw"),
        &x4,
        &[n as i32, (c * h * w) as i32, 1, 1],
    )?;
    from_nchw(
        t,
        &y,
        &Nchw {
            rank: f.rank.max(3),
            ..f
        },
    )
}

/// The rank-5 `reshape`: `[C, H, W]` (sequence and batch kept) or `[Seq, C, H, W]` (batch
/// kept), in channel-first or channel-last element order.
fn reshape(t: &mut Translator, name: &str, x: &V, p: &spec::ReshapeLayerParams) -> Result<V> {
    let s = t.shape(x)?;
    ensure!(s.len() == 5, "a rank-5 reshape of a rank-{} blob", s.len());
    let ts: Vec<usize> = p
        .target_shape
        .iter()
        .map(|&d| usize::try_from(d).map_err(|_| anyhow!("target shape {:?}", p.target_shape)))
        .collect::<Result<_>>()?;
    let target = match *ts.as_slice() {
        [c, h, w] => [s[0], s[1], c, h, w],
        [q, c, h, w] => [q, s[1], c, h, w],
        _ => bail!("target shape {ts:?} (it takes [C, H, W] or [Seq, C, H, W])"),
    };
    ensure!(
        target.iter().product::<usize>() == s.iter().product::<usize>(),
        "a reshape of {s:?} to {target:?}"
    );
    match p.mode {
        0 => t.b.reshape(name, x, &target.map(|d| d as i32)),
        1 => {
            let xt = t.transpose(x, &[0, 1, 3, 4, 2])?;
            let [q, b, c, h, w] = target;
            let y = t.b.reshape(
                &format!("{name}_hwc"),
                &xt,
                &[q as i32, b as i32, h as i32, w as i32, c as i32],
            )?;
            t.b.op1(
                "transpose",
                name,
                vec![("x", (&y).into()), ("perm", ints(&[0, 1, 4, 2, 3]))],
            )
        }
        m => bail!("unknown reshape mode {m}"),
    }
}

/// `f(scale * x + shift)` for the unary function the layer names.
fn unary(t: &mut Translator, name: &str, x: &V, p: &spec::UnaryFunctionLayerParams) -> Result<V> {
    use crate::ir::Value;
    let pre = if p.scale != 1.0 || p.shift != 0.0 {
        t.b.op1(
            "linear_activation",
            &format!("{name}_affine"),
            vec![
                ("x", x.into()),
                ("alpha", In::C(Value::f32_scalar(p.scale))),
                ("beta", In::C(Value::f32_scalar(p.shift))),
            ],
        )?
    } else {
        x.clone()
    };
    let eps = || In::C(Value::f32_scalar(p.epsilon));
    let xin = In::from(&pre);
    match p.r#type {
        0 => t.b.op1("sqrt", name, vec![("x", xin)]),
        1 => t.b.op1("rsqrt", name, vec![("x", xin), ("epsilon", eps())]),
        2 => {
            t.b.op1("inverse", name, vec![("x", xin), ("epsilon", eps())])
        }
        3 => {
            let a = t.konst(&format!("{name}_alpha"), &[], &[p.alpha]);
            t.b.op1("pow", name, vec![("x", xin), ("y", In::V(a))])
        }
        4 => t.b.op1("exp", name, vec![("x", xin)]),
        5 => t.b.op1("log", name, vec![("x", xin), ("epsilon", eps())]),
        6 => t.b.op1("abs", name, vec![("x", xin)]),
        7 => t.b.op1(
            "threshold",
            name,
            vec![("x", xin), ("alpha", In::C(Value::f32_scalar(p.alpha)))],
        ),
        o => bail!("unknown unary function {o}"),
    }
}

/// The rank-5 `reduce` over C, H, W (or some of them), keeping the reduced axes.
fn reduce5(t: &mut Translator, name: &str, x: &V, p: &spec::ReduceLayerParams) -> Result<V> {
    use crate::ir::Value;
    let (x4, _, f) = to_nchw(t, x)?;
    let axes: &[i32] = match p.axis {
        0 => &[1, 2, 3],
        1 => &[2, 3],
        2 => &[1],
        3 => &[2],
        4 => &[3],
        a => bail!("unknown reduce axis {a}"),
    };
    let keep = || In::C(Value::bool_scalar(true));
    let nm = format!("{name}_nchw");
    let red = |t: &mut Translator, op: &str, nm: &str, x: &V| reduce_keep(t, op, nm, x, axes);
    let y = match p.mode {
        0 => red(t, "reduce_sum", &nm, &x4)?,
        1 => red(t, "reduce_mean", &nm, &x4)?,
        2 => red(t, "reduce_prod", &nm, &x4)?,
        3 => {
            let s = red(t, "reduce_sum", &format!("{name}_sum"), &x4)?;
            t.b.op1(
                "log",
                &nm,
                vec![
                    ("x", s.into()),
                    ("epsilon", In::C(Value::f32_scalar(p.epsilon))),
                ],
            )?
        }
        4 => red(t, "reduce_sum_square", &nm, &x4)?,
        5 => red(t, "reduce_l1_norm", &nm, &x4)?,
        6 => red(t, "reduce_l2_norm", &nm, &x4)?,
        7 => red(t, "reduce_max", &nm, &x4)?,
        8 => red(t, "reduce_min", &nm, &x4)?,
        9 => {
            ensure!(axes.len() == 1, "an argmax over more than one axis");
            let i = t.b.op1(
                "reduce_argmax",
                &format!("{name}_int"),
                vec![
                    ("x", In::from(&x4)),
                    ("axis", int(axes[0])),
                    ("keep_dims", keep()),
                ],
            )?;
            t.b.op1(
                "cast",
                &nm,
                vec![("x", i.into()), ("dtype", In::C(Value::str("fp32")))],
            )?
        }
        m => bail!("unknown reduce mode {m}"),
    };
    from_nchw(
        t,
        &y,
        &Nchw {
            rank: f.rank.max(3),
            ..f
        },
    )
}

fn padding(t: &mut Translator, name: &str, x: &V, p: &spec::PaddingLayerParams) -> Result<V> {
    use crate::ir::Value;
    use spec::padding_layer_params::PaddingType as P;
    let (x4, _, f) = to_nchw(t, x)?;
    let pads = match p
        .padding_amounts
        .as_ref()
        .map(|b| b.border_amounts.as_slice())
    {
        None | Some([]) => vec![0; 4],
        Some([h, w]) => vec![
            h.start_edge_size as i32,
            h.end_edge_size as i32,
            w.start_edge_size as i32,
            w.end_edge_size as i32,
        ],
        Some(o) => bail!("{} padding amounts (it takes 2: height, width)", o.len()),
    };
    let (mode, value) = match &p.padding_type {
        Some(P::Constant(c)) => ("constant", c.value),
        Some(P::Reflection(_)) => ("reflect", 0.0),
        Some(P::Replication(_)) => ("replicate", 0.0),
        None => ("constant", 0.0),
    };
    let y = t.b.op1(
        "pad",
        &format!("{name}_nchw"),
        vec![
            ("x", In::from(&x4)),
            ("pad", ints(&pads)),
            ("mode", In::C(Value::str(mode))),
            ("constant_val", In::C(Value::f32_scalar(value))),
        ],
    )?;
    from_nchw(t, &y, &f)
}

fn upsample(t: &mut Translator, name: &str, x: &V, p: &spec::UpsampleLayerParams) -> Result<V> {
    use crate::ir::Value;
    let (x4, _, f) = to_nchw(t, x)?;
    let (sh, sw) = match (
        p.scaling_factor.as_slice(),
        p.fractional_scaling_factor.as_slice(),
    ) {
        ([a, b], []) => (*a as f32, *b as f32),
        ([], [a, b]) => (*a, *b),
        ([], []) => (1.0, 1.0),
        _ => bail!(
            "scaling factors {:?} / {:?}",
            p.scaling_factor,
            p.fractional_scaling_factor
        ),
    };
    let nm = format!("{name}_nchw");
    let y = match (p.mode, p.linear_upsample_mode) {
        (0, _) => t.b.op1(
            "upsample_nearest_neighbor",
            &nm,
            vec![
                ("x", In::from(&x4)),
                ("scale_factor_height", In::C(Value::f32_scalar(sh))),
                ("scale_factor_width", In::C(Value::f32_scalar(sw))),
            ],
        )?,
        (1, m @ (1 | 2)) => t.b.op1(
            "upsample_bilinear",
            &nm,
            vec![
                ("x", In::from(&x4)),
                ("scale_factor_height", In::C(Value::f32_scalar(sh))),
                ("scale_factor_width", In::C(Value::f32_scalar(sw))),
                ("align_corners", In::C(Value::bool_scalar(m == 1))),
            ],
        )?,
        (1, _) => bail!("bilinear upsampling in the DEFAULT grid is not translated yet"),
        (m, _) => bail!("unknown upsampling mode {m}"),
    };
    from_nchw(t, &y, &f)
}

fn mvn(
    t: &mut Translator,
    name: &str,
    x: &V,
    p: &spec::MeanVarianceNormalizeLayerParams,
) -> Result<V> {
    let (x4, _, f) = to_nchw(t, x)?;
    let axes: &[i32] = if p.across_channels {
        &[1, 2, 3]
    } else {
        &[2, 3]
    };
    let mean = reduce_keep(t, "reduce_mean", &format!("{name}_mean"), &x4, axes)?;
    let centred = binary(t, "sub", &format!("{name}_centred"), &x4, &mean)?;
    let y = if p.normalize_variance {
        let sq = binary(t, "mul", &format!("{name}_sq"), &centred, &centred)?;
        let var = reduce_keep(t, "reduce_mean", &format!("{name}_var"), &sq, axes)?;
        let sd =
            t.b.op1("sqrt", &format!("{name}_sd"), vec![("x", var.into())])?;
        let eps = t.konst(&format!("{name}_eps"), &[], &[p.epsilon]);
        let den = binary(t, "add", &format!("{name}_den"), &sd, &eps)?;
        binary(t, "real_div", &format!("{name}_nchw"), &centred, &den)?
    } else {
        centred
    };
    from_nchw(t, &y, &f)
}

/// The rank-5 `slice` of one of C, H, W: `[start, end)` by `stride`, negative indices
/// counted from the end.
fn slice5(t: &mut Translator, name: &str, x: &V, p: &spec::SliceLayerParams) -> Result<V> {
    let s = t.shape(x)?;
    let r = s.len();
    ensure!(r >= 3, "a slice of a rank-{r} blob");
    let axis = r - 3 + p.axis as usize;
    ensure!(p.axis <= 2, "unknown slice axis {}", p.axis);
    let mut begin = vec![0i32; r];
    let mut end: Vec<i32> = s.iter().map(|&d| d as i32).collect();
    let mut stride = vec![1i32; r];
    begin[axis] = p.start_index as i32;
    end[axis] = p.end_index as i32;
    stride[axis] = p.stride.max(1) as i32;
    t.b.op1(
        "slice_by_index",
        name,
        vec![
            ("x", x.into()),
            ("begin", ints(&begin)),
            ("end", ints(&end)),
            ("stride", ints(&stride)),
        ],
    )
}

fn crop(t: &mut Translator, name: &str, inputs: &[V], p: &spec::CropLayerParams) -> Result<V> {
    let (x4, [_, _, h, w], f) = to_nchw(t, &inputs[0])?;
    let (ch, cw) = match inputs.len() {
        1 => {
            let b = p
                .crop_amounts
                .as_ref()
                .map(|b| b.border_amounts.as_slice())
                .unwrap_or(&[]);
            match b {
                [a, c] => (
                    [a.start_edge_size as i32, a.end_edge_size as i32],
                    [c.start_edge_size as i32, c.end_edge_size as i32],
                ),
                _ => bail!("{} crop amounts (it takes 2: height, width)", b.len()),
            }
        }
        2 => {
            let like = t.shape(&inputs[1])?;
            let (h2, w2) = (like[like.len() - 2], like[like.len() - 1]);
            let (oh, ow) = match p.offset.as_slice() {
                [a, b] => (*a as usize, *b as usize),
                [] => (0, 0),
                o => bail!("crop offset {o:?}"),
            };
            ensure!(
                oh + h2 <= h && ow + w2 <= w,
                "a crop of [{h2}, {w2}] at [{oh}, {ow}] from [{h}, {w}]"
            );
            (
                [oh as i32, (h - oh - h2) as i32],
                [ow as i32, (w - ow - w2) as i32],
            )
        }
        n => bail!("takes 1 or 2 inputs, the layer names {n}"),
    };
    let y = t.b.op1(
        "crop",
        &format!("{name}_nchw"),
        vec![
            ("x", In::from(&x4)),
            ("crop_height", ints(&ch)),
            ("crop_width", ints(&cw)),
        ],
    )?;
    from_nchw(t, &y, &f)
}

/// The dot product (or cosine similarity) of two `[C, 1, 1]` vectors per batch.
fn dot(t: &mut Translator, name: &str, x: &V, y: &V, cosine: bool) -> Result<V> {
    let (a, _, f) = to_nchw(t, x)?;
    let (b, _, _) = to_nchw(t, y)?;
    let sum = |t: &mut Translator, nm: &str, v: &V| reduce_keep(t, "reduce_sum", nm, v, &[1, 2, 3]);
    let ab = binary(t, "mul", &format!("{name}_ab"), &a, &b)?;
    let mut d = sum(t, &format!("{name}_dot"), &ab)?;
    if cosine {
        let aa = binary(t, "mul", &format!("{name}_aa"), &a, &a)?;
        let bb = binary(t, "mul", &format!("{name}_bb"), &b, &b)?;
        let na = sum(t, &format!("{name}_na"), &aa)?;
        let nb = sum(t, &format!("{name}_nb"), &bb)?;
        let nn = binary(t, "mul", &format!("{name}_nn"), &na, &nb)?;
        let inv =
            t.b.op1("rsqrt", &format!("{name}_inv"), vec![("x", nn.into())])?;
        d = binary(t, "mul", &format!("{name}_cos"), &d, &inv)?;
    }
    from_nchw(
        t,
        &d,
        &Nchw {
            rank: f.rank.max(3),
            ..f
        },
    )
}

/// `asinh` (`sign(x) log(|x| + sqrt(x² + 1))`, exact in sign for large negative x) or `acosh`
/// (`log(x + sqrt(x² - 1))`), which MIL has no op for.
fn inverse_hyperbolic(t: &mut Translator, name: &str, x: &V, sinh: bool) -> Result<V> {
    let base = if sinh {
        t.b.op1("abs", &format!("{name}_abs"), vec![("x", x.into())])?
    } else {
        x.clone()
    };
    let sq = binary(t, "mul", &format!("{name}_sq"), &base, &base)?;
    let one = t.konst(
        &format!("{name}_one"),
        &[],
        &[if sinh { 1.0 } else { -1.0 }],
    );
    let s1 = binary(t, "add", &format!("{name}_sum"), &sq, &one)?;
    let r =
        t.b.op1("sqrt", &format!("{name}_root"), vec![("x", s1.into())])?;
    let a = binary(t, "add", &format!("{name}_arg"), &base, &r)?;
    if !sinh {
        return t.b.op1("log", name, vec![("x", a.into())]);
    }
    let l =
        t.b.op1("log", &format!("{name}_log"), vec![("x", a.into())])?;
    let sg =
        t.b.op1("sign", &format!("{name}_sign"), vec![("x", x.into())])?;
    binary(t, "mul", name, &l, &sg)
}

/// `[front, back, top, bottom, left, right]` padding of a 3-D layer: its custom amounts,
/// none (`VALID`), or `SAME` (output `ceil(in / stride)`, the odd pixel at the end).
#[allow(clippy::too_many_arguments)]
fn pads3d(
    kind: i32,
    custom: [i32; 6],
    input: &[usize],
    k: [usize; 3],
    s: [usize; 3],
    d: [usize; 3],
) -> Result<Vec<i32>> {
    Ok(match kind {
        0 => custom.to_vec(),
        1 => vec![0; 6],
        2 => {
            let mut pads = vec![];
            for a in 0..3 {
                let out = input[a].div_ceil(s[a]);
                let need = ((out - 1) * s[a] + (k[a] - 1) * d[a] + 1).saturating_sub(input[a]);
                pads.extend([(need / 2) as i32, (need - need / 2) as i32]);
            }
            pads
        }
        o => bail!("unknown 3-D padding type {o}"),
    })
}

fn positive3(v: [i32; 3], default: usize, what: &str) -> Result<[usize; 3]> {
    let mut out = [default; 3];
    for (o, x) in out.iter_mut().zip(v) {
        ensure!(x >= 0, "{what} {v:?}");
        if x > 0 {
            *o = x as usize;
        }
    }
    Ok(out)
}

fn convolution3d(
    t: &mut Translator,
    name: &str,
    x: &V,
    p: &spec::Convolution3DLayerParams,
) -> Result<V> {
    ensure!(
        !p.is_deconvolution,
        "a 3-D deconvolution is not translated yet"
    );
    let s = t.shape(x)?;
    ensure!(
        s.len() == 5,
        "a 3-D convolution of a rank-{} blob (it takes [B, C, D, H, W])",
        s.len()
    );
    let k = positive3(
        [p.kernel_depth, p.kernel_height, p.kernel_width],
        3,
        "kernel",
    )?;
    let st = positive3(
        [p.stride_depth, p.stride_height, p.stride_width],
        1,
        "strides",
    )?;
    let dl = positive3(
        [p.dilation_depth, p.dilation_height, p.dilation_width],
        1,
        "dilations",
    )?;
    let groups = p.n_groups.max(1) as usize;
    let (cin, cout) = (p.input_channels as usize, p.output_channels as usize);
    ensure!(
        s[1] == cin && cin % groups == 0,
        "{} input channels for {cin} in {groups} group(s)",
        s[1]
    );
    let wshape = [cout, cin / groups, k[0], k[1], k[2]];
    let wv = weights(p.weights.as_ref(), wshape.iter().product(), "weights")?;
    let weight = t.konst(&format!("{name}_weight"), &wshape, &wv);
    let pads = pads3d(
        p.padding_type,
        [
            p.custom_padding_front,
            p.custom_padding_back,
            p.custom_padding_top,
            p.custom_padding_bottom,
            p.custom_padding_left,
            p.custom_padding_right,
        ],
        &s[2..],
        k,
        st,
        dl,
    )?;
    let mut inputs = vec![("x", In::from(x)), ("weight", In::V(weight))];
    if p.has_bias {
        let b = weights(p.bias.as_ref(), cout, "bias")?;
        inputs.push(("bias", In::V(t.konst(&format!("{name}_bias"), &[cout], &b))));
    }
    let to = |v: [usize; 3]| ints(&v.map(|x| x as i32));
    inputs.extend([
        ("strides", to(st)),
        ("dilations", to(dl)),
        ("groups", int(groups as i32)),
        ("pad_type", In::C(crate::ir::Value::str("custom"))),
        ("pad", ints(&pads)),
    ]);
    t.b.op1("conv", name, inputs)
}

fn pooling3d(t: &mut Translator, name: &str, x: &V, p: &spec::Pooling3DLayerParams) -> Result<V> {
    let s = t.shape(x)?;
    ensure!(
        s.len() == 5,
        "a 3-D pooling of a rank-{} blob (it takes [B, C, D, H, W])",
        s.len()
    );
    let k = positive3(
        [p.kernel_depth, p.kernel_height, p.kernel_width],
        1,
        "kernel",
    )?;
    let st = positive3(
        [p.stride_depth, p.stride_height, p.stride_width],
        1,
        "strides",
    )?;
    let pads = pads3d(
        p.padding_type,
        [
            p.custom_padding_front,
            p.custom_padding_back,
            p.custom_padding_top,
            p.custom_padding_bottom,
            p.custom_padding_left,
            p.custom_padding_right,
        ],
        &s[2..],
        k,
        st,
        [1, 1, 1],
    )?;
    let to = |v: [usize; 3]| ints(&v.map(|x| x as i32));
    let mut inputs = vec![
        ("x", In::from(x)),
        ("kernel_sizes", to(k)),
        ("strides", to(st)),
        ("pad_type", In::C(crate::ir::Value::str("custom"))),
        ("pad", ints(&pads)),
    ];
    let op = match p.r#type {
        0 => "max_pool",
        1 => {
            inputs.push((
                "exclude_padding_from_average",
                In::C(crate::ir::Value::bool_scalar(p.count_exclude_padding)),
            ));
            "avg_pool"
        }
        o => bail!("unknown 3-D pooling type {o}"),
    };
    t.b.op1(op, name, inputs)
}

/// A `reduce_*` op over `axes`, the reduced axes kept (as every rank-5 layer keeps them).
fn reduce_keep(t: &mut Translator, op: &str, name: &str, x: &V, axes: &[i32]) -> Result<V> {
    t.b.op1(
        op,
        name,
        vec![
            ("x", x.into()),
            ("axes", ints(axes)),
            ("keep_dims", In::C(crate::ir::Value::bool_scalar(true))),
        ],
    )
}
