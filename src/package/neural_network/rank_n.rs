//! The rank-N layers of specification 4 and later: exact shapes, numpy broadcasting, axes
//! counted from either end. Most are one MIL op; the NeuralNetwork conventions they add are
//! fp32 indices and booleans (a `gather`'s indices, a comparison's result, a `where`'s
//! condition are float blobs) and shapes known at load where MIL takes them as values.

use super::{weights, Translator};
use crate::ir::Value;
use crate::ops::builder::{int, ints, In, V};
use crate::proto::specification as spec;
use anyhow::{bail, ensure, Result};
use spec::neural_network_layer::Layer as L;

fn b(v: bool) -> In {
    In::C(Value::bool_scalar(v))
}

fn f(v: f32) -> In {
    In::C(Value::f32_scalar(v))
}

fn i32s(v: &[i64]) -> In {
    ints(&v.iter().map(|&a| a as i32).collect::<Vec<_>>())
}

/// An fp32 blob as int32 (indices, shapes, counts).
fn to_int(t: &mut Translator, x: &V) -> Result<V> {
    let name = format!("{}_int", x.0);
    t.b.op1(
        "cast",
        &name,
        vec![("x", x.into()), ("dtype", In::C(Value::str("int32")))],
    )
}

/// A blob of booleans or integers as the fp32 blob a NeuralNetwork holds.
fn to_float(t: &mut Translator, name: &str, x: &V) -> Result<V> {
    t.b.op1(
        "cast",
        name,
        vec![("x", x.into()), ("dtype", In::C(Value::str("fp32")))],
    )
}

/// An fp32 blob as booleans: non-zero is true.
fn to_bool(t: &mut Translator, x: &V) -> Result<V> {
    let zero = t.konst(&format!("{}_zero", x.0), &[], &[0.0]);
    t.b.op1(
        "not_equal",
        &format!("{}_bool", x.0),
        vec![("x", x.into()), ("y", zero.into())],
    )
}

