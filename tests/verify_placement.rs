//! Predicted placement: the rule table applied to the BC1S encoder graph, an unsplit vocab
//! head, fp32, dynamic shapes, states, int32 arithmetic and compressed weights; the byte
//! accounting of compressed weights; and which ops off the Neural Engine the summary names.

mod common;

use common::encoders::*;
use half::f16;
use milkit::ir::{
    ArrayDType, Bytes, DType, Dim, Feature, Opset, Tensor, TensorType, Value, ValueType,
};
use milkit::ops::{Builder, In};
use milkit::report::{ComputeUnit, PlacementReport, PlacementRow};
use milkit::verify::placement;
use milkit::whisper::encoder::EncoderAbi;

fn fired(row: &milkit::report::PlacementRow, rule: &str) -> bool {
    row.rules.iter().any(|r| r == rule)
}

#[test]
fn fp16_bc1s_encoder_runs_on_the_ane() {
    let enc = placement::predict(&tiny_encoder(EncoderAbi::WhisperKit));
    for t in ["conv", "softmax", "layer_norm"] {
        let r = rows(&enc, t);
        assert!(!r.is_empty());
        for row in r {
            assert_eq!(row.unit, ComputeUnit::Ane, "{row:?}");
            assert_eq!(row.basis, "predicted");
            assert!(fired(row, "fp16_static"));
        }
    }
    assert!(enc
        .ops
        .iter()
        .all(|r| matches!(r.unit, ComputeUnit::Ane | ComputeUnit::LoadTime)));
    let ane = enc
        .totals
        .iter()
        .find(|t| t.unit == ComputeUnit::Ane)
        .unwrap();
    assert_eq!(ane.flops_share, 1.0);
    // 1x1 conv fc1: 2 · (128 · 1500) outputs · 64 inputs.
    let fc1 = enc.ops.iter().find(|r| r.name == "layers_0_fc1").unwrap();
    assert_eq!(fc1.flops, 2 * 128 * 1500 * 64);
    // Constants run on no unit and cost nothing per prediction.
    for r in rows(&enc, "const") {
        assert_eq!(
            (r.unit, r.flops, r.rules.as_slice()),
            (
                ComputeUnit::LoadTime,
                0,
                &["load_time_constant".to_string()][..]
            )
        );
    }

    // whisper.cpp ABI: the fp32 input/output casts leave the ANE, nothing else.
    let cpp = placement::predict(&tiny_encoder(EncoderAbi::WhisperCpp));
    for r in rows(&cpp, "cast") {
        assert_eq!(r.unit, ComputeUnit::Gpu, "{r:?}");
        assert!(fired(r, "fp32_compute"));
    }
    assert!(rows(&cpp, "conv")
        .iter()
        .all(|r| r.unit == ComputeUnit::Ane));
}

#[test]
fn an_unsplit_vocab_head_and_fp32_leave_the_ane() {
    let head = placement::predict(&conv_net(8, 51_866, ArrayDType::F16));
    let r = rows(&head, "conv")[0];
    assert_ne!(r.unit, ComputeUnit::Ane);
    assert!(fired(r, "ane_output_channels"), "{r:?}");
    let gpu = head
        .totals
        .iter()
        .find(|t| t.unit == ComputeUnit::Gpu)
        .unwrap();
    assert_eq!((gpu.ops, gpu.flops_share), (1, 1.0));

    let r = placement::predict(&conv_net(8, 16, ArrayDType::F32));
    assert_eq!(rows(&r, "conv")[0].unit, ComputeUnit::Gpu);
    assert!(fired(rows(&r, "conv")[0], "fp32_compute"));
}

