//! The program as readable MIL text, in the spirit of coremltools' `print(prog)`:
//! `%name: (tensor<fp16, [1, 384, 1, 1500]>) = conv(x=%in, weight=%w, ...)`. Small constants
//! are printed in full, large ones summarised by dtype, shape and element count.

use crate::ir::{Arg, Block, DType, Model, Operation, Tensor, Value};
use std::fmt::Write;

/// Largest tensor whose values are printed.
pub const MAX_PRINTED_ELEMENTS: usize = 8;

fn number(dtype: DType, x: f64) -> String {
    if dtype == DType::Bool {
        (x != 0.0).to_string()
    } else if dtype.is_float() {
        // Shortest f32 text: enough digits to tell fp16/fp32 values apart, no noise.
        let s = (x as f32).to_string();
        if s.contains(['.', 'e', 'N', 'i']) {
            s
        } else {
            format!("{s}.0")
        }
    } else {
        format!("{}", x as i64)
    }
}

fn dims(shape: &[usize]) -> String {
    let d: Vec<String> = shape.iter().map(|x| x.to_string()).collect();
    format!("[{}]", d.join(", "))
}

fn tensor_text(t: &Tensor) -> String {
    let n = t.num_elements();
    if n <= MAX_PRINTED_ELEMENTS && !t.dtype.is_sub_byte() {
        if let Ok(v) = t.to_f64_vec() {
            let items: Vec<String> = v.iter().map(|&x| number(t.dtype, x)).collect();
            return if t.shape.is_empty() && items.len() == 1 {
                items[0].clone()
            } else if t.shape.len() <= 1 {
                format!("[{}]", items.join(", "))
            } else {
                format!("{}{}[{}]", t.dtype, dims(&t.shape), items.join(", "))
            };
        }
    }
    format!(
        "<{} {}: {} values, {} bytes>",
        t.dtype,
        dims(&t.shape),
        n,
        t.data.len()
    )
}