/// Translates `kind` if it is a rank-N layer this file defines; `None` otherwise.
pub fn translate(
    t: &mut Translator,
    name: &str,
    kind: &L,
    inputs: &[V],
    n_outputs: usize,
) -> Result<Option<Vec<V>>> {
    let x = || -> Result<&V> {
        ensure!(!inputs.is_empty(), "takes an input, the layer names none");
        Ok(&inputs[0])
    };
    let two = || -> Result<(&V, &V)> {
        ensure!(
            inputs.len() == 2,
            "takes 2 inputs, the layer names {}",
            inputs.len()
        );
        Ok((&inputs[0], &inputs[1]))
    };
    let out = match kind {
        L::BatchedMatmul(p) => {
            if inputs.len() == 2 {
                // A rank-1 operand is a row (`a`) or a column (`b`) and stays rank 2.
                let (a, bm) = (inputs[0].clone(), inputs[1].clone());
                let a = match t.shape(&a)?.as_slice() {
                    [k] => t.reshape(&a, &[1, *k])?,
                    _ => a,
                };
                let bm = match t.shape(&bm)?.as_slice() {
                    [k] => t.reshape(&bm, &[*k, 1])?,
                    _ => bm,
                };
                vec![t.b.matmul(name, &a, &bm, p.transpose_a, p.transpose_b)?]
            } else {
                let (cin, cout) = (
                    p.weight_matrix_first_dimension as usize,
                    p.weight_matrix_second_dimension as usize,
                );
                // Stored as [C_out, C_in], as an inner product's.
                let w = weights(p.weights.as_ref(), cin * cout, "weights")?;
                let wv = t.konst(&format!("{name}_weight"), &[cout, cin], &w);
                let mut args = vec![("x", In::from(x()?)), ("weight", In::V(wv))];
                if p.has_bias {
                    let bias = weights(p.bias.as_ref(), cout, "bias")?;
                    args.push((
                        "bias",
                        In::V(t.konst(&format!("{name}_bias"), &[cout], &bias)),
                    ));
                }
                let xin = x()?.clone();
                if p.transpose_a {
                    let r = t.shape(&xin)?.len() as i32;
                    let mut perm: Vec<i32> = (0..r).collect();
                    perm.swap(r as usize - 1, r as usize - 2);
                    let xt = t.transpose(&xin, &perm)?;
                    args[0] = ("x", In::from(&xt));
                }
                vec![t.b.op1("linear", name, args)?]
            }
        }
        L::BroadcastToStatic(p) => {
            let shape: Vec<usize> = p.target_shape.iter().map(|&d| d as usize).collect();
            vec![broadcast(t, name, x()?, &shape)?]
        }
        L::BroadcastToLike(_) => {
            let (a, like) = two()?;
            let shape = t.shape(like)?;
            vec![broadcast(t, name, a, &shape)?]
        }
        L::EmbeddingNd(p) => {
            let (vocab, emb) = (p.vocab_size as usize, p.embedding_size as usize);
            // Stored as [embedding, vocabulary]; gathered by row after a transpose.
            let w = weights(p.weights.as_ref(), vocab * emb, "weights")?;
            let mut rows = vec![0f32; vocab * emb];
            for e in 0..emb {
                for v in 0..vocab {
                    rows[v * emb + e] = w[e * vocab + v];
                }
            }
            let table = t.konst(&format!("{name}_table"), &[vocab, emb], &rows);
            let xi = x()?.clone();
            let s = t.shape(&xi)?;
            ensure!(
                s.last() == Some(&1),
                "embedding indices of shape {s:?} (the last axis must be 1)"
            );
            let idx = to_int(t, &xi)?;
            let idx = t.reshape(&idx, &s[..s.len() - 1])?;
            let g = t.b.op1(
                "gather",
                &format!("{name}_rows"),
                vec![
                    ("x", table.into()),
                    ("indices", idx.into()),
                    ("axis", int(0)),
                ],
            )?;
            if p.has_bias {
                let bias = weights(p.bias.as_ref(), emb, "bias")?;
                let bv = t.konst(&format!("{name}_bias"), &[emb], &bias);
                vec![t.b.add(name, &g, &bv)?]
            } else {
                vec![t.b.op1("identity", name, vec![("x", g.into())])?]
            }
        }
        L::Equal(p) => vec![compare(t, name, "equal", inputs, p.alpha)?],
        L::NotEqual(p) => vec![compare(t, name, "not_equal", inputs, p.alpha)?],
        L::LessThan(p) => vec![compare(t, name, "less", inputs, p.alpha)?],
        L::LessEqual(p) => vec![compare(t, name, "less_equal", inputs, p.alpha)?],
        L::GreaterThan(p) => vec![compare(t, name, "greater", inputs, p.alpha)?],
        L::GreaterEqual(p) => vec![compare(t, name, "greater_equal", inputs, p.alpha)?],
        L::LogicalAnd(_) => vec![logical(t, name, "logical_and", inputs)?],
        L::LogicalOr(_) => vec![logical(t, name, "logical_or", inputs)?],
        L::LogicalXor(_) => vec![logical(t, name, "logical_xor", inputs)?],
        L::LogicalNot(_) => vec![logical(t, name, "logical_not", inputs)?],
        L::ReduceSum(p) => vec![reduce(
            t,
            name,
            "reduce_sum",
            x()?,
            &p.axes,
            p.keep_dims,
            p.reduce_all,
        )?],
        L::ReduceMean(p) => vec![reduce(
            t,
            name,
            "reduce_mean",
            x()?,
            &p.axes,
            p.keep_dims,
            p.reduce_all,
        )?],
        L::ReduceMax(p) => vec![reduce(
            t,
            name,
            "reduce_max",
            x()?,
            &p.axes,
            p.keep_dims,
            p.reduce_all,
        )?],
        L::ReduceMin(p) => vec![reduce(
            t,
            name,
            "reduce_min",
            x()?,
            &p.axes,
            p.keep_dims,
            p.reduce_all,
        )?],
        L::ReduceProd(p) => vec![reduce(
            t,
            name,
            "reduce_prod",
            x()?,
            &p.axes,
            p.keep_dims,
            p.reduce_all,
        )?],
        L::ReduceL1(p) => vec![reduce(
            t,
            name,
            "reduce_l1_norm",
            x()?,
            &p.axes,
            p.keep_dims,
            p.reduce_all,
        )?],
        L::ReduceL2(p) => vec![reduce(
            t,
            name,
            "reduce_l2_norm",
            x()?,
            &p.axes,
            p.keep_dims,
            p.reduce_all,
        )?],
        L::ReduceLogSum(p) => vec![reduce(
            t,
            name,
            "reduce_log_sum",
            x()?,
            &p.axes,
            p.keep_dims,
            p.reduce_all,
        )?],
        L::ReduceSumSquare(p) => vec![reduce(
            t,
            name,
            "reduce_sum_square",
            x()?,
            &p.axes,
            p.keep_dims,
            p.reduce_all,
        )?],
        L::ReduceLogSumExp(p) => vec![reduce(
            t,
            name,
            "reduce_log_sum_exp",
            x()?,
            &p.axes,
            p.keep_dims,
            p.reduce_all,
        )?],
        L::SplitNd(p) => {
            let mut args = vec![("x", In::from(x()?)), ("axis", int(p.axis as i32))];
            if p.split_sizes.is_empty() {
                let n = if p.num_splits == 0 {
                    n_outputs
                } else {
                    p.num_splits as usize
                };
                ensure!(n > 0, "a split into no parts");
                let s = t.shape(x()?)?;
                let r = s.len() as i64;
                let ax = if p.axis < 0 { p.axis + r } else { p.axis };
                ensure!((0..r).contains(&ax), "axis {} of a rank-{r} blob", p.axis);
                // Parts as numpy's array_split makes them: the first `len % n` one longer.
                let len = s[ax as usize];
                let sizes: Vec<i32> = (0..n)
                    .map(|i| (len / n + usize::from(i < len % n)) as i32)
                    .collect();
                args.push(("split_sizes", ints(&sizes)));
            } else {
                let s: Vec<i32> = p.split_sizes.iter().map(|&d| d as i32).collect();
                args.push(("split_sizes", ints(&s)));
            }
            t.b.op("split", name, args)?
        }
        L::ConcatNd(p) => vec![t.b.op1(
            "concat",
            name,
            vec![
                ("values", In::Vs(inputs.to_vec())),
                ("axis", int(p.axis as i32)),
                ("interleave", b(p.interleave)),
            ],
        )?],
        L::Stack(p) => vec![t.b.op1(
            "stack",
            name,
            vec![
                ("values", In::Vs(inputs.to_vec())),
                ("axis", int(p.axis as i32)),
            ],
        )?],
        L::Tile(_) if inputs.len() == 2 => bail!("a tile whose repetitions are an input"),
        L::Tile(p) => {
            // Fewer repetitions than axes repeat the last axes (numpy's `tile`).
            let r = t.shape(x()?)?.len();
            let mut reps: Vec<i64> = vec![1; r.saturating_sub(p.reps.len())];
            reps.extend(p.reps.iter().map(|&r| r as i64));
            vec![t.b.op1(
                "tile",
                name,
                vec![("x", x()?.into()), ("reps", i32s(&reps))],
            )?]
        }
        L::Transpose(p) => {
            let perm: Vec<i64> = p.axes.iter().map(|&a| a as i64).collect();
            vec![t.b.op1(
                "transpose",
                name,
                vec![("x", x()?.into()), ("perm", i32s(&perm))],
            )?]
        }
        L::Squeeze(p) => {
            let xi = x()?.clone();
            let s = t.shape(&xi)?;
            let axes: Vec<i64> = if p.squeeze_all {
                (0..s.len() as i64)
                    .filter(|&a| s[a as usize] == 1)
                    .collect()
            } else {
                p.axes.clone()
            };
            if axes.is_empty() || axes.len() == s.len() {
                // Squeezing every axis leaves a rank-1 `[1]` blob in a NeuralNetwork.
                let target: Vec<usize> = if axes.is_empty() { s.clone() } else { vec![1] };
                vec![t.b.reshape(
                    name,
                    &xi,
                    &target.iter().map(|&d| d as i32).collect::<Vec<_>>(),
                )?]
            } else {
                vec![t.b.op1(
                    "squeeze",
                    name,
                    vec![("x", xi.into()), ("axes", i32s(&axes))],
                )?]
            }
        }
        L::ExpandDims(p) => vec![t.b.op1(
            "expand_dims",
            name,
            vec![("x", x()?.into()), ("axes", i32s(&p.axes))],
        )?],
        L::FlattenTo2D(p) => {
            let xi = x()?.clone();
            let s = t.shape(&xi)?;
            let r = s.len() as i64;
            let axis = if p.axis < 0 { p.axis + r } else { p.axis };
            ensure!(
                (0..=r).contains(&axis),
                "axis {} of a rank-{r} blob",
                p.axis
            );
            let a: usize = s[..axis as usize].iter().product();
            let c: usize = s[axis as usize..].iter().product();
            vec![t.b.reshape(name, &xi, &[a as i32, c as i32])?]
        }
        L::ReshapeStatic(p) => {
            let s: Vec<i32> = p.target_shape.iter().map(|&d| d as i32).collect();
            vec![t.b.reshape(name, x()?, &s)?]
        }
        L::ReshapeLike(_) => {
            let (a, like) = two()?;
            let s: Vec<i32> = t.shape(like)?.iter().map(|&d| d as i32).collect();
            vec![t.b.reshape(name, a, &s)?]
        }
        L::RankPreservingReshape(p) => {
            let xi = x()?.clone();
            let s = t.shape(&xi)?;
            ensure!(
                p.target_shape.len() == s.len(),
                "a rank-preserving reshape to {:?} of {s:?}",
                p.target_shape
            );
            let target: Vec<i32> = p
                .target_shape
                .iter()
                .zip(&s)
                .map(|(&d, &have)| if d == 0 { have as i32 } else { d as i32 })
                .collect();
            vec![t.b.reshape(name, &xi, &target)?]
        }
        L::SliceStatic(p) => {
            let xi = x()?.clone();
            let mut args = vec![
                ("x", In::from(&xi)),
                ("begin", i32s(&p.begin_ids)),
                ("end", i32s(&p.end_ids)),
                ("begin_mask", In::C(bools(&p.begin_masks))),
                ("end_mask", In::C(bools(&p.end_masks))),
            ];
            if !p.strides.is_empty() {
                args.push(("stride", i32s(&p.strides)));
            }
            if !p.squeeze_masks.is_empty() {
                args.push(("squeeze_mask", In::C(bools(&p.squeeze_masks))));
            }
            vec![t.b.op1("slice_by_index", name, args)?]
        }
        L::TopK(p) => {
            let k = if inputs.len() == 2 {
                bail!("a top-k whose k is an input")
            } else {
                p.k as i32
            };
            let o = t.b.op(
                "topk",
                &format!("{name}_topk"),
                vec![
                    ("x", x()?.into()),
                    ("k", int(k)),
                    ("axis", int(p.axis as i32)),
                    ("ascending", b(p.use_bottom_k)),
                ],
            )?;
            let values = t.b.op1("identity", name, vec![("x", (&o[0]).into())])?;
            let idx = to_float(t, &format!("{name}_indices"), &o[1])?;
            vec![values, idx]
        }
        L::ArgMax(p) => vec![arg(t, name, "reduce_argmax", x()?, p.axis, p.remove_dim)?],
        L::ArgMin(p) => vec![arg(t, name, "reduce_argmin", x()?, p.axis, p.remove_dim)?],
        L::ArgSort(p) => {
            let o = t.b.op1(
                "argsort",
                &format!("{name}_int"),
                vec![
                    ("x", x()?.into()),
                    ("axis", int(p.axis as i32)),
                    ("ascending", b(!p.descending)),
                ],
            )?;
            vec![to_float(t, name, &o)?]
        }
        L::ClampedReLu(p) => vec![t.b.op1(
            "clamped_relu",
            name,
            vec![
                ("x", x()?.into()),
                ("alpha", f(p.alpha)),
                ("beta", f(p.beta)),
            ],
        )?],
        L::WhereBroadcastable(_) => {
            ensure!(
                inputs.len() == 3,
                "takes 3 inputs, the layer names {}",
                inputs.len()
            );
            let c = to_bool(t, &inputs[0])?;
            vec![t.b.op1(
                "select",
                name,
                vec![
                    ("cond", c.into()),
                    ("a", (&inputs[1]).into()),
                    ("b", (&inputs[2]).into()),
                ],
            )?]
        }
        L::LowerTriangular(p) => vec![triangle(t, name, x()?, p.k, true)?],
        L::UpperTriangular(p) => vec![triangle(t, name, x()?, p.k, false)?],
        L::MatrixBandPart(p) => vec![t.b.op1(
            "band_part",
            name,
            vec![
                ("x", x()?.into()),
                ("lower", int(p.num_lower as i32)),
                ("upper", int(p.num_upper as i32)),
            ],
        )?],
        L::CumSum(p) => {
            ensure!(inputs.len() == 1, "a cumulative sum whose axis is an input");
            vec![t.b.op1(
                "cumsum",
                name,
                vec![
                    ("x", x()?.into()),
                    ("axis", int(p.axis as i32)),
                    ("exclusive", b(p.exclude_final_sum)),
                    ("reverse", b(p.reverse)),
                ],
            )?]
        }
        L::OneHot(p) => {
            ensure!(inputs.len() == 1, "a one-hot whose size is an input");
            let idx = to_int(t, x()?)?;
            vec![t.b.op1(
                "one_hot",
                name,
                vec![
                    ("indices", idx.into()),
                    ("one_hot_vector_size", int(p.one_hot_vector_size as i32)),
                    ("axis", int(p.axis as i32)),
                    ("on_value", f(p.on_value)),
                    ("off_value", f(p.off_value)),
                ],
            )?]
        }
        L::FillStatic(p) => {
            let shape: Vec<usize> = p.target_shape.iter().map(|&d| d as usize).collect();
            let n = shape.iter().product();
            vec![t.konst(name, &shape, &vec![p.value; n])]
        }
        L::FillLike(p) => {
            let shape = t.shape(x()?)?;
            let n = shape.iter().product();
            vec![t.konst(name, &shape, &vec![p.value; n])]
        }
        L::FillDynamic(p) => {
            let s = to_int(t, x()?)?;
            vec![t.b.op1(
                "fill",
                name,
                vec![("shape", s.into()), ("value", f(p.value))],
            )?]
        }
        L::RangeStatic(p) => vec![t.b.op1(
            "range_1d",
            name,
            vec![
                ("end", f(p.end_value)),
                ("start", f(p.start_value)),
                ("step", f(p.step_size_value)),
            ],
        )?],
        L::Reverse(p) => {
            let axes: Vec<i64> = p
                .reverse_dim
                .iter()
                .enumerate()
                .filter(|(_, &r)| r)
                .map(|(i, _)| i as i64)
                .collect();
            vec![t.b.op1(
                "reverse",
                name,
                vec![("x", x()?.into()), ("axes", i32s(&axes))],
            )?]
        }
        L::Gather(p) => {
            let (a, i) = two()?;
            let idx = to_int(t, i)?;
            vec![t.b.op1(
                "gather",
                name,
                vec![
                    ("x", a.into()),
                    ("indices", idx.into()),
                    ("axis", int(p.axis as i32)),
                ],
            )?]
        }
        L::GatherAlongAxis(p) => {
            let (a, i) = two()?;
            let idx = to_int(t, i)?;
            vec![t.b.op1(
                "gather_along_axis",
                name,
                vec![
                    ("x", a.into()),
                    ("indices", idx.into()),
                    ("axis", int(p.axis as i32)),
                ],
            )?]
        }
        L::GatherNd(_) => {
            let (a, i) = two()?;
            let idx = to_int(t, i)?;
            vec![t.b.op1(
                "gather_nd",
                name,
                vec![("x", a.into()), ("indices", idx.into())],
            )?]
        }
        L::ScatterAlongAxis(p) => {
            ensure!(
                inputs.len() == 3,
                "takes 3 inputs, the layer names {}",
                inputs.len()
            );
            let idx = to_int(t, &inputs[1])?;
            vec![t.b.op1(
                "scatter_along_axis",
                name,
                vec![
                    ("data", (&inputs[0]).into()),
                    ("indices", idx.into()),
                    ("updates", (&inputs[2]).into()),
                    ("axis", int(p.axis as i32)),
                    ("mode", In::C(Value::str(scatter_mode(p.mode)?))),
                ],
            )?]
        }
        L::Scatter(p) => {
            ensure!(
                inputs.len() == 3,
                "takes 3 inputs, the layer names {}",
                inputs.len()
            );
            let idx = to_int(t, &inputs[1])?;
            vec![t.b.op1(
                "scatter",
                name,
                vec![
                    ("data", (&inputs[0]).into()),
                    ("indices", idx.into()),
                    ("updates", (&inputs[2]).into()),
                    ("axis", int(p.axis as i32)),
                    ("mode", In::C(Value::str(scatter_mode(p.mode)?))),
                ],
            )?]
        }
        L::ScatterNd(p) => {
            ensure!(
                inputs.len() == 3,
                "takes 3 inputs, the layer names {}",
                inputs.len()
            );
            let idx = to_int(t, &inputs[1])?;
            vec![t.b.op1(
                "scatter_nd",
                name,
                vec![
                    ("data", (&inputs[0]).into()),
                    ("indices", idx.into()),
                    ("updates", (&inputs[2]).into()),
                    ("mode", In::C(Value::str(scatter_mode(p.mode)?))),
                ],
            )?]
        }
        L::LayerNormalization(p) => {
            let shape: Vec<usize> = p.normalized_shape.iter().map(|&d| d as usize).collect();
            let n = shape.iter().product();
            let r = t.shape(x()?)?.len() as i32;
            let axes: Vec<i32> = (r - shape.len() as i32..r).collect();
            let g = weights(p.gamma.as_ref(), n, "gamma")?;
            let bt = weights(p.beta.as_ref(), n, "beta")?;
            let gv = Value::Tensor(crate::ir::Tensor::f32(&shape, &g));
            let bv = Value::Tensor(crate::ir::Tensor::f32(&shape, &bt));
            let xi = x()?.clone();
            vec![t
                .b
                .layer_norm(name, &xi, &axes, gv, bv, Value::f32_scalar(p.eps))?]
        }
        L::RandomNormalStatic(p) => {
            let shape = static_shape(&p.output_shape);
            vec![random(
                t,
                name,
                "random_normal",
                shape,
                p.seed,
                &[("mean", p.mean), ("stddev", p.std_dev)],
            )?]
        }
        L::RandomNormalLike(p) => {
            let shape = like_shape(t, x()?)?;
            vec![random(
                t,
                name,
                "random_normal",
                shape,
                p.seed,
                &[("mean", p.mean), ("stddev", p.std_dev)],
            )?]
        }
        L::RandomNormalDynamic(p) => {
            let shape = In::V(to_int(t, x()?)?);
            vec![random(
                t,
                name,
                "random_normal",
                shape,
                p.seed,
                &[("mean", p.mean), ("stddev", p.std_dev)],
            )?]
        }
        L::RandomUniformStatic(p) => {
            let shape = static_shape(&p.output_shape);
            vec![random(
                t,
                name,
                "random_uniform",
                shape,
                p.seed,
                &[("low", p.min_val), ("high", p.max_val)],
            )?]
        }
        L::RandomUniformLike(p) => {
            let shape = like_shape(t, x()?)?;
            vec![random(
                t,
                name,
                "random_uniform",
                shape,
                p.seed,
                &[("low", p.min_val), ("high", p.max_val)],
            )?]
        }
        L::RandomUniformDynamic(p) => {
            let shape = In::V(to_int(t, x()?)?);
            vec![random(
                t,
                name,
                "random_uniform",
                shape,
                p.seed,
                &[("low", p.min_val), ("high", p.max_val)],
            )?]
        }
        L::RandomBernoulliStatic(p) => {
            let shape = static_shape(&p.output_shape);
            vec![random(
                t,
                name,
                "random_bernoulli",
                shape,
                p.seed,
                &[("prob", p.prob)],
            )?]
        }
        L::RandomBernoulliLike(p) => {
            let shape = like_shape(t, x()?)?;
            vec![random(
                t,
                name,
                "random_bernoulli",
                shape,
                p.seed,
                &[("prob", p.prob)],
            )?]
        }
        L::RandomBernoulliDynamic(p) => {
            let shape = In::V(to_int(t, x()?)?);
            vec![random(
                t,
                name,
                "random_bernoulli",
                shape,
                p.seed,
                &[("prob", p.prob)],
            )?]
        }
        L::CategoricalDistribution(p) => {
            let mut xin = x()?.clone();
            if p.is_logits && p.temperature != 0.0 && p.temperature != 1.0 {
                let k = t.konst(
                    &format!("{name}_inv_temperature"),
                    &[],
                    &[1.0 / p.temperature],
                );
                xin = t.b.op1(
                    "mul",
                    &format!("{name}_tempered"),
                    vec![("x", xin.into()), ("y", k.into())],
                )?;
            }
            let mut args = vec![
                ("x", In::from(&xin)),
                (
                    "mode",
                    In::C(Value::str(if p.is_logits { "logits" } else { "probs" })),
                ),
                ("size", int(p.num_samples.max(1) as i32)),
            ];
            if p.seed != -1 {
                args.push(("seed", int(p.seed as i32)));
            }
            let c =
                t.b.op1("random_categorical", &format!("{name}_int"), args)?;
            vec![to_float(t, name, &c)?]
        }
        L::GetShape(_) => {
            let s =
                t.b.op1("shape", &format!("{name}_int"), vec![("x", x()?.into())])?;
            vec![to_float(t, name, &s)?]
        }
        L::WhereNonZero(_) => {
            let nz =
                t.b.op1("non_zero", &format!("{name}_int"), vec![("x", x()?.into())])?;
            vec![to_float(t, name, &nz)?]
        }
        L::SlidingWindows(p) => vec![t.b.op1(
            "sliding_windows",
            name,
            vec![
                ("x", x()?.into()),
                ("axis", int(p.axis as i32)),
                ("size", int(p.window_size as i32)),
                ("stride", int(p.step.max(1) as i32)),
            ],
        )?],
        L::SliceBySize(p) => {
            let (data, begin_in) = two()?;
            let s = t.shape(data)?;
            let r = s.len() as i64;
            let axis = if p.axis < 0 { p.axis + r } else { p.axis };
            ensure!((0..r).contains(&axis), "axis {} of a rank-{r} blob", p.axis);
            ensure!(p.size >= 1, "a slice of size {}", p.size);
            // The begin along `axis` comes at run time; every other axis is whole.
            let b1 = to_int(t, begin_in)?;
            let b1 = t.reshape(&b1, &[1])?;
            let mut parts = vec![];
            for a in 0..r {
                parts.push(if a == axis {
                    b1.clone()
                } else {
                    t.b.konst(
                        &format!("{name}_begin_{a}"),
                        Value::Tensor(crate::ir::Tensor::i32(&[1], &[0])),
                    )
                });
            }
            let begin = t.b.op1(
                "concat",
                &format!("{name}_begin"),
                vec![
                    ("values", In::Vs(parts)),
                    ("axis", int(0)),
                    ("interleave", b(false)),
                ],
            )?;
            let size: Vec<i32> = (0..r as usize)
                .map(|a| {
                    if a as i64 == axis {
                        p.size as i32
                    } else {
                        s[a] as i32
                    }
                })
                .collect();
            vec![t.b.op1(
                "slice_by_size",
                name,
                vec![
                    ("x", data.into()),
                    ("begin", begin.into()),
                    ("size", ints(&size)),
                ],
            )?]
        }
        L::ReshapeDynamic(_) => {
            let (data, shape) = two()?;
            let s = to_int(t, shape)?;
            vec![t.b.op1(
                "reshape",
                name,
                vec![("x", data.into()), ("shape", s.into())],
            )?]
        }
        L::RangeDynamic(p) => {
            // Inputs: the end, then optionally the start and the step (else the layer's).
            ensure!(
                (1..=3).contains(&inputs.len()),
                "takes 1 to 3 inputs, the layer names {}",
                inputs.len()
            );
            let scalar = |t: &mut Translator, v: &V, what: &str| {
                t.b.reshape(&format!("{name}_{what}"), v, &[])
            };
            let end = scalar(t, &inputs[0], "end")?;
            let start = match inputs.get(1) {
                Some(v) => In::V(scalar(t, v, "start")?),
                None => f(p.start_value),
            };
            let step = match inputs.get(2) {
                Some(v) => In::V(scalar(t, v, "step")?),
                None => f(p.step_size_value),
            };
            vec![t.b.op1(
                "range_1d",
                name,
                vec![("end", end.into()), ("start", start), ("step", step)],
            )?]
        }
        L::Copy(_) => vec![t.b.op1("identity", name, vec![("x", x()?.into())])?],
        _ => return Ok(None),
    };
    Ok(Some(out))
}