#[test]
fn dynamic_shapes_leave_the_ane() {
    let mut b = Builder::new(Opset::Ios18);
    let shape = vec![Dim::Fixed(1), Dim::Fixed(8), Dim::Fixed(1), Dim::Unknown];
    let x = b.input(
        "x",
        ValueType::Tensor(TensorType {
            dtype: DType::F16,
            shape,
        }),
    );
    let w = b.konst("w", f16_tensor(&[8, 8, 1, 1]));
    let y = b
        .op1("conv", "c", vec![("x", (&x).into()), ("weight", In::V(w))])
        .unwrap();
    let m = model(
        b,
        y,
        vec![],
        Feature::new("y", ArrayDType::F16, &[1, 8, 1, 1]),
    );
    let r = placement::predict(&m);
    let conv = rows(&r, "conv")[0];
    assert!(fired(conv, "dynamic_shape") && !fired(conv, "fp16_static"));
    assert_eq!(conv.unit, ComputeUnit::Gpu);
}

#[test]
fn states_and_int32_arithmetic_run_on_the_cpu() {
    let mut b = Builder::new(Opset::Ios18);
    let s = b.input(
        "cache",
        ValueType::State(TensorType::new(DType::F16, &[1, 4])),
    );
    let pos = b.input("pos", ValueType::tensor(DType::I32, &[1]));
    let one = b.konst("one", Value::i32s(&[1]));
    b.op1("add", "next", vec![("x", (&pos).into()), ("y", In::V(one))])
        .unwrap();
    let c = b
        .op1("read_state", "read", vec![("input", (&s).into())])
        .unwrap();
    let m = model(b, c, vec![], Feature::new("c", ArrayDType::F16, &[1, 4]));
    let r = placement::predict(&m);
    assert_eq!(rows(&r, "read_state")[0].unit, ComputeUnit::Cpu);
    assert!(fired(rows(&r, "read_state")[0], "state_machinery"));
    assert!(fired(rows(&r, "add")[0], "int32_arithmetic"));
    assert_eq!(rows(&r, "add")[0].unit, ComputeUnit::Cpu);
}

#[test]
fn per_block_int4_risks_the_cpu_and_lut4_keeps_the_ane() {
    let mut b = Builder::new(Opset::Ios18);
    let x = b.input("x", ValueType::tensor(DType::F16, &[1, 64]));
    let w = int4_weight(&mut b, 32, 64, 32);
    let y = b
        .op1(
            "linear",
            "q4",
            vec![("x", (&x).into()), ("weight", In::V(w))],
        )
        .unwrap();
    let idx = Tensor::new(
        DType::U4,
        vec![32, 64],
        Bytes::from_vec(vec![0x10; 32 * 64 / 2]),
    )
    .unwrap();
    // Grouped-channel LUT: 2 groups of 16 output channels, 16 entries each.
    let lut = Tensor::f16(&[2, 1, 16, 1], &[f16::from_f32(0.5); 32]);
    let inputs = vec![
        ("indices", In::Inline(Value::Tensor(idx))),
        ("lut", In::Inline(Value::Tensor(lut))),
    ];
    let lw = b.op1("constexpr_lut_to_dense", "w_lut", inputs).unwrap();
    let z = b
        .op1(
            "linear",
            "lut",
            vec![("x", (&x).into()), ("weight", In::V(lw))],
        )
        .unwrap();
    let s = b
        .op1("add", "sum", vec![("x", In::V(y)), ("y", In::V(z))])
        .unwrap();
    let m = model(b, s, vec![], Feature::new("s", ArrayDType::F16, &[1, 32]));
    let r = placement::predict(&m);
    let q4 = r.ops.iter().find(|o| o.name == "q4").unwrap();
    assert_eq!(q4.unit, ComputeUnit::Cpu);
    assert!(fired(q4, "int4_per_block"));
    let l4 = r.ops.iter().find(|o| o.name == "lut").unwrap();
    assert_eq!(l4.unit, ComputeUnit::Ane);
    assert!(fired(l4, "lut_keeps_ane"));

    // Stored bytes: int4 data 32·64/2 + fp16 scales 32·2·2; uint4 indices 32·64/2 + 32 fp16
    // LUT entries. Dense: two fp16 [32, 64] weights.
    let c = milkit::verify::analysis::constant_data(&m);
    assert_eq!(
        c.weights.by_storage["int4_blockwise"].bytes,
        32 * 64 / 2 + 32 * 2 * 2
    );
    assert_eq!(c.weights.by_storage["lut4"].bytes, 32 * 64 / 2 + 32 * 2);
    let dense = 2 * (2 * 32 * 64) as u64;
    assert_eq!(c.weights.compressed_dense_fp16_bytes, dense);
    let stored = (32 * 64 / 2 + 128 + 32 * 64 / 2 + 64) as f64;
    assert!((c.weights.compression_ratio.unwrap() - dense as f64 / stored).abs() < 1e-12);
    assert_eq!(c.constexpr.ops[0].feeds[0].name, "q4");
    assert_eq!(c.constexpr.counts["constexpr_lut_to_dense"], 1);
}

