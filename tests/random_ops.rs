//! The random ops' distributions, checked statistically on packages built with the
//! Builder, saved, loaded and run (not their values): sample means, variances and
//! frequencies within 6 standard errors of the distribution's (a false failure about once
//! in 10^9 per check), with a fixed session seed so a failure reproduces. Plus seeding:
//! the same `--seed` gives the same draws, another seed other draws, an op's own `seed`
//! input the same draws on every run, and two runs of one session different draws.

use milkit::ir::{
    ArrayDType, DType, Description, Feature, Function, Model, Opset, Program, TensorType, Value,
};
use milkit::ops::{Builder, In, V};
use milkit::runtime::{Options, Session, Tensor};

fn f64s(t: &Tensor) -> Vec<f64> {
    t.to_dtype(candle_core::DType::F64)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1::<f64>()
        .unwrap()
}

/// A main function without inputs whose outputs are built by `f`; saved and loaded as a
/// package with session seed `seed`.
fn session(seed: u64, f: impl Fn(&mut Builder) -> Vec<V>) -> Session {
    let mut b = Builder::new(Opset::Ios15);
    let vs = f(&mut b);
    let names: Vec<String> = (0..vs.len()).map(|i| format!("y{i}")).collect();
    let mut outs = vec![];
    let mut desc = Description::default();
    for (v, n) in vs.iter().zip(&names) {
        let o = b
            .op1("identity", "out", vec![("x", In::V(v.clone()))])
            .unwrap();
        let t: TensorType = b.ty(&o).unwrap().as_tensor().unwrap().clone();
        let a = if t.dtype == DType::F16 {
            ArrayDType::F16
        } else {
            ArrayDType::F32
        };
        desc.outputs
            .push(Feature::new(n, a, &t.fixed_shape().unwrap()));
        outs.push(o);
    }
    let pairs: Vec<(V, &str)> = outs
        .iter()
        .cloned()
        .zip(names.iter().map(|s| s.as_str()))
        .collect();
    let (inputs, block) = b.finish(&pairs).unwrap();
    let m = Model::single(Opset::Ios15, inputs, block, desc);
    let dir = tempfile::tempdir().unwrap();
    let pkg = dir.path().join("r.mlpackage");
    milkit::package::save_package(&m, &pkg, false, &mut |_| {}).unwrap();
    let opts = Options {
        seed,
        ..Options::default()
    };
    Session::load_with(&pkg, &opts).unwrap()
}

fn scalar(dt: DType, v: f64) -> In {
    In::C(match dt {
        DType::F16 => Value::f16_scalar(v as f32),
        _ => Value::f32_scalar(v as f32),
    })
}

fn mean_var(x: &[f64]) -> (f64, f64) {
    let n = x.len() as f64;
    let m = x.iter().sum::<f64>() / n;
    (
        m,
        x.iter().map(|v| (v - m) * (v - m)).sum::<f64>() / (n - 1.0),
    )
}

/// |got − want| within 6 standard errors `se`, plus the dtype's rounding `slack`.
fn within(what: &str, got: f64, want: f64, se: f64, slack: f64) {
    assert!(
        (got - want).abs() <= 6.0 * se + slack,
        "{what}: {got} vs {want} (6 standard errors: {})",
        6.0 * se
    );
}

const N: usize = 200_000;

