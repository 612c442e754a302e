//! NeuralNetwork models, built here as protobuf messages, run through their translation into
//! ML Programs and compare with float64 maths written out in the test; other model types
//! and untranslated layers are refused by name. coremltools' own NeuralNetwork tests
//! (docs/conformance.md) check the layers against numpy more widely.

mod common;

use milkit::proto::specification as spec;
use milkit::runtime::{Session, Tensor};
use prost::Message;
use spec::neural_network_layer::Layer as L;
use std::path::{Path, PathBuf};

fn array(name: &str, shape: &[i64]) -> spec::FeatureDescription {
    use spec::array_feature_type::ArrayDataType;
    spec::FeatureDescription {
        name: name.into(),
        r#type: Some(spec::FeatureType {
            r#type: Some(spec::feature_type::Type::MultiArrayType(
                spec::ArrayFeatureType {
                    shape: shape.to_vec(),
                    data_type: ArrayDataType::Double as i32,
                    ..Default::default()
                },
            )),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn layer(name: &str, inputs: &[&str], outputs: &[&str], l: L) -> spec::NeuralNetworkLayer {
    spec::NeuralNetworkLayer {
        name: name.into(),
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: outputs.iter().map(|s| s.to_string()).collect(),
        layer: Some(l),
        ..Default::default()
    }
}

fn fp32(v: &[f32]) -> Option<spec::WeightParams> {
    Some(spec::WeightParams {
        float_value: v.to_vec(),
        ..Default::default()
    })
}

fn model(
    inputs: Vec<spec::FeatureDescription>,
    outputs: Vec<spec::FeatureDescription>,
    kind: spec::model::Type,
) -> spec::Model {
    spec::Model {
        specification_version: 1,
        description: Some(spec::ModelDescription {
            input: inputs,
            output: outputs,
            ..Default::default()
        }),
        r#type: Some(kind),
        ..Default::default()
    }
}

fn network(layers: Vec<spec::NeuralNetworkLayer>) -> spec::model::Type {
    spec::model::Type::NeuralNetwork(spec::NeuralNetwork {
        layers,
        ..Default::default()
    })
}

fn write(dir: &Path, name: &str, m: &spec::Model) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, m.encode_to_vec()).unwrap();
    p
}

fn err_of(path: &Path) -> String {
    match Session::load(path) {
        Ok(_) => panic!("{} loaded", path.display()),
        Err(e) => format!("{e:#}"),
    }
}

/// Deterministic values in [-1, 1).
fn values(n: usize, seed: u32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(2654435761).wrapping_add(12345);
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s % 2000) as f32 / 1000.0 - 1.0
        })
        .collect()
}

fn input(shape: &[usize], v: &[f32]) -> Tensor {
    Tensor::from_vec(v.to_vec(), shape, &candle_core::Device::Cpu).unwrap()
}

fn output(outs: &[(String, Tensor)], name: &str) -> (Vec<usize>, Vec<f64>) {
    let t = &outs.iter().find(|(n, _)| n == name).unwrap().1;
    let v = t.to_dtype(candle_core::DType::F64).unwrap();
    (
        t.dims().to_vec(),
        v.flatten_all().unwrap().to_vec1().unwrap(),
    )
}

