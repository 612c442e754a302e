//! Calibration, the IR half: [`instrument`] adds to a program, for every weight the
//! compression pass would select, ops that reduce the weight's consumer input to its sum of
//! squares per input channel, exposed as extra outputs; [`Moments`] accumulates those sums
//! over many runs; [`Calibration`] is the saved result (mean of x² per input channel, the
//! diagonal of XᵀX / n) and expands it to the per-element importance that weighted k-means
//! takes. Running the instrumented program on audio is the caller's job (`crate::quality`).
//!
//! Why the diagonal of XᵀX: for an output y = W·x, the error a weight change ΔW causes is
//! E‖ΔW·x‖² = Σᵢⱼₖ ΔWᵢⱼ ΔWᵢₖ E[xⱼxₖ]; keeping only the diagonal gives Σᵢⱼ ΔWᵢⱼ² E[xⱼ²], a
//! squared error weighted per input channel — exactly what weighted 1-D k-means minimises.
//!
//! The full matrix (the Gram matrix H = XᵀX / n, [`Gram`]) is recorded too, for every weight
//! whose consumer reads one input vector per output position (linear, and conv with a 1×1
//! kernel): error feedback while rounding ([`super::feedback`]) needs the off-diagonal
//! terms. Weights whose consumers read the same input share one matrix.
//!
//! The statistics may also carry, per weight, an end-metric sensitivity curve ([`EndMetric`]:
//! the model's output divergence with only that weight compressed, per bit width, measured by
//! `crate::quality::sensitivity` or `crate::quality::encoder_sensitivity`), which the mixed-precision plan then uses instead of its
//! own per-op error estimate. It is stored in the file's metadata.

use super::select::{is_positional, Selection};
use crate::ir::{Arg, DType, Model, Operation, Value, ValueType, Var};
use crate::ir::{ArrayDType, Feature};
use crate::ops::builder::infer_op;
use crate::ops::{Axis, WeightLayout};
use anyhow::{bail, ensure, Context, Result};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;

/// Metadata key naming the component the statistics were measured on.
pub const COMPONENT_KEY: &str = "milkit.calibration.component";

/// Prefix of the outputs [`instrument`] adds.
pub const PROBE_PREFIX: &str = "calib__";

/// Prefix of the tensor names of Gram matrices in the statistics file.
pub const GRAM_TENSOR_PREFIX: &str = "gram:";

/// Prefix of the metadata keys naming, per weight, the Gram tensor of its input.
pub const GRAM_META_PREFIX: &str = "milkit.calibration.gram:";

/// Prefix of the metadata keys holding, per weight, its end-metric sensitivity curve.
pub const END_METRIC_META_PREFIX: &str = "milkit.calibration.end_metric:";

/// Metadata key describing what the end-metric curves measure (the sweep's measure, clips
/// and positions).
pub const END_METRIC_MEASURE_KEY: &str = "milkit.calibration.end_metric";

/// A weight's end-metric sensitivity: (bit width, the model output's divergence from the
/// uncompressed model with only this weight compressed at that width), widths ascending.
pub type EndMetric = Vec<(u32, f64)>;

/// One instrumented weight.
#[derive(Clone, Debug)]
pub struct Probe {
    /// The weight constant's name (the key of its statistics).
    pub weight: String,
    /// The consuming op.
    pub op: String,
    /// The extra output holding Σ x² per input channel (fp32 [channels]).
    pub output: String,
    /// Input channels of the consumer.
    pub channels: usize,
    /// Input positions summed per run (all axes but the channel axis).
    pub positions: u64,
    /// The extra output holding XᵀX of this run (fp32 [channels, channels]), when the
    /// consumer reads one input vector per output position; shared by consumers of one input.
    pub gram: Option<String>,
}

/// The consumer's weight parameter and its input's channel axis (`None` = last).
/// Only weights laid out `[C_out, C_in, …]` (conv, linear): their axis 1 is what the
/// statistics weight.
fn consumer(op: &Operation) -> Option<(&'static str, Option<usize>)> {
    let w = crate::ops::weight(&op.op_type)?;
    if w.layout != WeightLayout::OutIn {
        return None;
    }
    let axis = match w.x_channel_axis {
        Axis::At(a) => Some(a),
        Axis::Last => None,
    };
    Some((w.input, axis))
}

