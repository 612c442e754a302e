//! Building programs: [`Builder`] appends ops to a block, gives them unique names, and infers
//! every output type from the op's [`OpDef`](super::OpDef) as it goes, so a built program is
//! typed by construction. [`infer_op`] is the same check the package loader runs.

use super::{lookup, ArgInfo, BlockSig, InferCx, Kind};
use crate::ir::{Arg, Block, Operation, Opset, Value, ValueType, Var};
use anyhow::{anyhow, bail, ensure, Context, Result};
use std::collections::{BTreeMap, HashMap, HashSet};

/// A handle to a variable in the block being built.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct V(pub String);

/// How an input is supplied to [`Builder::op`].
pub enum In {
    /// An existing variable.
    V(V),
    /// A constant: the builder emits a `const` op named after the op and parameter.
    C(Value),
    /// A value bound inline in the op (as coremltools does for iOS18 `constexpr_*` data).
    Inline(Value),
    /// A list of variables for a variadic parameter.
    Vs(Vec<V>),
}

impl From<&V> for In {
    fn from(v: &V) -> In {
        In::V(v.clone())
    }
}
impl From<V> for In {
    fn from(v: V) -> In {
        In::V(v)
    }
}

/// Type information the inference of one op needs about the variables in scope.
pub trait Scope {
    fn lookup(&self, name: &str) -> Option<(&ValueType, Option<&Value>)>;
}

impl Scope for HashMap<String, (ValueType, Option<Value>)> {
    fn lookup(&self, name: &str) -> Option<(&ValueType, Option<&Value>)> {
        self.get(name).map(|(t, v)| (t, v.as_ref()))
    }
}

/// Checks `op` against its definition in `opset` (known op, known and required inputs,
/// constant-ness, defined variables) and returns the inferred output types.
pub fn infer_op(op: &Operation, opset: Opset, scope: &dyn Scope) -> Result<Vec<ValueType>> {
    let def = lookup(&op.op_type, opset).ok_or_else(|| match super::earliest(&op.op_type) {
        Some(d) => anyhow!(
            "op `{}` ({}) is not available in opset {} (needs {} or later)",
            op.op_type,
            op.name,
            opset.opset_name(),
            d.since.opset_name()
        ),
        None => anyhow!(
            "unknown op type `{}` ({}) in opset {}: milkit has no definition of it",
            op.op_type,
            op.name,
            opset.opset_name()
        ),
    })?;
    ensure!(
        op.blocks.is_empty() || super::control::takes_blocks(&op.op_type),
        "op `{}` ({}) holds {} nested block(s); only control flow ops (cond, while_loop) take \
         blocks",
        op.op_type,
        op.name,
        op.blocks.len()
    );
    let mut args: BTreeMap<&str, Vec<ArgInfo>> = BTreeMap::new();
    for (pname, binds) in &op.inputs {
        let spec = def
            .input(pname)
            .ok_or_else(|| anyhow!("op `{}` ({}) has no input `{pname}`", op.op_type, op.name))?;
        ensure!(
            spec.variadic || binds.len() == 1,
            "input `{pname}` of `{}` ({}) takes one value, got {}",
            op.op_type,
            op.name,
            binds.len()
        );
        let mut infos = Vec::new();
        for b in binds {
            let info = match b {
                Arg::Var(n) => {
                    let (ty, val) = scope.lookup(n).ok_or_else(|| {
                        anyhow!(
                            "op `{}` ({}) uses `{n}` before it is defined",
                            op.op_type,
                            op.name
                        )
                    })?;
                    ArgInfo {
                        ty: std::borrow::Cow::Borrowed(ty),
                        val,
                    }
                }
                Arg::Value(v) => ArgInfo {
                    ty: std::borrow::Cow::Owned(v.value_type()),
                    val: Some(v),
                },
            };
            // A constexpr may read another constexpr's output (coremltools chains a table
            // into a per-channel scale); such outputs are compile-time constants whose value
            // the scope does not hold, so a variable is accepted there.
            let chained = op.op_type.starts_with("constexpr_") && matches!(b, Arg::Var(_));
            if spec.kind == Kind::Const && info.val.is_none() && !chained {
                bail!(
                    "input `{pname}` of `{}` ({}) must be a constant",
                    op.op_type,
                    op.name
                );
            }
            infos.push(info);
        }
        args.insert(pname.as_str(), infos);
    }
    for spec in def.inputs {
        ensure!(
            spec.optional || args.contains_key(spec.name),
            "op `{}` ({}) lacks required input `{}`",
            op.op_type,
            op.name,
            spec.name
        );
    }
    let blocks = op
        .blocks
        .iter()
        .enumerate()
        .map(|(i, b)| block_sig(b, scope).with_context(|| format!("block {i} of `{}`", op.name)))
        .collect::<Result<Vec<_>>>()?;
    let cx = InferCx {
        op_type: &op.op_type,
        op_name: &op.name,
        opset,
        args,
        attributes: &op.attributes,
        blocks,
        spec: def.inputs,
    };
    (def.infer)(&cx).with_context(|| format!("type inference of `{}` ({})", op.op_type, op.name))
}