#[test]
fn a_rank5_network_of_convolution_pooling_and_inner_product_matches_float64_maths() {
    use spec::activation_params::NonlinearityType as N;
    use spec::convolution_layer_params::ConvolutionPaddingType as CP;
    use spec::pooling_layer_params::PoolingPaddingType as PP;
    let (ci, co, h, w, k, classes) = (2usize, 3usize, 5usize, 5usize, 3usize, 4usize);
    let cw = values(co * ci * k * k, 1);
    let cb = values(co, 2);
    let alpha = [0.1f32, 0.2, 0.3];
    let (gamma, beta, mean, var) = (
        values(co, 3),
        values(co, 4),
        values(co, 5),
        [0.5f32, 1.0, 2.0],
    );
    let flat = co * 4 * 4;
    let fw = values(classes * flat, 6);
    let fb = values(classes, 7);
    let layers = vec![
        layer(
            "conv 1",
            &["x"],
            &["c"],
            L::Convolution(spec::ConvolutionLayerParams {
                output_channels: co as u64,
                kernel_channels: ci as u64,
                n_groups: 1,
                kernel_size: vec![3, 3],
                stride: vec![1, 1],
                dilation_factor: vec![1, 1],
                has_bias: true,
                weights: fp32(&cw),
                bias: fp32(&cb),
                convolution_padding_type: Some(CP::Same(spec::SamePadding::default())),
                ..Default::default()
            }),
        ),
        layer(
            "prelu",
            &["c"],
            &["a"],
            L::Activation(spec::ActivationParams {
                nonlinearity_type: Some(N::PReLu(spec::ActivationPReLu {
                    alpha: fp32(&alpha),
                })),
            }),
        ),
        layer(
            "bn",
            &["a"],
            &["b"],
            L::Batchnorm(spec::BatchnormLayerParams {
                channels: co as u64,
                epsilon: 1e-3,
                gamma: fp32(&gamma),
                beta: fp32(&beta),
                mean: fp32(&mean),
                variance: fp32(&var),
                ..Default::default()
            }),
        ),
        layer(
            "pool",
            &["b"],
            &["p"],
            L::Pooling(spec::PoolingLayerParams {
                r#type: 0,
                kernel_size: vec![2, 2],
                stride: vec![1, 1],
                pooling_padding_type: Some(PP::Valid(spec::ValidPadding::default())),
                ..Default::default()
            }),
        ),
        layer(
            "flatten",
            &["p"],
            &["f"],
            L::Flatten(spec::FlattenLayerParams { mode: 0 }),
        ),
        layer(
            "fc",
            &["f"],
            &["logits"],
            L::InnerProduct(spec::InnerProductLayerParams {
                input_channels: flat as u64,
                output_channels: classes as u64,
                has_bias: true,
                weights: fp32(&fw),
                bias: fp32(&fb),
                ..Default::default()
            }),
        ),
        layer(
            "softmax",
            &["logits"],
            &["y"],
            L::Softmax(Default::default()),
        ),
    ];
    let m = model(
        vec![array("x", &[ci as i64, h as i64, w as i64])],
        vec![array("y", &[classes as i64])],
        network(layers),
    );
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "cnn.mlmodel", &m);
    let mut s = Session::load(&path).unwrap_or_else(|e| panic!("{e:#}"));
    let x = values(ci * h * w, 8);
    let outs = s
        .predict(&[("x", input(&[ci, h, w], &x))])
        .unwrap_or_else(|e| panic!("{e:#}"));
    let (shape, got) = output(&outs, "y");
    assert_eq!(shape, vec![classes]);

    // The same network in float64.
    let at = |c: usize, i: isize, j: isize| -> f64 {
        if i < 0 || j < 0 || i >= h as isize || j >= w as isize {
            0.0
        } else {
            x[(c * h + i as usize) * w + j as usize] as f64
        }
    };
    let mut b = vec![0f64; co * h * w];
    for o in 0..co {
        for i in 0..h {
            for j in 0..w {
                let mut acc = cb[o] as f64;
                for c in 0..ci {
                    for di in 0..k {
                        for dj in 0..k {
                            acc += cw[((o * ci + c) * k + di) * k + dj] as f64
                                * at(
                                    c,
                                    i as isize + di as isize - 1,
                                    j as isize + dj as isize - 1,
                                );
                        }
                    }
                }
                let a = if acc >= 0.0 {
                    acc
                } else {
                    alpha[o] as f64 * acc
                };
                b[(o * h + i) * w + j] = gamma[o] as f64 * (a - mean[o] as f64)
                    / (var[o] as f64 + 1e-3f32 as f64).sqrt()
                    + beta[o] as f64;
            }
        }
    }
    let mut f = vec![0f64; flat];
    for o in 0..co {
        for i in 0..4 {
            for j in 0..4 {
                let v = |di: usize, dj: usize| b[(o * h + i + di) * w + j + dj];
                f[(o * 4 + i) * 4 + j] = v(0, 0).max(v(0, 1)).max(v(1, 0)).max(v(1, 1));
            }
        }
    }
    let logits: Vec<f64> = (0..classes)
        .map(|c| {
            fb[c] as f64
                + (0..flat)
                    .map(|i| fw[c * flat + i] as f64 * f[i])
                    .sum::<f64>()
        })
        .collect();
    let mx = logits.iter().cloned().fold(f64::MIN, f64::max);
    let e: Vec<f64> = logits.iter().map(|l| (l - mx).exp()).collect();
    let sum: f64 = e.iter().sum();
    let want: Vec<f64> = e.iter().map(|v| v / sum).collect();
    for (g, w) in got.iter().zip(&want) {
        assert!((g - w).abs() < 1e-5, "{got:?} against {want:?}");
    }
}