/// Returns a copy of `model` whose main function also outputs, for every selected weight
/// (same rules as the compression pass: op type, op names, threshold, fp16, never the
/// positional embedding), its consumer input's per-channel sum of squares (in fp32), and with
/// `grams` also its input's Gram matrix XᵀX (what error feedback needs: `dim²` values per
/// input, so opt-in — a large-v3 encoder's would be gigabytes).
pub fn instrument(model: &Model, sel: &Selection, grams: bool) -> Result<(Model, Vec<Probe>)> {
    let mut m = model.clone();
    let fname = if m.program.functions.contains_key("main") {
        "main".to_string()
    } else {
        match m.program.functions.keys().next() {
            Some(k) => k.clone(),
            None => bail!("the program has no function to instrument"),
        }
    };
    let f = m
        .program
        .functions
        .get_mut(&fname)
        .expect("function exists");
    let mut scope: HashMap<String, (ValueType, Option<Value>)> = f
        .inputs
        .iter()
        .map(|v| (v.name.clone(), (v.ty.clone(), None)))
        .collect();
    let mut consts: HashMap<String, (String, Value)> = HashMap::new();
    for op in &f.block.operations {
        for o in &op.outputs {
            scope.insert(o.name.clone(), (o.ty.clone(), op.const_val().cloned()));
        }
        if let Some(v) = op.const_val() {
            consts.insert(op.outputs[0].name.clone(), (op.name.clone(), v.clone()));
        }
    }
    let mut added = Vec::new();
    let mut probes = Vec::new();
    // Input variable → the output holding its Gram matrix.
    let mut gram_of_input: HashMap<String, String> = HashMap::new();
    for op in &f.block.operations {
        let Some((param, axis)) = consumer(op) else {
            continue;
        };
        if !sel.op_types.contains(&op.op_type) {
            continue;
        }
        let Some(Arg::Var(w)) = op.arg(param) else {
            continue;
        };
        let Some((cname, Value::Tensor(t))) = consts.get(w.as_str()) else {
            continue;
        };
        if !sel.op_names.is_empty() && !sel.op_names.iter().any(|n| *n == op.name || n == cname) {
            continue;
        }
        if t.dtype != DType::F16 || t.num_elements() <= sel.weight_threshold || is_positional(cname)
        {
            continue;
        }
        if probes.iter().any(|p: &Probe| p.weight == *cname) {
            continue; // a weight shared by two consumers is measured at its first
        }
        let Some(Arg::Var(x)) = op.arg("x") else {
            continue;
        };
        let Some((ValueType::Tensor(xt), _)) = scope.get(x.as_str()) else {
            continue;
        };
        let Some(shape) = xt.fixed_shape() else {
            bail!(
                "op `{}`: its input `{x}` has a dynamic shape; calibration needs fixed shapes",
                op.name
            );
        };
        let ax = axis.unwrap_or(shape.len().saturating_sub(1));
        ensure!(
            ax < shape.len(),
            "op `{}`: input `{x}` has rank {}",
            op.name,
            shape.len()
        );
        let channels = shape[ax];
        let positions: u64 = shape
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != ax)
            .map(|(_, d)| *d as u64)
            .product();
        let axes: Vec<i32> = (0..shape.len() as i32)
            .filter(|&i| i != ax as i32)
            .collect();
        let base = format!("{PROBE_PREFIX}{cname}");
        let x32 = format!("{base}__x32");
        let sq = format!("{base}__sq");
        let mut new_ops = vec![
            probe_op(
                "cast",
                &x32,
                vec![
                    ("x", Arg::Var(x.clone())),
                    ("dtype", Arg::Value(Value::str("fp32"))),
                ],
            ),
            probe_op("square", &sq, vec![("x", Arg::Var(x32.clone()))]),
            probe_op(
                "reduce_sum",
                &base,
                vec![
                    ("x", Arg::Var(sq.clone())),
                    ("axes", Arg::Value(Value::i32s(&axes))),
                    ("keep_dims", Arg::Value(Value::bool_scalar(false))),
                ],
            ),
        ];
        // The Gram matrix: the input as a [positions, channels] (or [channels, positions])
        // matrix times its own transpose. Only for one input vector per output position
        // (a 1×1 kernel), and when the channel axis is last or has only unit axes before it.
        let pointwise = t.shape.iter().skip(2).all(|&d| d == 1);
        let lead_units = shape[..ax].iter().all(|&d| d == 1);
        let mut gram = None;
        if grams && pointwise && (ax + 1 == shape.len() || lead_units) {
            if let Some(g) = gram_of_input.get(x.as_str()) {
                gram = Some(g.clone());
            } else {
                let g = format!("{base}__gram");
                let flat = format!("{g}__flat");
                let channels_last = ax + 1 == shape.len();
                let flat_shape = if channels_last {
                    [positions as i32, channels as i32]
                } else {
                    [channels as i32, positions as i32]
                };
                new_ops.push(probe_op(
                    "reshape",
                    &flat,
                    vec![
                        ("x", Arg::Var(x32.clone())),
                        ("shape", Arg::Value(Value::i32s(&flat_shape))),
                    ],
                ));
                new_ops.push(probe_op(
                    "matmul",
                    &g,
                    vec![
                        ("x", Arg::Var(flat.clone())),
                        ("y", Arg::Var(flat.clone())),
                        ("transpose_x", Arg::Value(Value::bool_scalar(channels_last))),
                        (
                            "transpose_y",
                            Arg::Value(Value::bool_scalar(!channels_last)),
                        ),
                    ],
                ));
                gram_of_input.insert(x.clone(), g.clone());
                gram = Some(g);
            }
        }
        for o in &mut new_ops {
            let tys = infer_op(o, f.opset, &scope)
                .with_context(|| format!("instrumenting op `{}`", op.name))?;
            o.outputs[0].ty = tys[0].clone();
            scope.insert(o.outputs[0].name.clone(), (tys[0].clone(), None));
        }
        added.extend(new_ops);
        probes.push(Probe {
            weight: cname.clone(),
            op: op.name.clone(),
            output: base,
            channels,
            positions,
            gram,
        });
    }
    ensure!(
        !probes.is_empty(),
        "no compressible weights selected (op types {:?}); nothing to calibrate",
        sel.op_types
    );
    f.block.operations.extend(added);
    let mut gram_outputs = HashSet::new();
    for p in &probes {
        f.block.outputs.push(p.output.clone());
        m.description
            .outputs
            .push(Feature::new(&p.output, ArrayDType::F32, &[p.channels]));
        if let Some(g) = &p.gram {
            if gram_outputs.insert(g.clone()) {
                f.block.outputs.push(g.clone());
                m.description.outputs.push(Feature::new(
                    g,
                    ArrayDType::F32,
                    &[p.channels, p.channels],
                ));
            }
        }
    }
    Ok((m, probes))
}