#[test]
fn random_normal_and_uniform_have_their_mean_and_variance() {
    for dt in [DType::F32, DType::F16] {
        let slack = if dt == DType::F16 { 2e-3 } else { 0.0 };
        let mut s = session(11, |b| {
            let n = b
                .op1(
                    "random_normal",
                    "n",
                    vec![
                        ("shape", In::C(Value::i32s(&[N as i32]))),
                        ("mean", scalar(dt, 1.5)),
                        ("stddev", scalar(dt, 2.0)),
                    ],
                )
                .unwrap();
            let u = b
                .op1(
                    "random_uniform",
                    "u",
                    vec![
                        ("shape", In::C(Value::i32s(&[N as i32 / 100, 100]))),
                        ("low", scalar(dt, -1.0)),
                        ("high", scalar(dt, 3.0)),
                    ],
                )
                .unwrap();
            vec![n, u]
        });
        let out = s.predict(&[]).unwrap();
        let (n, u) = (f64s(&out[0].1), f64s(&out[1].1));
        assert_eq!(out[1].1.dims(), &[N / 100, 100]);
        let nf = N as f64;
        // Normal(1.5, 2): the mean's standard error σ/√n, the variance's σ²·√(2/(n−1)).
        let (m, v) = mean_var(&n);
        within(&format!("{dt} normal mean"), m, 1.5, 2.0 / nf.sqrt(), slack);
        within(
            &format!("{dt} normal variance"),
            v,
            4.0,
            4.0 * (2.0 / nf).sqrt(),
            slack,
        );
        // Uniform[-1, 3): mean 1, variance 16/12; the variance's standard error from the
        // fourth central moment 16²/80.
        assert!(
            u.iter().all(|&x| (-1.0..=3.0).contains(&x)),
            "uniform out of range"
        );
        let (m, v) = mean_var(&u);
        within(
            &format!("{dt} uniform mean"),
            m,
            1.0,
            (16.0f64 / 12.0 / nf).sqrt(),
            slack,
        );
        let mu4 = 256.0 / 80.0;
        let var = 16.0 / 12.0;
        within(
            &format!("{dt} uniform variance"),
            v,
            var,
            ((mu4 - var * var) / nf).sqrt(),
            slack,
        );
    }
}

#[test]
fn random_bernoulli_and_categorical_draw_with_their_frequencies() {
    let probs = [0.1, 0.2, 0.7];
    for dt in [DType::F32, DType::F16] {
        let mut s = session(5, |b| {
            let ber = b
                .op1(
                    "random_bernoulli",
                    "b",
                    vec![
                        ("shape", In::C(Value::i32s(&[N as i32]))),
                        ("prob", scalar(dt, 0.25)),
                    ],
                )
                .unwrap();
            // Three distributions of logits ln p, and the same as probabilities.
            let lg: Vec<f64> = probs.iter().map(|p: &f64| p.ln()).collect();
            let konst = |b: &mut Builder, name: &str, row: &[f64]| {
                let vals: Vec<f64> = [row, row, row].concat();
                let t = match dt {
                    DType::F16 => milkit::ir::Tensor::f16(
                        &[3, 3],
                        &vals
                            .iter()
                            .map(|&v| half::f16::from_f64(v))
                            .collect::<Vec<_>>(),
                    ),
                    _ => milkit::ir::Tensor::f32(
                        &[3, 3],
                        &vals.iter().map(|&v| v as f32).collect::<Vec<_>>(),
                    ),
                };
                b.konst(name, Value::Tensor(t))
            };
            let xl = konst(b, "logits", &lg);
            let xp = konst(b, "probs", &probs);
            let lc = b
                .op1(
                    "random_categorical",
                    "c",
                    vec![
                        ("x", In::V(xl)),
                        ("size", In::C(Value::i32_scalar(N as i32 / 10))),
                    ],
                )
                .unwrap();
            let pc = b
                .op1(
                    "random_categorical",
                    "c",
                    vec![
                        ("x", In::V(xp)),
                        ("mode", In::C(Value::str("probs"))),
                        ("size", In::C(Value::i32_scalar(N as i32 / 10))),
                    ],
                )
                .unwrap();
            vec![ber, lc, pc]
        });
        let out = s.predict(&[]).unwrap();
        let ber = f64s(&out[0].1);
        assert!(
            ber.iter().all(|&v| v == 0.0 || v == 1.0),
            "bernoulli not 0/1"
        );
        let nf = N as f64;
        let f = ber.iter().sum::<f64>() / nf;
        within(
            &format!("{dt} bernoulli"),
            f,
            0.25,
            (0.25f64 * 0.75 / nf).sqrt(),
            0.0,
        );
        let k = N / 10;
        for (what, t) in [("logits", &out[1].1), ("probs", &out[2].1)] {
            assert_eq!(t.dims(), &[3, k]);
            let v = f64s(t);
            for r in 0..3 {
                let row = &v[r * k..(r + 1) * k];
                // fp16 rounds the logits / probabilities: up to 1e-3 relative.
                let slack = if dt == DType::F16 { 2e-3 } else { 0.0 };
                for (c, &p) in probs.iter().enumerate() {
                    let freq = row.iter().filter(|&&x| x == c as f64).count() as f64 / k as f64;
                    let se = (p * (1.0 - p) / k as f64).sqrt();
                    within(
                        &format!("{dt} categorical {what} row {r} class {c}"),
                        freq,
                        p,
                        se,
                        slack,
                    );
                }
                assert!(row.iter().all(|&x| x == 0.0 || x == 1.0 || x == 2.0));
            }
        }
    }
}

