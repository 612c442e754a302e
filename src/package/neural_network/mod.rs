//! NeuralNetwork models (`neuralNetwork`, `neuralNetworkClassifier`, `neuralNetworkRegressor`:
//! every Core ML model made before ML Programs) translated at load into an ML Program of the
//! MIL ops the runtime has, as Core ML itself runs them, so one interpreter and one set of
//! kernels serve both. The layers' own conventions live here: blob names, the rank-5
//! `[Seq, Batch, C, H, W]` layout of the first specifications (`RANK5_ARRAY_MAPPING`) or exact
//! shapes (`EXACT_ARRAY_MAPPING`, specification 4 and later), weights in `WeightParams`, the
//! image preprocessing a network declares, and a classifier's labels. Each layer type has one
//! definition in [`layers`]; a layer type without one is refused by name.

mod layers;
mod rank_n;

use crate::ir::{
    ArrayDType, ColorSpace, DType, Description, FeatureKind, Function, Opset, Program, Tensor,
    TensorType, Value, ValueType,
};
use crate::ops::builder::{ints, Builder, In, V};
use crate::proto::specification as spec;
use anyhow::{anyhow, bail, ensure, Context, Result};
use half::f16;
use std::collections::{BTreeMap, HashMap};

/// The opset of the translation: the lowest, which holds every op it emits.
pub const OPSET: Opset = Opset::Ios15;

/// The parts of the three NeuralNetwork model kinds that the translation reads.
pub struct Network<'a> {
    pub layers: &'a [spec::NeuralNetworkLayer],
    pub preprocessing: &'a [spec::NeuralNetworkPreprocessing],
    /// `RANK5_ARRAY_MAPPING` (0) or `EXACT_ARRAY_MAPPING` (1).
    pub array_mapping: i32,
    /// `RANK5_IMAGE_MAPPING` (0) or `RANK4_IMAGE_MAPPING` (1).
    pub image_mapping: i32,
    /// A classifier's labels and the blob holding its probabilities (empty: the last
    /// layer's output).
    pub classifier: Option<(&'a spec::neural_network_classifier::ClassLabels, &'a str)>,
}