fn bools(v: &[bool]) -> Value {
    Value::Tensor(crate::ir::Tensor::bools(&[v.len()], v))
}

fn scatter_mode(m: i32) -> Result<&'static str> {
    Ok(match m {
        0 => "update",
        1 => "add",
        2 => "sub",
        3 => "mul",
        4 => "div",
        5 => "max",
        6 => "min",
        o => bail!("unknown scatter mode {o}"),
    })
}

/// `x` broadcast to `shape` (numpy rules): `x` plus zeros of that shape.
fn broadcast(t: &mut Translator, name: &str, x: &V, shape: &[usize]) -> Result<V> {
    let n = shape.iter().product();
    let z = t.konst(&format!("{name}_zeros"), shape, &vec![0.0; n]);
    t.b.add(name, x, &z)
}

/// A comparison of two blobs, or of one blob with `alpha`, as 1.0 / 0.0.
fn compare(t: &mut Translator, name: &str, op: &str, inputs: &[V], alpha: f32) -> Result<V> {
    let y = match inputs.len() {
        1 => t.konst(&format!("{name}_alpha"), &[], &[alpha]),
        2 => inputs[1].clone(),
        n => bail!("takes 1 or 2 inputs, the layer names {n}"),
    };
    let c = t.b.op1(
        op,
        &format!("{name}_bool"),
        vec![("x", (&inputs[0]).into()), ("y", y.into())],
    )?;
    to_float(t, name, &c)
}