fn probe_op(op_type: &str, out: &str, inputs: Vec<(&str, Arg)>) -> Operation {
    Operation {
        op_type: op_type.into(),
        name: out.into(),
        inputs: inputs
            .into_iter()
            .map(|(k, a)| (k.to_string(), vec![a]))
            .collect(),
        outputs: vec![Var {
            name: out.into(),
            ty: ValueType::tensor(DType::F32, &[]),
        }],
        blocks: vec![],
        attributes: BTreeMap::new(),
    }
}

/// Running sums of x² per input channel, per weight, and of XᵀX per shared input, in f64.
#[derive(Clone, Debug, Default)]
pub struct Moments {
    sums: BTreeMap<String, (Vec<f64>, u64)>,
    /// Gram output name → (running XᵀX, positions).
    grams: BTreeMap<String, (Vec<f64>, u64)>,
    /// Weight → the Gram output of its input.
    gram_of: BTreeMap<String, String>,
    /// Runs accumulated (encoder windows, decoder steps).
    pub runs: u64,
}

impl Moments {
    /// Adds one run's probe outputs (`outputs` holds at least every probe's output, as f32).
    pub fn add(&mut self, probes: &[Probe], outputs: &BTreeMap<String, Vec<f32>>) -> Result<()> {
        for p in probes {
            let v = outputs
                .get(&p.output)
                .with_context(|| format!("the run returned no `{}`", p.output))?;
            ensure!(
                v.len() == p.channels,
                "`{}` has {} values, expected {}",
                p.output,
                v.len(),
                p.channels
            );
            let e = self
                .sums
                .entry(p.weight.clone())
                .or_insert_with(|| (vec![0.0; p.channels], 0));
            ensure!(
                e.0.len() == p.channels,
                "weight `{}` seen with two widths",
                p.weight
            );
            for (s, x) in e.0.iter_mut().zip(v) {
                *s += *x as f64;
            }
            e.1 += p.positions;
        }
        let mut done = HashSet::new();
        for p in probes {
            let Some(g) = &p.gram else { continue };
            self.gram_of.insert(p.weight.clone(), g.clone());
            if !done.insert(g.as_str()) {
                continue;
            }
            let v = outputs
                .get(g)
                .with_context(|| format!("the run returned no `{g}`"))?;
            ensure!(
                v.len() == p.channels * p.channels,
                "`{g}` has {} values, expected {} × {}",
                v.len(),
                p.channels,
                p.channels
            );
            let e = self
                .grams
                .entry(g.clone())
                .or_insert_with(|| (vec![0.0; v.len()], 0));
            ensure!(e.0.len() == v.len(), "Gram `{g}` seen with two widths");
            for (s, x) in e.0.iter_mut().zip(v) {
                *s += *x as f64;
            }
            e.1 += p.positions;
        }
        self.runs += 1;
        Ok(())
    }