/// A constant value as short text.
pub fn value_text(v: &Value) -> String {
    match v {
        Value::Tensor(t) => tensor_text(t),
        Value::Strings { values, .. } if values.len() == 1 => format!("{:?}", values[0]),
        Value::Strings { values, .. } if values.len() <= MAX_PRINTED_ELEMENTS => {
            let s: Vec<String> = values.iter().map(|x| format!("{x:?}")).collect();
            format!("[{}]", s.join(", "))
        }
        Value::Strings { values, .. } => format!("<{} strings>", values.len()),
        Value::List { values, .. } if values.len() <= MAX_PRINTED_ELEMENTS => format!(
            "list[{}]",
            values.iter().map(value_text).collect::<Vec<_>>().join(", ")
        ),
        Value::List { values, .. } => format!("<list of {}>", values.len()),
        Value::Tuple(vs) => format!(
            "({})",
            vs.iter().map(value_text).collect::<Vec<_>>().join(", ")
        ),
        Value::Dict { entries, .. } if entries.len() <= MAX_PRINTED_ELEMENTS => format!(
            "{{{}}}",
            entries
                .iter()
                .map(|(k, v)| format!("{}: {}", value_text(k), value_text(v)))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        Value::Dict { entries, .. } => format!("<dict of {}>", entries.len()),
    }
}

fn arg_text(a: &Arg) -> String {
    match a {
        Arg::Var(n) => format!("%{n}"),
        Arg::Value(v) => value_text(v),
    }
}

fn op_text(out: &mut String, op: &Operation, indent: usize) {
    let pad = " ".repeat(indent);
    let outs: Vec<String> = op
        .outputs
        .iter()
        .map(|o| format!("%{}: ({})", o.name, o.ty))
        .collect();
    let mut args: Vec<String> = op
        .inputs
        .iter()
        .map(|(k, binds)| {
            if binds.len() == 1 {
                format!("{k}={}", arg_text(&binds[0]))
            } else {
                format!(
                    "{k}=({})",
                    binds.iter().map(arg_text).collect::<Vec<_>>().join(", ")
                )
            }
        })
        .collect();
    for (k, v) in &op.attributes {
        args.push(format!("{k}={}", value_text(v)));
    }
    let lhs = if outs.is_empty() {
        String::new()
    } else {
        format!("{} = ", outs.join(", "))
    };
    // The op's own name is shown only when it differs from its (single) output's.
    let named = match op.outputs.as_slice() {
        [o] if o.name == op.name => String::new(),
        _ if op.name.is_empty() => String::new(),
        _ => format!("[name={:?}]", op.name),
    };
    let _ = write!(out, "{pad}{lhs}{}{named}({})", op.op_type, args.join(", "));
    if op.blocks.is_empty() {
        out.push('\n');
        return;
    }
    out.push_str(" {\n");
    for (i, b) in op.blocks.iter().enumerate() {
        block_text(out, b, &format!("block{i}"), indent + 4);
    }
    let _ = writeln!(out, "{pad}}}");
}

fn block_text(out: &mut String, b: &Block, label: &str, indent: usize) {
    let pad = " ".repeat(indent);
    let ins: Vec<String> = b
        .inputs
        .iter()
        .map(|v| format!("%{}: {}", v.name, v.ty))
        .collect();
    let _ = writeln!(out, "{pad}{label}({}) {{", ins.join(", "));
    for op in &b.operations {
        op_text(out, op, indent + 4);
    }
    let outs: Vec<String> = b.outputs.iter().map(|o| format!("%{o}")).collect();
    let _ = writeln!(out, "{pad}}} -> ({})", outs.join(", "));
}

/// The whole program as MIL text.
pub fn print_mil(model: &Model) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "program(specification_version={})", model.spec_version);
    for (name, f) in &model.program.functions {
        let ins: Vec<String> = f
            .inputs
            .iter()
            .map(|v| format!("%{}: {}", v.name, v.ty))
            .collect();
        let _ = writeln!(
            out,
            "func {name}<{}>({}) {{",
            f.opset.opset_name(),
            ins.join(", ")
        );
        for op in &f.block.operations {
            op_text(&mut out, op, 4);
        }
        let outs: Vec<String> = f.block.outputs.iter().map(|o| format!("%{o}")).collect();
        let _ = writeln!(out, "}} -> ({})", outs.join(", "));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{Opset, ValueType};
    use crate::ops::{Builder, In};

    #[test]
    fn prints_ops_types_and_summarised_constants() {
        let mut b = Builder::new(Opset::Ios18);
        let x = b.input("x", ValueType::tensor(DType::F16, &[1, 4, 1, 10]));
        let w = b.konst(
            "w",
            Value::Tensor(Tensor::f16(&[8, 4, 1, 1], &[half::f16::ONE; 32])),
        );
        let y = b
            .op1(
                "conv",
                "proj",
                vec![
                    ("x", (&x).into()),
                    ("weight", In::V(w)),
                    ("pad_type", In::C(Value::str("valid"))),
                ],
            )
            .unwrap();
        let (inputs, block) = b.finish(&[(y, "out")]).unwrap();
        let m = Model::single(Opset::Ios18, inputs, block, Default::default());
        let text = print_mil(&m);
        assert!(
            text.contains("func main<CoreML8>(%x: tensor<fp16, [1, 4, 1, 10]>) {"),
            "{text}"
        );
        assert!(
            text.contains("%out: (tensor<fp16, [1, 8, 1, 10]>) = conv[name=\"proj\"](pad_type=%proj_pad_type, weight=%w, x=%x)"),
            "{text}"
        );
        assert!(
            text.contains("= const(val=<fp16 [8, 4, 1, 1]: 32 values, 64 bytes>)"),
            "{text}"
        );
        assert!(
            text.contains("%proj_pad_type: (tensor<string, []>) = const(val=\"valid\")"),
            "{text}"
        );
        assert!(text.trim_end().ends_with("} -> (%out)"), "{text}");
        assert_eq!(value_text(&Value::i32s(&[1, 2])), "[1, 2]");
        assert_eq!(value_text(&Value::f16_scalar(0.5)), "0.5");
        assert_eq!(value_text(&Value::bool_scalar(true)), "true");
    }
}
