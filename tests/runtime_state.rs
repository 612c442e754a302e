//! In-place state updates (`runtime::state_fusion`): a stateful cache written per layer by
//! `read_state → slice_update → write_state` and read back by `slice_by_index`, as the
//! stateful decoder does, run fused and op by op over several steps — outputs and states
//! must be bit-identical — and tensors handed out by or into the session never change
//! behind the caller's back. The slice goes out as a view of the state only where no later
//! in-place write can reach it before its last reader (`state_fusion::allow_views`).

mod common;

use candle_core::DType as CDType;
use common::programs::*;
use common::rng::Rng;
use milkit::ir::{DType, Value, ValueType};
use milkit::ops::{Builder, In};
use milkit::runtime::{state_fusion, Options, Session, Tensor};

const D: usize = 8;
const LAYERS: usize = 2;
const S: usize = 6;

/// How the slices are read in [`build_with`].
#[derive(Clone, Copy)]
enum Readers {
    /// Each slice is a block output.
    Outputs,
    /// Each slice is reshaped and concatenated with itself, right after its update.
    Concat,
    /// As `Concat`, but layer 0's concat runs after layer 1's update, which writes the same
    /// rows of the cache (both "layers" use channels 0..D).
    ConcatAfterOverwrite,
}

/// Two layers of `d` channels in one `[1, d·layers, 1, S]` fp16 cache; layer `l` writes
/// `(l + 1)·x` at column `pos` and reads its `[1, d, 1, S]` slice (see [`Readers`]).
fn build_with(readers: Readers) -> milkit::ir::Model {
    let overwrite = matches!(readers, Readers::ConcatAfterOverwrite);
    let row = |l: usize| if overwrite { 0 } else { l * D };
    let mut b = Builder::new(milkit::ir::Opset::Ios18);
    let x = b.input("x", tin(DType::F16, &[1, D, 1, 1]));
    let pos = b.input("pos", tin(DType::I32, &[1]));
    let cache = b.input(
        "cache",
        ValueType::State(
            tin(DType::F16, &[1, D * LAYERS, 1, S])
                .as_tensor()
                .unwrap()
                .clone(),
        ),
    );
    let (mut outs, mut pending) = (vec![], vec![]);
    for l in 0..LAYERS {
        let new = b
            .op1(
                "mul",
                &format!("new_{l}"),
                vec![
                    ("x", In::from(&x)),
                    ("y", c(Value::f16_scalar((l + 1) as f32))),
                ],
            )
            .unwrap();
        let cur = b
            .op1(
                "read_state",
                &format!("read_{l}"),
                vec![("input", In::from(&cache))],
            )
            .unwrap();
        let lo = b.konst(&format!("lo_{l}"), Value::i32s(&[0, row(l) as i32, 0]));
        let begin = b
            .op1(
                "concat",
                &format!("begin_{l}"),
                vec![
                    ("values", In::Vs(vec![lo, pos.clone()])),
                    ("axis", c(Value::i32_scalar(0))),
                ],
            )
            .unwrap();
        let end = b
            .op1(
                "add",
                &format!("end_{l}"),
                vec![("x", In::from(&begin)), ("y", ints(&[1, D as i32, 1, 1]))],
            )
            .unwrap();
        let upd = b
            .op1(
                "slice_update",
                &format!("update_{l}"),
                vec![
                    ("x", In::V(cur)),
                    ("update", In::V(new)),
                    ("begin", In::V(begin)),
                    ("end", In::V(end)),
                ],
            )
            .unwrap();
        b.op(
            "write_state",
            &format!("write_{l}"),
            vec![("input", In::from(&cache)), ("data", In::from(&upd))],
        )
        .unwrap();
        let layer = b
            .op1(
                "slice_by_index",
                &format!("layer_{l}"),
                vec![
                    ("x", In::V(upd)),
                    ("begin", ints(&[0, row(l) as i32, 0, 0])),
                    ("end", ints(&[1, (row(l) + D) as i32, 1, S as i32])),
                ],
            )
            .unwrap();
        match readers {
            Readers::Outputs => outs.push(layer),
            Readers::Concat => outs.push(join(&mut b, layer, l)),
            Readers::ConcatAfterOverwrite => {
                // Every slice is joined after the last update.
                pending.push(layer);
                if l + 1 == LAYERS {
                    for (i, v) in std::mem::take(&mut pending).into_iter().enumerate() {
                        outs.push(join(&mut b, v, i));
                    }
                }
            }
        }
    }
    let names = ["layer0", "layer1"];
    let named: Vec<_> = outs.into_iter().zip(names).collect();
    model(b, &named)
}

/// `concat([reshape(v, [D, S])] × 2)`: a reader that returns new storage.
fn join(b: &mut Builder, v: milkit::ops::V, i: usize) -> milkit::ops::V {
    let flat = b
        .op1(
            "reshape",
            &format!("flat_{i}"),
            vec![("x", In::V(v)), ("shape", ints(&[D as i32, S as i32]))],
        )
        .unwrap();
    b.op1(
        "concat",
        &format!("joined_{i}"),
        vec![
            ("values", In::Vs(vec![flat.clone(), flat])),
            ("axis", c(Value::i32_scalar(0))),
        ],
    )
    .unwrap()
}

/// Whether compiling `m` lets each fused update hand out a view (in layer order).
fn views(m: &milkit::ir::Model) -> Vec<bool> {
    let plan =
        milkit::runtime::plan::compile(&m.program.functions["main"], &Options::default()).unwrap();
    plan.steps
        .iter()
        .filter(|st| st.op_type == state_fusion::FUSED)
        .map(state_fusion::hands_out_view)
        .collect()
}

fn session(fuse: bool) -> Session {
    session_with(Readers::Outputs, fuse)
}

