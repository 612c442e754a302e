//! The knowledge an op definition (`ops::OpDef`) carries beside its signature, checked
//! against that signature: a declared weight, the inputs read only as f32, input defaults,
//! the placement rule and the cost formula name inputs the op has, with values that fit.

use milkit::ops::{self, WeightLayout};

#[test]
fn every_declared_weight_is_one_of_its_ops_inputs() {
    let mut bad = Vec::new();
    for d in ops::all() {
        if let Some(w) = d.weight {
            if d.input(w.input).is_none() {
                bad.push(format!("{} ({:?}): weight `{}`", d.name, d.since, w.input));
            }
        }
        for i in d.f32_inputs {
            if d.input(i).is_none() {
                bad.push(format!("{} ({:?}): f32 input `{i}`", d.name, d.since));
            }
        }
    }
    assert!(bad.is_empty(), "names that are no input of the op: {bad:?}");
}

#[test]
fn every_version_of_an_op_declares_the_same_weight() {
    for d in ops::all() {
        let first = ops::earliest(d.name).unwrap();
        assert_eq!(
            format!("{:?}", d.weight),
            format!("{:?}", first.weight),
            "{}: versions disagree on the weight",
            d.name
        );
    }
}

#[test]
fn the_contractions_compression_takes_declare_their_weights() {
    // The ops whose weights `milkit compress` rewrites, and the layout each weight has.
    for (op, input, layout) in [
        ("conv", "weight", WeightLayout::OutIn),
        ("linear", "weight", WeightLayout::OutIn),
        ("conv_transpose", "weight", WeightLayout::InOut),
        ("matmul", "y", WeightLayout::Operand),
    ] {
        let w = ops::weight(op).unwrap_or_else(|| panic!("{op} declares no weight"));
        assert_eq!((w.input, w.layout), (input, layout), "{op}");
    }
    assert!(ops::weight("add").is_none());
}

#[test]
fn a_packed_weight_is_read_only_as_f32_by_its_op() {
    // The runtime keeps a packed weight instead of the tensor: the op must read it through
    // `EvalCx::weight_f32` or the packed kernels, never as a plain tensor.
    for d in ops::all() {
        if let Some(w) = d.weight.filter(|w| w.packed) {
            assert!(
                d.f32_inputs.contains(&w.input),
                "{}: packed weight `{}` is not among its f32 inputs",
                d.name,
                w.input
            );
        }
    }
}