    /// Mean of x² per channel for every weight seen.
    pub fn finish(&self, source: &str) -> Calibration {
        let moments = self
            .sums
            .iter()
            .map(|(k, (s, n))| {
                let n = (*n).max(1) as f64;
                (k.clone(), s.iter().map(|v| (v / n) as f32).collect())
            })
            .collect();
        let shared: BTreeMap<&String, Arc<Gram>> = self
            .grams
            .iter()
            .map(|(k, (s, n))| {
                let n = (*n).max(1) as f64;
                let dim = (s.len() as f64).sqrt().round() as usize;
                let data = s.iter().map(|v| (v / n) as f32).collect();
                (k, Arc::new(Gram { dim, data }))
            })
            .collect();
        let grams = self
            .gram_of
            .iter()
            .filter_map(|(w, g)| shared.get(g).map(|a| (w.clone(), Arc::clone(a))))
            .collect();
        let mut meta = BTreeMap::new();
        meta.insert("milkit.calibration.runs".into(), self.runs.to_string());
        meta.insert("milkit.calibration.source".into(), source.to_string());
        Calibration {
            moments,
            grams,
            meta,
        }
    }
}

/// The mean outer product of one weight's input vectors, H = XᵀX / n (fp32, row-major
/// `dim` × `dim`): what error feedback while rounding needs.
#[derive(Clone, Debug, PartialEq)]
pub struct Gram {
    pub dim: usize,
    pub data: Vec<f32>,
}

impl Gram {
    /// The same matrix with rows and columns reordered: new (i, k) = old (perm[i], perm[k]).
    pub fn permuted(&self, perm: &[usize]) -> Result<Gram> {
        ensure!(
            perm.len() == self.dim,
            "a {}-channel Gram matrix cannot take a {}-channel reordering",
            self.dim,
            perm.len()
        );
        let n = self.dim;
        let data = (0..n * n)
            .map(|idx| self.data[perm[idx / n] * n + perm[idx % n]])
            .collect();
        Ok(Gram { dim: n, data })
    }
}

/// Per-input-channel second moments of every calibrated weight's input.
#[derive(Clone, Debug, Default)]
pub struct Calibration {
    /// Weight constant name → E[x²] per input channel.
    pub moments: BTreeMap<String, Vec<f32>>,
    /// Weight constant name → the Gram matrix of its input (weights reading one input share
    /// one); absent for weights whose consumer is not pointwise, and in files written before.
    pub grams: BTreeMap<String, Arc<Gram>>,
    /// Provenance written into the file's metadata.
    pub meta: BTreeMap<String, String>,
}

impl Calibration {
    /// Writes the statistics as safetensors: one fp32 vector per weight name, one fp32
    /// `[dim, dim]` matrix `gram:<first weight>` per shared Gram matrix, and per weight with a
    /// matrix the metadata key `milkit.calibration.gram:<weight>` naming its tensor.
    pub fn save(&self, path: &Path, force: bool) -> Result<()> {
        let mut bytes: Vec<(String, Vec<u8>, Vec<usize>)> = self
            .moments
            .iter()
            .map(|(k, v)| (k.clone(), bytemuck::cast_slice(v).to_vec(), vec![v.len()]))
            .collect();
        let mut meta = self.meta.clone();
        meta.retain(|k, _| !k.starts_with(GRAM_META_PREFIX));
        let mut written: HashMap<*const Gram, String> = HashMap::new();
        for (w, g) in &self.grams {
            let name = match written.get(&Arc::as_ptr(g)) {
                Some(n) => n.clone(),
                None => {
                    let n = format!("{GRAM_TENSOR_PREFIX}{w}");
                    bytes.push((
                        n.clone(),
                        bytemuck::cast_slice(&g.data).to_vec(),
                        vec![g.dim, g.dim],
                    ));
                    written.insert(Arc::as_ptr(g), n.clone());
                    n
                }
            };
            meta.insert(format!("{GRAM_META_PREFIX}{w}"), name);
        }
        let views = bytes
            .iter()
            .map(|(k, b, shape)| {
                safetensors::tensor::TensorView::new(safetensors::Dtype::F32, shape.clone(), b)
                    .map(|v| (k.clone(), v))
            })
            .collect::<std::result::Result<Vec<_>, _>>()?;
        let data = safetensors::serialize(views, Some(meta.into_iter().collect()))
            .context("serializing calibration statistics")?;
        crate::package::fsio::write_file_atomically(path, &data, force)
    }