#[test]
fn a_classifier_returns_the_label_of_the_largest_probability() {
    let (cin, classes) = (3usize, 3usize);
    let fw = values(cin * classes, 11);
    let layers = vec![
        layer(
            "fc",
            &["x"],
            &["logits"],
            L::InnerProduct(spec::InnerProductLayerParams {
                input_channels: cin as u64,
                output_channels: classes as u64,
                weights: fp32(&fw),
                ..Default::default()
            }),
        ),
        layer(
            "softmax",
            &["logits"],
            &["probs"],
            L::Softmax(Default::default()),
        ),
    ];
    let labels = ["cat", "dog", "fox"];
    let dict = spec::FeatureDescription {
        name: "probs".into(),
        r#type: Some(spec::FeatureType {
            r#type: Some(spec::feature_type::Type::DictionaryType(
                spec::DictionaryFeatureType {
                    key_type: Some(spec::dictionary_feature_type::KeyType::StringKeyType(
                        Default::default(),
                    )),
                },
            )),
            ..Default::default()
        }),
        ..Default::default()
    };
    let label = spec::FeatureDescription {
        name: "label".into(),
        r#type: Some(spec::FeatureType {
            r#type: Some(spec::feature_type::Type::StringType(Default::default())),
            ..Default::default()
        }),
        ..Default::default()
    };
    let mut m = model(
        vec![array("x", &[cin as i64])],
        vec![label, dict],
        spec::model::Type::NeuralNetworkClassifier(spec::NeuralNetworkClassifier {
            layers,
            class_labels: Some(
                spec::neural_network_classifier::ClassLabels::StringClassLabels(
                    spec::StringVector {
                        vector: labels.iter().map(|s| s.to_string()).collect(),
                    },
                ),
            ),
            ..Default::default()
        }),
    );
    let d = m.description.as_mut().unwrap();
    d.predicted_feature_name = "label".into();
    d.predicted_probabilities_name = "probs".into();
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "classifier.mlmodel", &m);
    let model = milkit::package::load_package(&path).unwrap_or_else(|e| panic!("{e:#}"));
    let ops: Vec<&str> = model
        .program
        .main()
        .unwrap()
        .block
        .operations
        .iter()
        .map(|o| o.op_type.as_str())
        .collect();
    assert!(ops.contains(&"classify"), "{ops:?}");
    let mut s = Session::from_model(model).unwrap();
    for (seed, x) in [
        (21, values(cin, 21)),
        (22, values(cin, 22)),
        (23, vec![0.0; cin]),
    ] {
        let outs = s
            .predict_values(None, &[("x", input(&[cin], &x))])
            .unwrap_or_else(|e| panic!("{e:#}"));
        let logits: Vec<f64> = (0..classes)
            .map(|c| (0..cin).map(|i| fw[c * cin + i] as f64 * x[i] as f64).sum())
            .collect();
        let best = (0..classes).fold(0, |b, c| if logits[c] > logits[b] { c } else { b });
        let text = format!("{outs:?}");
        assert!(text.contains(labels[best]), "seed {seed}: {text}");
    }
}

#[test]
fn quantized_and_fp16_weights_decode_as_core_ml_packs_them() {
    use spec::quantization_params::QuantizationType as Q;
    // Four 2-bit codes 3, 0, 1, 2 packed most significant bit first: 0b11_00_01_10.
    let lut = spec::WeightParams {
        raw_value: vec![0b1100_0110],
        quantization: Some(spec::QuantizationParams {
            number_of_bits: 2,
            quantization_type: Some(Q::LookupTableQuantization(
                spec::LookUpTableQuantizationParams {
                    float_value: vec![-1.0, 0.5, 2.0, 4.0],
                },
            )),
        }),
        ..Default::default()
    };
    // Linear 4-bit, one scale and bias per output row: codes 1, 15 / 2, 0.
    let linear = spec::WeightParams {
        raw_value: vec![0x1f, 0x20],
        quantization: Some(spec::QuantizationParams {
            number_of_bits: 4,
            quantization_type: Some(Q::LinearQuantization(spec::LinearQuantizationParams {
                scale: vec![0.5, 2.0],
                bias: vec![-1.0, 1.0],
            })),
        }),
        ..Default::default()
    };
    let half: Vec<u8> = [1.5f32, -0.25, 3.0, 0.125]
        .iter()
        .flat_map(|v| half::f16::from_f32(*v).to_le_bytes())
        .collect();
    let fp16 = spec::WeightParams {
        float16_value: half,
        ..Default::default()
    };
    let want: [[f64; 4]; 3] = [
        [4.0, -1.0, 0.5, 2.0],
        [-0.5, 6.5, 5.0, 1.0],
        [1.5, -0.25, 3.0, 0.125],
    ];
    let dir = tempfile::tempdir().unwrap();
    for (i, (wp, want)) in [lut, linear, fp16].into_iter().zip(want).enumerate() {
        // A 2×2 inner product of the inputs (1, 0) and (0, 1) reads the weights' columns.
        let m = model(
            vec![array("x", &[2])],
            vec![array("y", &[2])],
            network(vec![layer(
                "fc",
                &["x"],
                &["y"],
                L::InnerProduct(spec::InnerProductLayerParams {
                    input_channels: 2,
                    output_channels: 2,
                    weights: Some(wp),
                    ..Default::default()
                }),
            )]),
        );
        let path = write(dir.path(), &format!("w{i}.mlmodel"), &m);
        let mut s = Session::load(&path).unwrap_or_else(|e| panic!("{i}: {e:#}"));
        let col = |s: &mut Session, x: [f32; 2]| {
            output(&s.predict(&[("x", input(&[2], &x))]).unwrap(), "y").1
        };
        let (c0, c1) = (col(&mut s, [1.0, 0.0]), col(&mut s, [0.0, 1.0]));
        assert_eq!([c0[0], c1[0], c0[1], c1[1]], want, "weights {i}");
    }
}