/// A placement row of function `f` with the given unit, rules and costs.
fn row(
    f: &str,
    name: &str,
    unit: ComputeUnit,
    rules: &[&str],
    flops: u64,
    bytes: u64,
) -> PlacementRow {
    PlacementRow {
        function: f.into(),
        op_type: "op".into(),
        name: name.into(),
        output: name.into(),
        unit,
        basis: "predicted".into(),
        rules: rules.iter().map(|r| r.to_string()).collect(),
        flops,
        bytes,
        measured: None,
    }
}

#[test]
fn ops_off_the_ane_are_material_from_a_thousandth_of_their_functions_cost() {
    use ComputeUnit::*;
    let ops = vec![
        // Function `a`: 1,000,000 FLOP and 1,000,000 bytes at run time.
        row("a", "big", Ane, &["fp16_static"], 997_000, 996_000),
        row("a", "at_the_line", Gpu, &["fp32_compute"], 1_000, 0),
        row("a", "bytes_only", Cpu, &["int32_arithmetic"], 0, 2_000),
        row("a", "below", Gpu, &["fp32_compute"], 999, 999),
        row(
            "a",
            "unknown_shape",
            Gpu,
            &["dynamic_shape", "fp32_compute"],
            0,
            0,
        ),
        // Load-time constants count in neither the totals nor the list.
        row("a", "weights", LoadTime, &["load_time_constant"], 0, 0),
        row("a", "rest", Ane, &["fp16_static"], 1_001, 1_001),
        // Function `b` is weighed on its own: a tiny op is all of it.
        row("b", "alone", Cpu, &["state_machinery"], 10, 10),
    ];
    assert_eq!(
        ops.iter()
            .filter(|r| r.function == "a")
            .map(|r| (r.flops, r.bytes))
            .fold((0, 0), |s, c| (s.0 + c.0, s.1 + c.1)),
        (1_000_000, 1_000_000)
    );
    let p = PlacementReport {
        basis: "predicted".into(),
        rules: placement::rule_table(),
        totals: placement::totals(&ops),
        ops,
        measured: None,
    };
    let (material, minor) = placement::off_ane(&p);
    let named: Vec<(&str, Vec<&str>)> = material
        .iter()
        .map(|o| {
            (
                o.row.name.as_str(),
                o.deciding.iter().map(String::as_str).collect(),
            )
        })
        .collect();
    assert_eq!(
        named,
        [
            ("at_the_line", vec!["fp32_compute"]),
            ("bytes_only", vec!["int32_arithmetic"]),
            ("unknown_shape", vec!["dynamic_shape", "fp32_compute"]),
            ("alone", vec!["state_machinery"]),
        ]
    );
    assert_eq!(minor, 1, "`below` is counted, not named");
    assert_eq!(material[0].flops_share, placement::MATERIAL_SHARE);
    assert_eq!(material[1].bytes_share, 0.002);
    assert_eq!(material[3].flops_share, 1.0);
}