    /// The component the statistics were measured on (`milkit.calibration.component`:
    /// `encoder` or `decoder`); files written before the key existed are the encoder's.
    pub fn component(&self) -> &str {
        self.meta
            .get(COMPONENT_KEY)
            .map(String::as_str)
            .unwrap_or("encoder")
    }

    /// Reads statistics written by [`Calibration::save`].
    pub fn load(path: &Path) -> Result<Calibration> {
        let data = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
        let (_, meta) = safetensors::SafeTensors::read_metadata(&data)
            .with_context(|| format!("{} is not a safetensors file", path.display()))?;
        let st = safetensors::SafeTensors::deserialize(&data)
            .with_context(|| format!("{} is not a safetensors file", path.display()))?;
        let mut moments = BTreeMap::new();
        let mut gram_tensors: HashMap<String, Arc<Gram>> = HashMap::new();
        for (name, t) in st.tensors() {
            let v: Vec<f32> = t
                .data()
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            let nonfinite = v.iter().filter(|x| !x.is_finite()).count();
            if name.starts_with(GRAM_TENSOR_PREFIX) {
                let sh = t.shape();
                ensure!(
                    t.dtype() == safetensors::Dtype::F32 && sh.len() == 2 && sh[0] == sh[1],
                    "{}: Gram tensor `{name}` is {:?} {:?}, expected a square fp32 matrix",
                    path.display(),
                    t.dtype(),
                    sh
                );
                ensure!(
                    nonfinite == 0,
                    "{}: Gram matrix `{name}` holds {nonfinite} non-finite value(s) (NaN or ±Inf) \
                     of {}; measure the statistics again",
                    path.display(),
                    v.len()
                );
                gram_tensors.insert(
                    name,
                    Arc::new(Gram {
                        dim: sh[0],
                        data: v,
                    }),
                );
                continue;
            }
            ensure!(
                t.dtype() == safetensors::Dtype::F32 && t.shape().len() == 1,
                "{}: tensor `{name}` is {:?} {:?}, expected a 1-D fp32 vector",
                path.display(),
                t.dtype(),
                t.shape()
            );
            ensure!(
                nonfinite == 0,
                "{}: `{name}` holds {nonfinite} non-finite second moment(s) (NaN or ±Inf) \
                 of {}; measure the statistics again",
                path.display(),
                v.len()
            );
            let negative = v.iter().filter(|x| **x < 0.0).count();
            ensure!(
                negative == 0,
                "{}: `{name}` holds {negative} negative second moment(s) of {}",
                path.display(),
                v.len()
            );
            moments.insert(name, v);
        }
        let meta: BTreeMap<String, String> = meta
            .metadata()
            .clone()
            .map(|m| m.into_iter().collect())
            .unwrap_or_default();
        let mut grams = BTreeMap::new();
        for (k, tensor) in &meta {
            let Some(weight) = k.strip_prefix(GRAM_META_PREFIX) else {
                continue;
            };
            let g = gram_tensors.get(tensor).with_context(|| {
                format!(
                    "{}: metadata `{k}` names the Gram tensor `{tensor}`, which the file lacks",
                    path.display()
                )
            })?;
            if let Some(m) = moments.get(weight) {
                ensure!(
                    m.len() == g.dim,
                    "{}: weight `{weight}` has {} channels but its Gram matrix `{tensor}` is {} × {}",
                    path.display(),
                    m.len(),
                    g.dim,
                    g.dim
                );
            }
            grams.insert(weight.to_string(), Arc::clone(g));
        }
        Ok(Calibration {
            moments,
            grams,
            meta,
        })
    }