fn session_with(readers: Readers, fuse: bool) -> Session {
    let opts = Options {
        fuse_state_updates: fuse,
        ..Options::default()
    };
    Session::from_model_with(build_with(readers), &opts).unwrap()
}

fn bits(t: &Tensor) -> Vec<u16> {
    t.flatten_all()
        .unwrap()
        .to_vec1::<half::f16>()
        .unwrap()
        .iter()
        .map(|v| v.to_bits())
        .collect()
}

fn step(s: &mut Session, x: &[f32], pos: i32) -> Vec<Vec<u16>> {
    let ins = [
        ("x", host(x, &[1, D, 1, 1])),
        (
            "pos",
            Tensor::new(&[pos], &candle_core::Device::Cpu).unwrap(),
        ),
    ];
    s.predict(&ins)
        .unwrap()
        .iter()
        .map(|(_, t)| bits(t))
        .collect()
}

#[test]
fn fused_state_updates_match_op_by_op() {
    for readers in [
        Readers::Outputs,
        Readers::Concat,
        Readers::ConcatAfterOverwrite,
    ] {
        fused_matches_plain(readers);
    }
}

fn fused_matches_plain(readers: Readers) {
    let (mut fused, mut plain) = (session_with(readers, true), session_with(readers, false));
    fused.enable_profiling(true);
    let mut r = Rng(9);
    for pos in [0, 1, 2, 5, 3, 1] {
        let x = r.vec(D);
        assert_eq!(
            step(&mut fused, &x, pos),
            step(&mut plain, &x, pos),
            "pos {pos}"
        );
        let (a, b) = (fused.state("cache").unwrap(), plain.state("cache").unwrap());
        assert_eq!(bits(&a), bits(&b), "state after pos {pos}");
    }
    // The chains were fused: no slice_update ran, the fused step ran per layer and step.
    let prof = fused.profile();
    assert!(prof
        .iter()
        .all(|p| p.0 != "slice_update" && p.0 != "write_state"));
    let calls = prof
        .iter()
        .find(|p| p.0 == state_fusion::FUSED)
        .map(|p| p.1);
    assert_eq!(calls, Some(6 * LAYERS));
}

/// Views only where nothing can observe them: not for block outputs, not for a slice read
/// after the next in-place update of its state; yes where every reader runs before it.
#[test]
fn slices_are_views_only_where_no_later_write_reaches_them() {
    assert_eq!(views(&build_with(Readers::Outputs)), [false, false]);
    assert_eq!(views(&build_with(Readers::Concat)), [true, true]);
    assert_eq!(
        views(&build_with(Readers::ConcatAfterOverwrite)),
        [false, true]
    );
}

/// Outputs handed out by one call keep their values while later calls update the state.
#[test]
fn outputs_survive_later_calls() {
    let mut s = session(true);
    let mut r = Rng(6);
    let first = s
        .predict(&[
            ("x", host(&r.vec(D), &[1, D, 1, 1])),
            (
                "pos",
                Tensor::new(&[2i32], &candle_core::Device::Cpu).unwrap(),
            ),
        ])
        .unwrap();
    let before: Vec<Vec<u16>> = first.iter().map(|(_, t)| bits(t)).collect();
    for pos in 0..S as i32 {
        step(&mut s, &r.vec(D), pos);
    }
    let after: Vec<Vec<u16>> = first.iter().map(|(_, t)| bits(t)).collect();
    assert_eq!(before, after, "an output changed after later calls");
}

/// A state read out with `Session::state`, and a tensor the caller set, keep their values
/// while later steps update the state in place.
#[test]
fn in_place_updates_leave_handed_out_tensors_alone() {
    let mut s = session(true);
    let mut r = Rng(4);
    step(&mut s, &r.vec(D), 0);
    let held = s.state("cache").unwrap();
    let before = bits(&held);
    step(&mut s, &r.vec(D), 1);
    step(&mut s, &r.vec(D), 2);
    assert_eq!(bits(&held), before, "a tensor from Session::state changed");
    assert_ne!(
        bits(&s.state("cache").unwrap()),
        before,
        "the steps wrote the state"
    );

    let mine = host(&r.vec(D * LAYERS * S), &[1, D * LAYERS, 1, S])
        .to_dtype(CDType::F16)
        .unwrap();
    let mine_bits = bits(&mine);
    s.set_state("cache", mine.clone()).unwrap();
    let out = step(&mut s, &r.vec(D), 4);
    assert_eq!(bits(&mine), mine_bits, "the caller's tensor changed");
    // Column 4 of layer 0 is the new value, the rest of the layer is the caller's.
    let layer0: Vec<u16> = mine_bits[..D * S].to_vec();
    for (i, (a, b)) in out[0].iter().zip(&layer0).enumerate() {
        if i % S != 4 {
            assert_eq!(a, b, "element {i} of layer 0");
        }
    }
}

/// Sessions predicting from parallel tasks of one pool (each call keeps a helper job
/// spinning for pool work) all finish, with the same results as run one at a time.
#[test]
fn concurrent_calls_from_pool_tasks_finish() {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .unwrap();
    let xs: Vec<Vec<f32>> = (0..40).map(|i| Rng(100 + i).vec(D)).collect();
    let alone: Vec<Vec<Vec<u16>>> = {
        let mut s = session(true);
        xs.iter()
            .enumerate()
            .map(|(i, x)| step(&mut s, x, (i % S) as i32))
            .collect()
    };
    let run = || {
        let mut s = session(true);
        xs.iter()
            .enumerate()
            .map(|(i, x)| step(&mut s, x, (i % S) as i32))
            .collect::<Vec<_>>()
    };
    let (a, b) = pool.install(|| rayon::join(run, run));
    assert_eq!(a, alone);
    assert_eq!(b, alone);
}