fn logical(t: &mut Translator, name: &str, op: &str, inputs: &[V]) -> Result<V> {
    let want = if op == "logical_not" { 1 } else { 2 };
    ensure!(
        inputs.len() == want,
        "takes {want} input(s), the layer names {}",
        inputs.len()
    );
    let bs = inputs
        .iter()
        .map(|x| to_bool(t, x))
        .collect::<Result<Vec<_>>>()?;
    let mut args = vec![("x", In::from(&bs[0]))];
    if want == 2 {
        args.push(("y", In::from(&bs[1])));
    }
    let c = t.b.op1(op, &format!("{name}_bool"), args)?;
    to_float(t, name, &c)
}

fn reduce(
    t: &mut Translator,
    name: &str,
    op: &str,
    x: &V,
    axes: &[i64],
    keep: bool,
    all: bool,
) -> Result<V> {
    let r = t.shape(x)?.len() as i64;
    let axes: Vec<i64> = if all || axes.is_empty() {
        (0..r).collect()
    } else {
        axes.to_vec()
    };
    let y = t.b.op1(
        op,
        name,
        vec![
            ("x", x.into()),
            ("axes", i32s(&axes)),
            ("keep_dims", b(keep)),
        ],
    )?;
    if t.shape(&y)?.is_empty() {
        // A NeuralNetwork blob has rank 1 at least.
        return t.reshape(&y, &[1]);
    }
    Ok(y)
}