impl<'a> Network<'a> {
    /// The network of a model of one of the three kinds; `None` for other model types.
    pub fn of(t: &'a spec::model::Type) -> Option<Result<Network<'a>>> {
        use spec::model::Type as T;
        Some(Ok(match t {
            T::NeuralNetwork(n) => Network {
                layers: &n.layers,
                preprocessing: &n.preprocessing,
                array_mapping: n.array_input_shape_mapping,
                image_mapping: n.image_input_shape_mapping,
                classifier: None,
            },
            T::NeuralNetworkRegressor(n) => Network {
                layers: &n.layers,
                preprocessing: &n.preprocessing,
                array_mapping: n.array_input_shape_mapping,
                image_mapping: n.image_input_shape_mapping,
                classifier: None,
            },
            T::NeuralNetworkClassifier(n) => {
                let Some(labels) = &n.class_labels else {
                    return Some(Err(anyhow!(
                        "the NeuralNetwork classifier has no class labels"
                    )));
                };
                Network {
                    layers: &n.layers,
                    preprocessing: &n.preprocessing,
                    array_mapping: n.array_input_shape_mapping,
                    image_mapping: n.image_input_shape_mapping,
                    classifier: Some((labels, n.label_probability_layer_name.as_str())),
                }
            }
            _ => return None,
        }))
    }
}

/// The program a network computes; `description` (read from the same model) has its
/// double-precision (and fp16) array inputs and outputs made fp32, the precision Core ML
/// computes NeuralNetworks in and the widest an ML Program's features take.
pub fn translate(net: &Network, description: &mut Description) -> Result<Program> {
    ensure!(
        description.functions.is_empty() && description.states.is_empty(),
        "a NeuralNetwork has one function and no states"
    );
    let rank5 = match net.array_mapping {
        0 => true,
        1 => false,
        m => bail!("unknown array input shape mapping {m}"),
    };
    let mut t = Translator {
        b: Builder::new(OPSET),
        blobs: HashMap::new(),
        rank5,
    };
    for fe in description.inputs.iter_mut() {
        ensure!(
            fe.flex == crate::ir::ShapeFlex::Fixed,
            "input `{}` accepts several shapes ({}); flexible NeuralNetwork inputs are not run \
             yet",
            fe.name,
            fe.flex
        );
        let v = match fe.kind {
            FeatureKind::Array => {
                if fe.dtype == ArrayDType::F64 || fe.dtype == ArrayDType::F16 {
                    fe.dtype = ArrayDType::F32;
                }
                let x = t.b.input(&fe.name, ValueType::Tensor(fe.tensor_type()));
                ensure!(x.0 == fe.name, "input name `{}` is used twice", fe.name);
                let x = if fe.dtype == ArrayDType::I32 {
                    t.b.op1(
                        "cast",
                        &format!("{}_fp32", fe.name),
                        vec![("x", x.into()), ("dtype", In::C(Value::str("fp32")))],
                    )?
                } else {
                    x
                };
                t.array_input(x, &fe.shape)
                    .with_context(|| format!("input `{}`", fe.name))?
            }
            FeatureKind::Image(c) => {
                let (h, w) = (fe.shape[0], fe.shape[1]);
                let ty = TensorType::new(DType::F32, &[1, c.channels(), h, w]);
                let x = t.b.input(&fe.name, ValueType::Tensor(ty));
                ensure!(x.0 == fe.name, "input name `{}` is used twice", fe.name);
                let x = t.preprocess(net, &fe.name, x, c)?;
                if net.image_mapping == 0 {
                    t.reshape(&x, &[1, 1, c.channels(), h, w])?
                } else {
                    x
                }
            }
            _ => bail!(
                "input `{}` is a {}; NeuralNetworks take arrays and images",
                fe.name,
                fe.type_name()
            ),
        };
        t.blobs.insert(fe.name.clone(), v);
    }
    for (i, layer) in net.layers.iter().enumerate() {
        layers::translate(&mut t, layer).with_context(|| format!("layer {i} `{}`", layer.name))?;
    }
    let last = net
        .layers
        .last()
        .and_then(|l| l.output.first())
        .cloned()
        .unwrap_or_default();
    let mut outputs = Vec::new();
    let mut classified = None;
    if let Some((labels, prob_blob)) = net.classifier {
        let blob = if !prob_blob.is_empty() {
            prob_blob.to_string()
        } else if t.blobs.contains_key(&description.predicted_probabilities) {
            description.predicted_probabilities.clone()
        } else {
            last.clone()
        };
        let p = t.blob(&blob)?;
        let n = t.shape(&p)?.iter().product::<usize>();
        let p = t.reshape(&p, &[n])?;
        let classes = class_list(labels, n)?;
        let out = t.b.op(
            "classify",
            "classify",
            vec![("probabilities", p.into()), ("classes", In::C(classes))],
        )?;
        classified = Some((out[0].clone(), out[1].clone()));
    }
    for fe in description.outputs.iter_mut() {
        if fe.kind == FeatureKind::Array && matches!(fe.dtype, ArrayDType::F64 | ArrayDType::F16) {
            fe.dtype = ArrayDType::F32;
        }
    }
    for i in 0..description.outputs.len() {
        let fe = &description.outputs[i];
        let v = match (&classified, fe.kind) {
            (Some((label, _)), _) if fe.name == description.predicted_feature => label.clone(),
            (Some((_, probs)), FeatureKind::Dict(_))
                if fe.name == description.predicted_probabilities =>
            {
                probs.clone()
            }
            (_, FeatureKind::Array) => {
                let v = t
                    .blob(&fe.name)
                    .with_context(|| format!("output `{}`", fe.name))?;
                let v = t
                    .array_output(v, &fe.shape)
                    .with_context(|| format!("output `{}`", fe.name))?;
                // Old descriptions often leave an output's shape out; it is what the layers
                // make.
                if let ValueType::Tensor(ty) = t.b.ty(&v)? {
                    if let Some(shape) = ty.fixed_shape() {
                        if shape.iter().product::<usize>() != fe.shape.iter().product::<usize>()
                            || fe.shape.is_empty()
                        {
                            description.outputs[i].shape = shape;
                        }
                    }
                }
                v
            }
            _ => bail!(
                "output `{}` is a {}, which no layer makes",
                fe.name,
                fe.type_name()
            ),
        };
        outputs.push(v);
    }
    // Each output its own variable, named as the description names it.
    let mut named = Vec::new();
    for (v, fe) in outputs.iter().zip(&description.outputs) {
        let v = if v.0 == fe.name || description.inputs.iter().any(|i| i.name == v.0) {
            t.b.op1(
                "identity",
                &format!("{}_out", fe.name),
                vec![("x", v.into())],
            )?
        } else {
            v.clone()
        };
        named.push((v, fe.name.as_str()));
    }
    let (inputs, block) = t.b.finish(&named)?;
    let mut functions = BTreeMap::new();
    functions.insert(
        "main".to_string(),
        Function {
            inputs,
            opset: OPSET,
            block,
        },
    );
    Ok(Program {
        functions,
        attributes: BTreeMap::new(),
        doc: String::new(),
    })
}

/// A classifier's labels as `classify`'s constant list, one per probability.
fn class_list(labels: &spec::neural_network_classifier::ClassLabels, n: usize) -> Result<Value> {
    use spec::neural_network_classifier::ClassLabels as L;
    let (elem, values): (DType, Vec<Value>) = match labels {
        L::StringClassLabels(s) => (DType::Str, s.vector.iter().map(|s| Value::str(s)).collect()),
        L::Int64ClassLabels(v) => (
            DType::I64,
            v.vector
                .iter()
                .map(|&i| {
                    let b = crate::ir::Bytes::from_vec(i.to_le_bytes().to_vec());
                    Tensor::new(DType::I64, vec![], b).map(Value::Tensor)
                })
                .collect::<Result<_>>()?,
        ),
    };
    ensure!(
        values.len() == n,
        "the classifier has {} class labels for {n} probabilities",
        values.len()
    );
    Ok(Value::List {
        elem: ValueType::Tensor(TensorType::scalar(elem)),
        values,
    })
}

/// The state of one translation: the program being built and the variable each blob name
/// holds now (a later layer may write a blob again).
pub(crate) struct Translator {
    pub b: Builder,
    pub blobs: HashMap<String, V>,
    /// Rank-5 blobs `[Seq, Batch, C, H, W]` (`RANK5_ARRAY_MAPPING`), else exact shapes.
    pub rank5: bool,
}

impl Translator {
    pub fn blob(&self, name: &str) -> Result<V> {
        self.blobs
            .get(name)
            .cloned()
            .ok_or_else(|| anyhow!("blob `{name}` is read before any layer writes it"))
    }