/// The types of a nested block: its inputs as declared, each output the type of the block
/// input, block op output (as declared; the loader re-infers those first) or outer
/// variable (from `scope`) of that name.
pub fn block_sig(b: &Block, scope: &dyn Scope) -> Result<BlockSig> {
    let outputs = b
        .outputs
        .iter()
        .map(|o| {
            b.inputs
                .iter()
                .chain(b.operations.iter().flat_map(|op| &op.outputs))
                .rev()
                .find(|v| v.name == *o)
                .map(|v| v.ty.clone())
                .or_else(|| scope.lookup(o).map(|(t, _)| t.clone()))
                .ok_or_else(|| anyhow!("block output `{o}` is never defined"))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(BlockSig {
        inputs: b.inputs.iter().map(|v| v.ty.clone()).collect(),
        outputs,
    })
}

/// Builds one block (a function body) op by op.
pub struct Builder {
    opset: Opset,
    inputs: Vec<Var>,
    ops: Vec<Operation>,
    env: HashMap<String, (ValueType, Option<Value>)>,
    names: HashSet<String>,
}

impl Builder {
    pub fn new(opset: Opset) -> Builder {
        Builder {
            opset,
            inputs: vec![],
            ops: vec![],
            env: HashMap::new(),
            names: HashSet::new(),
        }
    }

    pub fn opset(&self) -> Opset {
        self.opset
    }

    /// A name not used yet in this block: `base`, else `base_1`, `base_2`, ...
    pub fn unique(&mut self, base: &str) -> String {
        let mut n = base.to_string();
        let mut i = 1;
        while self.names.contains(&n) {
            n = format!("{base}_{i}");
            i += 1;
        }
        self.names.insert(n.clone());
        n
    }

    /// Declares a function input.
    pub fn input(&mut self, name: &str, ty: ValueType) -> V {
        let n = self.unique(name);
        self.env.insert(n.clone(), (ty.clone(), None));
        self.inputs.push(Var {
            name: n.clone(),
            ty,
        });
        V(n)
    }

    /// Emits a `const` op.
    pub fn konst(&mut self, name: &str, v: Value) -> V {
        let n = self.unique(name);
        let ty = v.value_type();
        let mut attributes = BTreeMap::new();
        attributes.insert("val".to_string(), v.clone());
        self.ops.push(Operation {
            op_type: "const".into(),
            name: n.clone(),
            inputs: BTreeMap::new(),
            outputs: vec![Var {
                name: n.clone(),
                ty: ty.clone(),
            }],
            blocks: vec![],
            attributes,
        });
        self.env.insert(n.clone(), (ty, Some(v)));
        V(n)
    }

    /// Type of a variable in scope.
    pub fn ty(&self, v: &V) -> Result<&ValueType> {
        self.env
            .get(&v.0)
            .map(|e| &e.0)
            .ok_or_else(|| anyhow!("unknown variable `{}`", v.0))
    }

    /// Appends an op; returns its outputs.
    pub fn op(&mut self, op_type: &str, name: &str, inputs: Vec<(&str, In)>) -> Result<Vec<V>> {
        self.op_with_blocks(op_type, name, inputs, vec![])
    }

    /// Builds a nested block (of `cond` or `while_loop`) with inputs of the given types:
    /// `f` appends its ops (it may read every variable in scope here) and returns its
    /// outputs. What the block defines is out of scope afterwards.
    pub fn block(
        &mut self,
        inputs: &[(&str, ValueType)],
        f: impl FnOnce(&mut Builder, &[V]) -> Result<Vec<V>>,
    ) -> Result<Block> {
        let outer_ops = std::mem::take(&mut self.ops);
        let outer_env = self.env.clone();
        let mut vars = vec![];
        let mut vs = vec![];
        for (n, ty) in inputs {
            let n = self.unique(n);
            self.env.insert(n.clone(), (ty.clone(), None));
            vars.push(Var {
                name: n.clone(),
                ty: ty.clone(),
            });
            vs.push(V(n));
        }
        let outs = f(self, &vs);
        let operations = std::mem::replace(&mut self.ops, outer_ops);
        self.env = outer_env;
        Ok(Block {
            inputs: vars,
            operations,
            outputs: outs?.into_iter().map(|v| v.0).collect(),
        })
    }

    /// Appends an op holding nested blocks (made with [`Builder::block`]); returns its
    /// outputs.
    pub fn op_with_blocks(
        &mut self,
        op_type: &str,
        name: &str,
        inputs: Vec<(&str, In)>,
        blocks: Vec<Block>,
    ) -> Result<Vec<V>> {
        let name = self.unique(name);
        let mut bound = BTreeMap::new();
        for (p, i) in inputs {
            let binds = match i {
                In::V(v) => vec![Arg::Var(v.0)],
                In::Vs(vs) => vs.into_iter().map(|v| Arg::Var(v.0)).collect(),
                In::Inline(v) => vec![Arg::Value(v)],
                In::C(v) => {
                    let c = self.konst(&format!("{name}_{p}"), v);
                    vec![Arg::Var(c.0)]
                }
            };
            bound.insert(p.to_string(), binds);
        }
        let mut op = Operation {
            op_type: op_type.to_string(),
            name: name.clone(),
            inputs: bound,
            outputs: vec![],
            blocks,
            attributes: BTreeMap::new(),
        };
        let types = infer_op(&op, self.opset, &self.env)?;
        let single = types.len() == 1;
        for (i, ty) in types.into_iter().enumerate() {
            let vn = if single {
                name.clone()
            } else {
                self.unique(&format!("{name}_{i}"))
            };
            self.env.insert(vn.clone(), (ty.clone(), None));
            op.outputs.push(Var { name: vn, ty });
        }
        let outs = op.outputs.iter().map(|v| V(v.name.clone())).collect();
        self.ops.push(op);
        Ok(outs)
    }

    /// [`Builder::op`] for single-output ops.
    pub fn op1(&mut self, op_type: &str, name: &str, inputs: Vec<(&str, In)>) -> Result<V> {
        let mut o = self.op(op_type, name, inputs)?;
        ensure!(o.len() == 1, "`{op_type}` has {} outputs", o.len());
        Ok(o.remove(0))
    }

    /// Finishes the block with `outputs`, renaming each output variable to the given name
    /// (the ABI's output names), and returns (function inputs, block).
    pub fn finish(mut self, outputs: &[(V, &str)]) -> Result<(Vec<Var>, Block)> {
        let mut names = Vec::new();
        for (v, want) in outputs {
            if v.0 != *want {
                ensure!(
                    !self.env.contains_key(*want),
                    "output name `{want}` is already taken"
                );
                let op = self
                    .ops
                    .iter_mut()
                    .rev()
                    .find(|o| o.outputs.iter().any(|x| x.name == v.0))
                    .ok_or_else(|| anyhow!("output `{}` is not produced by an op", v.0))?;
                let old = v.0.clone();
                for o in op.outputs.iter_mut() {
                    if o.name == old {
                        o.name = want.to_string();
                    }
                }
                ensure!(
                    !self.ops.iter().any(|o| o
                        .inputs
                        .values()
                        .flatten()
                        .any(|a| *a == Arg::Var(old.clone()))),
                    "output `{old}` is also used inside the block; add an identity first"
                );
            }
            names.push(want.to_string());
        }
        Ok((
            self.inputs,
            Block {
                inputs: vec![],
                operations: self.ops,
                outputs: names,
            },
        ))
    }
}

/// A constant int32 vector input.
pub fn ints(v: &[i32]) -> In {
    In::C(Value::i32s(v))
}

/// A constant int32 scalar input.
pub fn int(v: i32) -> In {
    In::C(Value::i32_scalar(v))
}

/// Typed helpers for the ops graph builders use most: each adds one op (and the constants
/// it reads) and returns its output.
impl Builder {
    /// `conv` with unit strides and dilations, `valid` padding and one group; `w` (and
    /// `bias`) become constants `{name}_weight` (`{name}_bias`). With a `[C_out, C_in, 1, 1]`
    /// weight it is a linear layer on `[N, C_in, 1, S]` activations.
    pub fn conv(&mut self, name: &str, x: &V, w: Value, bias: Option<Value>) -> Result<V> {
        let wv = self.konst(&format!("{name}_weight"), w);
        let mut inputs = vec![("x", In::from(x)), ("weight", In::V(wv))];
        if let Some(bv) = bias {
            let bv = self.konst(&format!("{name}_bias"), bv);
            inputs.push(("bias", In::V(bv)));
        }
        inputs.extend([
            ("strides", ints(&[1, 1])),
            ("pad_type", In::C(Value::str("valid"))),
            ("dilations", ints(&[1, 1])),
            ("groups", int(1)),
        ]);
        self.op1("conv", name, inputs)
    }

    /// `layer_norm` over `axes`; `gamma` and `beta` become constants `{name}_gamma` and
    /// `{name}_beta`.
    pub fn layer_norm(
        &mut self,
        name: &str,
        x: &V,
        axes: &[i32],
        gamma: Value,
        beta: Value,
        epsilon: Value,
    ) -> Result<V> {
        let g = self.konst(&format!("{name}_gamma"), gamma);
        let bt = self.konst(&format!("{name}_beta"), beta);
        self.op1(
            "layer_norm",
            name,
            vec![
                ("x", x.into()),
                ("axes", ints(axes)),
                ("gamma", In::V(g)),
                ("beta", In::V(bt)),
                ("epsilon", In::C(epsilon)),
            ],
        )
    }

    /// `gelu` in `mode` (`EXACT`, `TANH_APPROXIMATION`, `SIGMOID_APPROXIMATION`).
    pub fn gelu(&mut self, name: &str, x: &V, mode: &str) -> Result<V> {
        self.op1(
            "gelu",
            name,
            vec![("x", x.into()), ("mode", In::C(Value::str(mode)))],
        )
    }

    /// `add` (broadcasting).
    pub fn add(&mut self, name: &str, x: &V, y: &V) -> Result<V> {
        self.op1("add", name, vec![("x", x.into()), ("y", y.into())])
    }

    /// `reshape` to a constant `shape` (one entry may be -1).
    pub fn reshape(&mut self, name: &str, x: &V, shape: &[i32]) -> Result<V> {
        self.op1(
            "reshape",
            name,
            vec![("x", x.into()), ("shape", ints(shape))],
        )
    }

    /// `matmul`, either operand transposed (its last two axes) first.
    pub fn matmul(
        &mut self,
        name: &str,
        x: &V,
        y: &V,
        transpose_x: bool,
        transpose_y: bool,
    ) -> Result<V> {
        self.op1(
            "matmul",
            name,
            vec![
                ("x", x.into()),
                ("y", y.into()),
                ("transpose_x", In::C(Value::bool_scalar(transpose_x))),
                ("transpose_y", In::C(Value::bool_scalar(transpose_y))),
            ],
        )
    }

    /// `softmax` along `axis`.
    pub fn softmax(&mut self, name: &str, x: &V, axis: i32) -> Result<V> {
        self.op1("softmax", name, vec![("x", x.into()), ("axis", int(axis))])
    }
}