    /// Records `weight`'s end-metric sensitivity curve (replacing any earlier one).
    pub fn set_end_metric(&mut self, weight: &str, curve: &[(u32, f64)]) {
        let text = curve
            .iter()
            .map(|(b, v)| format!("{b}:{v:e}"))
            .collect::<Vec<_>>()
            .join(",");
        self.meta
            .insert(format!("{END_METRIC_META_PREFIX}{weight}"), text);
    }

    /// Records a sweep's curves, one per weight, and what they measure (under
    /// [`END_METRIC_MEASURE_KEY`]).
    pub fn set_end_metrics(&mut self, curves: &BTreeMap<String, EndMetric>, measure: String) {
        for (w, c) in curves {
            self.set_end_metric(w, c);
        }
        self.meta.insert(END_METRIC_MEASURE_KEY.into(), measure);
    }

    /// Whether any weight has an end-metric sensitivity curve.
    pub fn has_end_metric(&self) -> bool {
        self.meta
            .keys()
            .any(|k| k.starts_with(END_METRIC_META_PREFIX))
    }

    /// The scale the end-metric curves are on, if any: the component they were measured on
    /// (a decoder's curves are next-token KL divergences, an encoder's its output's relative
    /// squared error), so curves of different components cannot share one budget.
    pub fn end_metric_scale(&self) -> Option<&str> {
        self.has_end_metric().then(|| self.component())
    }

    /// `weight`'s end-metric sensitivity curve (widths ascending), if measured.
    pub fn end_metric(&self, weight: &str) -> Result<Option<EndMetric>> {
        let Some(text) = self.meta.get(&format!("{END_METRIC_META_PREFIX}{weight}")) else {
            return Ok(None);
        };
        let mut curve = EndMetric::new();
        for item in text.split(',') {
            let parsed = item.split_once(':').and_then(|(b, v)| {
                Some((b.trim().parse::<u32>().ok()?, v.trim().parse::<f64>().ok()?))
            });
            match parsed {
                Some((b, v)) if v.is_finite() && v >= 0.0 => curve.push((b, v)),
                _ => bail!(
                    "the end-metric curve of `{weight}` has the entry `{item}`; expected BITS:VALUE with a finite value ≥ 0"
                ),
            }
        }
        curve.sort_by_key(|c| c.0);
        ensure!(
            !curve.is_empty() && curve.windows(2).all(|w| w[0].0 < w[1].0),
            "the end-metric curve of `{weight}` (`{text}`) is empty or names a width twice"
        );
        Ok(Some(curve))
    }

    /// The Gram matrix of weight `weight`'s input, checked against the weight's shape
    /// ([out, in, 1…]): `None` when the statistics have none for it.
    pub fn gram(&self, weight: &str, shape: &[usize]) -> Result<Option<&Gram>> {
        let Some(g) = self.grams.get(weight) else {
            return Ok(None);
        };
        let rest: usize = shape.iter().skip(1).product();
        ensure!(
            shape.len() >= 2 && rest == g.dim,
            "the Gram matrix for `{weight}` is {} × {} but the weight is {shape:?}; calibrate the same model",
            g.dim,
            g.dim
        );
        Ok(Some(g))
    }

    /// The importance of each element of one output row of weight `weight` (shape
    /// [out, in, k...]): the input channel's second moment repeated over the kernel taps.
    /// `None` when the weight was not calibrated.
    pub fn importance(&self, weight: &str, shape: &[usize]) -> Result<Option<Vec<f32>>> {
        let Some(m) = self.moments.get(weight) else {
            return Ok(None);
        };
        let rest: usize = shape.iter().skip(1).product();
        ensure!(
            shape.len() >= 2 && rest.is_multiple_of(m.len()) && shape[1] == m.len(),
            "calibration for `{weight}` has {} channels but the weight is {shape:?}; calibrate the same model",
            m.len()
        );
        let taps = rest / m.len();
        // A channel that never carried signal still deserves a little weight, so its
        // elements are not left to any value at all.
        let mean = m.iter().map(|v| *v as f64).sum::<f64>() / m.len() as f64;
        let floor = (mean * 1e-6) as f32;
        Ok(Some(
            m.iter()
                .flat_map(|v| std::iter::repeat_n(v.max(floor), taps))
                .collect(),
        ))
    }
}