    /// The fixed shape of a variable.
    pub fn shape(&self, v: &V) -> Result<Vec<usize>> {
        match self.b.ty(v)? {
            ValueType::Tensor(t) => t
                .fixed_shape()
                .ok_or_else(|| anyhow!("`{}` has a shape not known at load ({})", v.0, t)),
            other => bail!("`{}` is a {other}, not a tensor", v.0),
        }
    }

    pub fn reshape(&mut self, x: &V, shape: &[usize]) -> Result<V> {
        if self.shape(x)? == shape {
            return Ok(x.clone());
        }
        let s: Vec<i32> = shape.iter().map(|&d| d as i32).collect();
        let name = format!("{}_reshaped", x.0);
        self.b.reshape(&name, x, &s)
    }

    pub fn transpose(&mut self, x: &V, perm: &[i32]) -> Result<V> {
        let name = format!("{}_transposed", x.0);
        self.b.op1(
            "transpose",
            &name,
            vec![("x", x.into()), ("perm", ints(perm))],
        )
    }

    /// A constant fp32 tensor.
    pub fn konst(&mut self, name: &str, shape: &[usize], v: &[f32]) -> V {
        self.b.konst(name, Value::Tensor(Tensor::f32(shape, v)))
    }

    /// An array input as a blob: rank 5 under `RANK5_ARRAY_MAPPING` (`[C]` → `[1, 1, C, 1,
    /// 1]`, `[C, H, W]` → `[1, 1, C, H, W]`), as it is otherwise.
    fn array_input(&mut self, x: V, shape: &[usize]) -> Result<V> {
        if !self.rank5 {
            return Ok(x);
        }
        let five = match *shape {
            [c] => [1, 1, c, 1, 1],
            [c, h, w] => [1, 1, c, h, w],
            [s, b, c, h, w] => [s, b, c, h, w],
            _ => bail!(
                "a rank-{} input under the rank-5 array mapping (it takes rank 1, 3 or 5)",
                shape.len()
            ),
        };
        self.reshape(&x, &five)
    }