#[test]
fn other_model_types_and_untranslated_layers_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let io = || (vec![array("x", &[2])], vec![array("y", &[2])]);
    let (i, o) = io();
    let glm = write(
        dir.path(),
        "glm.mlmodel",
        &model(i, o, spec::model::Type::GlmRegressor(Default::default())),
    );
    let e = err_of(&glm);
    assert!(
        e.contains("glm.mlmodel") && e.contains("GLM regressor") && e.contains("not run yet"),
        "{e}"
    );
    let (i, o) = io();
    let vision = write(
        dir.path(),
        "vision.mlmodel",
        &model(
            i,
            o,
            spec::model::Type::VisionFeaturePrint(Default::default()),
        ),
    );
    let e = err_of(&vision);
    assert!(
        e.contains("Vision feature print") && e.contains("private frameworks"),
        "{e}"
    );
    let (i, o) = io();
    let lstm = write(
        dir.path(),
        "lstm.mlmodel",
        &model(
            i,
            o,
            network(vec![layer(
                "my lstm",
                &["x"],
                &["y"],
                L::UniDirectionalLstm(Default::default()),
            )]),
        ),
    );
    let e = err_of(&lstm);
    assert!(
        e.contains("layer 0 `my lstm`") && e.contains("`uniDirectionalLstm` is not translated"),
        "{e}"
    );
    let (i, o) = io();
    let unknown_blob = write(
        dir.path(),
        "blob.mlmodel",
        &model(
            i,
            o,
            network(vec![layer(
                "relu",
                &["nope"],
                &["y"],
                L::Softmax(Default::default()),
            )]),
        ),
    );
    let e = err_of(&unknown_blob);
    assert!(
        e.contains("blob `nope` is read before any layer writes it"),
        "{e}"
    );
}

#[test]
fn builder_models_match_numpy_and_convert_to_ml_programs_coremltools_accepts() {
    let Some(py) = common::python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/neural_network_models.py");
    let out = std::process::Command::new(&py)
        .arg(&script)
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let names: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(String::from)
        .collect();
    assert_eq!(names, ["cnn", "attention", "quantized"]);
    for name in &names {
        let nn = dir.path().join(format!("{name}.mlmodel"));
        let x = milkit::runtime::io::read_npy(&dir.path().join(format!("{name}.in.npy"))).unwrap();
        let want = milkit::runtime::io::read_npy(&dir.path().join(format!("{name}.out.npy")))
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f64>()
            .unwrap();
        let inspect = common::milkit().arg("inspect").arg(&nn).output().unwrap();
        assert!(
            inspect.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&inspect.stderr)
        );
        let mut s = Session::load(&nn).unwrap_or_else(|e| panic!("{name}: {e:#}"));
        let (_, got) = output(&s.predict(&[("x", x.clone())]).unwrap(), "y");
        assert_eq!(got.len(), want.len(), "{name}");
        for (g, w) in got.iter().zip(&want) {
            assert!(
                (g - w).abs() <= 1e-5 + 1e-5 * w.abs(),
                "{name}: {got:?} against {want:?}"
            );
        }
        // The translation written as an ML Program: coremltools re-types every op of it, and
        // it computes what the NeuralNetwork computes.
        let pkg = dir.path().join(format!("{name}.mlpackage"));
        let st = common::milkit()
            .arg("convert")
            .arg(&nn)
            .arg("--out")
            .arg(&pkg)
            .status()
            .unwrap();
        assert!(st.success(), "{name}: convert failed");
        common::validate(&pkg);
        let mut p = Session::load(&pkg).unwrap_or_else(|e| panic!("{name}: {e:#}"));
        let (_, again) = output(&p.predict(&[("x", x)]).unwrap(), "y");
        assert_eq!(again, got, "{name}: the ML Program computes otherwise");
    }
}