fn draws(seed: u64, op_seed: Option<i32>) -> (Vec<f64>, Vec<f64>) {
    let mut s = session(seed, |b| {
        let mut ins = vec![("shape", In::C(Value::i32s(&[64])))];
        if let Some(k) = op_seed {
            ins.push(("seed", In::C(Value::i32_scalar(k))));
        }
        vec![b.op1("random_uniform", "u", ins).unwrap()]
    });
    let a = f64s(&s.predict(&[]).unwrap()[0].1);
    let b = f64s(&s.predict(&[]).unwrap()[0].1);
    (a, b)
}

#[test]
fn the_session_seed_and_the_op_seed_make_draws_reproducible() {
    let (a1, a2) = draws(3, None);
    let (b1, b2) = draws(3, None);
    assert_eq!(
        (&a1, &a2),
        (&b1, &b2),
        "the same seed must give the same draws"
    );
    assert_ne!(a1, a2, "two runs of one session drew the same values");
    let (c1, _) = draws(4, None);
    assert_ne!(a1, c1, "another seed drew the same values");
    let (d1, d2) = draws(3, Some(42));
    let (e1, _) = draws(9, Some(42));
    assert_eq!(d1, d2, "an op seed must give the same draws on every run");
    assert_eq!(d1, e1, "an op seed must not depend on the session seed");
    assert_ne!(d1, a1);
}

#[test]
fn milkit_run_seed_reproduces_and_changes_the_draws() {
    let mut b = Builder::new(Opset::Ios15);
    let u = b
        .op1(
            "random_normal",
            "u",
            vec![("shape", In::C(Value::i32s(&[16])))],
        )
        .unwrap();
    let o = b.op1("identity", "out", vec![("x", In::V(u))]).unwrap();
    let (inputs, block) = b.finish(&[(o, "y")]).unwrap();
    let mut program = Program::default();
    program.functions.insert(
        "main".into(),
        Function {
            inputs,
            opset: Opset::Ios15,
            block,
        },
    );
    let mut description = Description::default();
    description
        .outputs
        .push(Feature::new("y", ArrayDType::F32, &[16]));
    let m = Model {
        spec_version: Opset::Ios15.spec_version(),
        description,
        program,
    };
    let dir = tempfile::tempdir().unwrap();
    let pkg = dir.path().join("n.mlpackage");
    milkit::package::save_package(&m, &pkg, false, &mut |_| {}).unwrap();
    let run = |seed: &str, out: &str| -> Vec<f64> {
        let o = std::process::Command::new(env!("CARGO_BIN_EXE_milkit"))
            .arg("run")
            .arg(&pkg)
            .args(["--quiet", "--seed", seed, "--out"])
            .arg(dir.path().join(out))
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "milkit run: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        f64s(&milkit::runtime::io::read_npy(&dir.path().join(out).join("y.npy")).unwrap())
    };
    let (a, b, c) = (run("7", "a"), run("7", "b"), run("8", "c"));
    assert_eq!(a, b, "--seed 7 twice drew different values");
    assert_ne!(a, c, "--seed 7 and --seed 8 drew the same values");
}
