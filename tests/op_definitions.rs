//! The knowledge an op definition (`ops::OpDef`) carries beside its signature, checked
//! against that signature: a declared weight, the inputs read only as f32, input defaults,
//! the placement rule and the cost formula name inputs the op has, with values that fit.

use milkit::ops::placement::Flops;
use milkit::ops::{self, WeightLayout};
use milkit::verify::placement;

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

#[test]
fn every_constant_and_constexpr_op_and_no_other_is_placed_at_load_time() {
    for d in ops::all() {
        let constant = d.name == "const" || d.name.starts_with("constexpr_");
        let load_time = d
            .placement
            .is_some_and(|p| p.rule == ops::placement::LOAD_TIME.rule);
        assert_eq!(constant, load_time, "{} ({:?})", d.name, d.since);
    }
}

#[test]
fn every_placement_rule_an_op_carries_is_in_the_verifiers_table() {
    for d in ops::all() {
        let Some(p) = d.placement else { continue };
        let rule = placement::RULES
            .iter()
            .find(|r| r.id == p.rule)
            .unwrap_or_else(|| panic!("{}: rule `{}` is not in the table", d.name, p.rule));
        assert_eq!(
            (rule.statement, rule.source),
            (p.statement, p.source),
            "{}",
            d.name
        );
        assert!(!p.source.is_empty(), "{}: rule without a source", d.name);
    }
}

#[test]
fn the_state_machinery_is_placed_on_the_cpu() {
    for op in ["read_state", "coreml_update_state", "slice_update"] {
        let d = ops::earliest(op).unwrap();
        assert_eq!(
            d.placement.map(|p| p.rule),
            Some(ops::placement::STATE_MACHINERY.rule),
            "{op}"
        );
    }
}

#[test]
fn every_op_with_a_weight_has_a_cost_formula() {
    // The contractions carry most of a model's operations; the per-output default would
    // undercount them by their fan-in. (conv_transpose has none yet: it counts as
    // elementwise, as before the formulas moved into the definitions.)
    let mut bad = Vec::new();
    for d in ops::all() {
        if d.weight.is_some() && d.name != "conv_transpose" && !matches!(d.flops, Flops::Formula(_))
        {
            bad.push(d.name);
        }
    }
    assert!(bad.is_empty(), "ops with a weight and no formula: {bad:?}");
}

#[test]
fn every_default_belongs_to_an_optional_parameter() {
    let mut bad = Vec::new();
    for d in ops::all() {
        for i in d.inputs {
            if i.default.is_some() && !i.optional {
                bad.push(format!("{} ({:?}): `{}`", d.name, d.since, i.name));
            }
        }
    }
    assert!(bad.is_empty(), "defaults of required parameters: {bad:?}");
}

#[test]
fn every_version_of_an_op_declares_the_same_defaults() {
    // A default that changes between opsets would be a fact to write down; none does.
    for d in ops::all() {
        for i in d.inputs {
            for other in ops::all().filter(|o| o.name == d.name) {
                if let (Some(a), Some(b)) = (i.default, other.input(i.name).and_then(|o| o.default))
                {
                    assert_eq!(a, b, "{}: `{}` differs between versions", d.name, i.name);
                }
            }
        }
    }
}

#[test]
fn no_infer_or_eval_function_repeats_a_default() {
    // `cx.opt_…("p")?.unwrap_or(v)` restates a default the op's InputSpec holds; the
    // contexts' `…_or_default` accessors read it from there. The sites listed keep theirs
    // for a stated reason.
    let allowed: &[(&str, &str, &str)] = &[
        // Read by sub-contexts without a spec (the fused state update, the sparse decode).
        ("index.rs", "stride", "fused slice_update"),
        (
            "compression.rs",
            "vector_axis",
            "lut_to_sparse's dense decode",
        ),
        // A default that is no value of the parameter ("" = absent, checked later), a
        // parameter required in some version, or one an eval shared with ops lacking it reads.
        ("resample.rs", "sampling_mode", "absent"),
        ("resample.rs", "padding_mode", "absent"),
        ("resample.rs", "coordinates_mode", "absent"),
        ("resample.rs", "align_corners", "required in a version"),
        ("resample.rs", "padding_value", "required in a version"),
        ("resize.rs", "target_size_height", "required in a version"),
        ("resize.rs", "target_size_width", "required in a version"),
        (
            "pool.rs",
            "exclude_padding_from_average",
            "max_pool shares the eval, lacks it",
        ),
        ("resample.rs", "pad_value", "iOS15's crop_resize lacks it"),
        (
            "recurrent.rs",
            "reset_after",
            "rnn and lstm share the eval, lack it",
        ),
        (
            "tensor_ops.rs",
            "output_indices_dtype",
            "topk before iOS17 lacks it",
        ),
        ("tensor_ops.rs", "return_indices", "iOS15's topk lacks it"),
        ("scatter.rs", "batch_dims", "iOS15's gather_nd lacks it"),
        ("pool.rs", "epsilon", "per-op default passed in"),
    ];
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/ops");
    let mut found = Vec::new();
    for e in std::fs::read_dir(&dir).unwrap() {
        let path = e.unwrap().path();
        let file = path.file_name().unwrap().to_string_lossy().to_string();
        let text: String = std::fs::read_to_string(&path)
            .unwrap()
            .split_whitespace()
            .collect();
        for kind in ["int", "bool", "str", "f64", "ints"] {
            let pat = format!("cx.opt_{kind}(\"");
            let mut rest = text.as_str();
            while let Some(i) = rest.find(&pat) {
                rest = &rest[i + pat.len()..];
                let name = &rest[..rest.find('"').unwrap()];
                let after = &rest[name.len() + 1..];
                if after.starts_with(")?.unwrap_or") {
                    found.push((file.clone(), name.to_string()));
                }
            }
        }
    }
    let bad: Vec<_> = found
        .iter()
        .filter(|(f, n)| !allowed.iter().any(|(af, an, _)| af == f && an == n))
        .collect();
    assert!(
        bad.is_empty(),
        "defaults repeated in infer/eval functions (declare them in the InputSpec): {bad:?}"
    );
}