    /// A blob as the output the description declares: its shape when it declares one with
    /// as many elements, else the blob as it is (without the unit sequence and batch axes of a
    /// rank-5 blob).
    fn array_output(&mut self, v: V, shape: &[usize]) -> Result<V> {
        if matches!(self.b.ty(&v)?, ValueType::Tensor(t) if t.fixed_shape().is_none()) {
            // A shape known only at run time (`fill_dynamic`, `non_zero`) is returned as
            // it comes.
            return Ok(v);
        }
        let have = self.shape(&v)?;
        let n: usize = have.iter().product();
        if !shape.is_empty() && shape.iter().product::<usize>() == n {
            return self.reshape(&v, shape);
        }
        if self.rank5 && have.len() == 5 && have[0] == 1 && have[1] == 1 {
            return self.reshape(&v, &have[2..]);
        }
        Ok(v)
    }

    /// An image input's pixels (`[1, C, H, W]`, 0–255) after the network's preprocessing for
    /// it: the scaler's `channelScale` and per-channel biases, or a mean image subtracted.
    fn preprocess(&mut self, net: &Network, name: &str, x: V, colors: ColorSpace) -> Result<V> {
        let channels = colors.channels();
        use spec::neural_network_preprocessing::Preprocessor as P;
        let Some(p) = net
            .preprocessing
            .iter()
            .find(|p| p.feature_name == name || (p.feature_name.is_empty()))
        else {
            return Ok(x);
        };
        match &p.preprocessor {
            None => Ok(x),
            Some(P::Scaler(s)) => {
                let scale = if s.channel_scale == 0.0 {
                    1.0
                } else {
                    s.channel_scale
                };
                // The image's channels are in the order its colour space names.
                let bias = match colors {
                    ColorSpace::Rgb => vec![s.red_bias, s.green_bias, s.blue_bias],
                    ColorSpace::Bgr => vec![s.blue_bias, s.green_bias, s.red_bias],
                    ColorSpace::Grayscale | ColorSpace::GrayscaleF16 => vec![s.gray_bias],
                };
                let sc = self.konst(&format!("{name}_scale"), &[], &[scale]);
                let y = self.b.op1(
                    "mul",
                    &format!("{name}_scaled"),
                    vec![("x", x.into()), ("y", sc.into())],
                )?;
                let bv = self.konst(&format!("{name}_bias"), &[1, channels, 1, 1], &bias);
                self.b.add(&format!("{name}_preprocessed"), &y, &bv)
            }
            Some(P::MeanImage(m)) => {
                let shape = self.shape(&x)?;
                ensure!(
                    m.mean_image.len() == shape.iter().product::<usize>(),
                    "the mean image of `{name}` has {} values for an image of {shape:?}",
                    m.mean_image.len()
                );
                let mv = self.konst(&format!("{name}_mean"), &shape, &m.mean_image);
                self.b.op1(
                    "sub",
                    &format!("{name}_preprocessed"),
                    vec![("x", x.into()), ("y", mv.into())],
                )
            }
        }
    }
}

/// A `WeightParams` as `n` fp32 values: fp32, fp16, or linear / lookup-table quantized
/// (`numberOfBits` 1–8, packed as Core ML packs them).
pub(crate) fn weights(w: Option<&spec::WeightParams>, n: usize, what: &str) -> Result<Vec<f32>> {
    let w = w.ok_or_else(|| anyhow!("{what}: no weights"))?;
    if !w.float_value.is_empty() {
        ensure!(
            w.float_value.len() == n,
            "{what}: {} fp32 values where {n} are needed",
            w.float_value.len()
        );
        return Ok(w.float_value.clone());
    }
    if !w.float16_value.is_empty() {
        ensure!(
            w.float16_value.len() == 2 * n,
            "{what}: {} bytes of fp16 values where {n} values are needed",
            w.float16_value.len()
        );
        return Ok(w
            .float16_value
            .chunks_exact(2)
            .map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect());
    }
    if !w.int8_raw_value.is_empty() {
        return int8(w, n, what);
    }
    if let Some(q) = &w.quantization {
        return dequantize(w, q, n, what);
    }
    if n == 0 {
        return Ok(vec![]);
    }
    bail!("{what}: no values (neither fp32, fp16 nor quantized) where {n} are needed")
}

/// Signed 8-bit weights (`int8RawValue`) times their linear quantization's scale, one or
/// one per output channel (the first axis).
fn int8(w: &spec::WeightParams, n: usize, what: &str) -> Result<Vec<f32>> {
    use spec::quantization_params::QuantizationType as Q;
    ensure!(
        w.int8_raw_value.len() == n,
        "{what}: {} int8 values where {n} are needed",
        w.int8_raw_value.len()
    );
    let scale = match w
        .quantization
        .as_ref()
        .and_then(|q| q.quantization_type.as_ref())
    {
        Some(Q::LinearQuantization(l))
            if !l.scale.is_empty() && n.is_multiple_of(l.scale.len()) =>
        {
            l.scale.clone()
        }
        _ => bail!("{what}: int8 values without one scale or one per output channel"),
    };
    let block = n / scale.len();
    Ok(w.int8_raw_value
        .iter()
        .enumerate()
        .map(|(i, &q)| q as i8 as f32 * scale[i / block])
        .collect())
}

/// Quantized weights: `numberOfBits`-bit codes packed most significant bit first in
/// `rawValue`, then either `scale * q + bias` (one scale and bias, or one per output
/// channel: the first axis) or a lookup table of `2^bits` fp32 values.
fn dequantize(
    w: &spec::WeightParams,
    q: &spec::QuantizationParams,
    n: usize,
    what: &str,
) -> Result<Vec<f32>> {
    use spec::quantization_params::QuantizationType as Q;
    let bits = q.number_of_bits as usize;
    ensure!(
        (1..=8).contains(&bits),
        "{what}: {bits}-bit quantization (Core ML quantizes to 1–8 bits)"
    );
    let raw = &w.raw_value;
    ensure!(
        raw.len() == (n * bits).div_ceil(8),
        "{what}: {} bytes of {bits}-bit codes where {n} values need {}",
        raw.len(),
        (n * bits).div_ceil(8)
    );
    let code = |i: usize| -> usize {
        let mut c = 0usize;
        for k in 0..bits {
            let bit = i * bits + k;
            let byte = raw[bit / 8];
            c = (c << 1) | ((byte >> (7 - bit % 8)) & 1) as usize;
        }
        c
    };
    match &q.quantization_type {
        Some(Q::LinearQuantization(l)) => {
            let per = l.scale.len();
            ensure!(
                per >= 1 && n.is_multiple_of(per) && (l.bias.len() == per || l.bias.len() == 1),
                "{what}: {} scales and {} biases for {n} values",
                per,
                l.bias.len()
            );
            let block = n / per;
            Ok((0..n)
                .map(|i| {
                    let ch = i / block;
                    let b = if l.bias.len() == 1 {
                        l.bias[0]
                    } else {
                        l.bias[ch]
                    };
                    l.scale[ch] * code(i) as f32 + b
                })
                .collect())
        }
        Some(Q::LookupTableQuantization(t)) => {
            ensure!(
                t.float_value.len() == 1 << bits,
                "{what}: a lookup table of {} values for {bits}-bit codes",
                t.float_value.len()
            );
            Ok((0..n).map(|i| t.float_value[code(i)]).collect())
        }
        None => bail!("{what}: quantization without a type"),
    }
}