fn arg(t: &mut Translator, name: &str, op: &str, x: &V, axis: i64, remove: bool) -> Result<V> {
    let y = t.b.op1(
        op,
        &format!("{name}_int"),
        vec![
            ("x", x.into()),
            ("axis", int(axis as i32)),
            ("keep_dims", b(!remove)),
        ],
    )?;
    let y = to_float(t, name, &y)?;
    if t.shape(&y)?.is_empty() {
        return t.reshape(&y, &[1]);
    }
    Ok(y)
}

/// The lower (or upper) triangle of the last two axes from diagonal `k` on, the rest zero.
fn triangle(t: &mut Translator, name: &str, x: &V, k: i64, lower: bool) -> Result<V> {
    let s = t.shape(x)?;
    ensure!(s.len() >= 2, "a triangle of a rank-{} blob", s.len());
    let (rows, cols) = (s[s.len() - 2], s[s.len() - 1]);
    let mask: Vec<f32> = (0..rows * cols)
        .map(|i| {
            let (r, c) = ((i / cols) as i64, (i % cols) as i64);
            let keep = if lower { c - r <= k } else { c - r >= k };
            if keep {
                1.0
            } else {
                0.0
            }
        })
        .collect();
    let m = t.konst(&format!("{name}_mask"), &[rows, cols], &mask);
    t.b.op1("mul", name, vec![("x", x.into()), ("y", m.into())])
}

fn static_shape(shape: &[u64]) -> In {
    ints(&shape.iter().map(|&d| d as i32).collect::<Vec<_>>())
}

fn like_shape(t: &mut Translator, x: &V) -> Result<In> {
    let s = t.shape(x)?;
    Ok(ints(&s.iter().map(|&d| d as i32).collect::<Vec<_>>()))
}

/// A random layer's op with its parameters; a seed of -1 draws from the session's stream.
fn random(
    t: &mut Translator,
    name: &str,
    op: &str,
    shape: In,
    seed: i64,
    params: &[(&str, f32)],
) -> Result<V> {
    let mut args = vec![("shape", shape)];
    args.extend(params.iter().map(|&(k, v)| (k, f(v))));
    if seed != -1 {
        args.push(("seed", int(seed as i32)));
    }
    t.b.op1(op, name, args)
}
