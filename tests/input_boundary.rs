//! Core ML's conversions at a model's input boundary: float data for an integer input is
//! truncated toward zero; an image input (`ImageFeatureType`) takes pixels `[H, W, 3|4]` or
//! `[H, W]` and hands its program `[1, C, H, W]` floats in the description's channel order
//! (RGB, BGR, grayscale), at a size its flexibility accepts; a package with image inputs
//! round-trips through the package format (fixed-size ones pass coremltools' validator).

mod common;

use milkit::ir::{
    ArrayDType, ColorSpace, DType, Dim, Feature, FeatureKind, Model, Opset, ShapeFlex, TensorType,
    Value, ValueType,
};
use milkit::ops::{Builder, In};
use milkit::runtime::{Session, Tensor};

fn reload(m: &Model) -> (Model, Session) {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("boundary.mlpackage");
    milkit::package::save_package(m, &p, false, &mut |_| {}).unwrap();
    // The validator wants described shapes equal to the program's: fixed ones only.
    if m.description
        .inputs
        .iter()
        .all(|f| f.flex == ShapeFlex::Fixed)
    {
        common::validate(&p);
    }
    (
        milkit::package::load_package(&p).unwrap(),
        Session::load(&p).unwrap(),
    )
}

#[test]
fn float_data_for_an_integer_input_is_truncated_at_the_boundary() {
    let mut b = Builder::new(Opset::Ios17);
    let x = b.input("x", ValueType::tensor(DType::I32, &[4]));
    let y = b
        .op1(
            "add",
            "y",
            vec![("x", In::V(x)), ("y", In::C(Value::i32s(&[10])))],
        )
        .unwrap();
    let m = common::programs::described(
        b,
        &[(y, "y")],
        vec![Feature::new("x", ArrayDType::I32, &[4])],
        vec![Feature::new("y", ArrayDType::I32, &[4])],
    );
    let (_, mut s) = reload(&m);
    for x in [
        Tensor::new(&[1.0f32, 2.0, -3.7, 4.9], &candle_core::Device::Cpu).unwrap(),
        Tensor::new(&[1.0f64, 2.0, -3.7, 4.9], &candle_core::Device::Cpu).unwrap(),
    ] {
        let out = s.predict(&[("x", x)]).unwrap();
        let got: Vec<i32> = out[0].1.to_vec1().unwrap();
        assert_eq!(got, vec![11, 12, 7, 14]);
    }
}

/// y = identity(x) over an image input of `color` and size 2 × 3 (height × width).
fn image_model(color: ColorSpace, flex: ShapeFlex) -> Model {
    let c = color.channels();
    let mut b = Builder::new(Opset::Ios17);
    let hw = |fixed: bool, n| if fixed { Dim::Fixed(n) } else { Dim::Unknown };
    let fixed = flex == ShapeFlex::Fixed;
    let x = b.input(
        "image",
        ValueType::Tensor(TensorType {
            dtype: DType::F32,
            shape: vec![Dim::Fixed(1), Dim::Fixed(c), hw(fixed, 2), hw(fixed, 3)],
        }),
    );
    let y = b.op1("identity", "y", vec![("x", In::V(x))]).unwrap();
    common::programs::described(
        b,
        &[(y, "y")],
        vec![Feature {
            kind: FeatureKind::Image(color),
            flex,
            ..Feature::new("image", ArrayDType::F32, &[2, 3])
        }],
        vec![Feature::new("y", ArrayDType::F32, &[1, c, 2, 3])],
    )
}

/// Pixel (row, col, channel) of a 2 × 3 test image: 100·channel + 10·row + col.
fn pixels(h: usize, w: usize, channels: usize) -> Tensor {
    let mut v = vec![];
    for r in 0..h {
        for col in 0..w {
            for ch in 0..channels {
                v.push((100 * ch + 10 * r + col) as u8);
            }
        }
    }
    Tensor::from_vec(v, (h, w, channels), &candle_core::Device::Cpu).unwrap()
}

fn planes(s: &mut Session, x: Tensor) -> anyhow::Result<Vec<f32>> {
    let out = s.predict(&[("image", x)])?;
    Ok(common::programs::f32s(&out[0].1))
}

/// The planes `[C, H, W]` a (row, col, channel) image gives, channels in `order`.
fn want(order: &[usize], h: usize, w: usize) -> Vec<f32> {
    let mut v = vec![];
    for &ch in order {
        for r in 0..h {
            for col in 0..w {
                v.push((100 * ch + 10 * r + col) as f32);
            }
        }
    }
    v
}

#[test]
fn rgb_and_bgr_images_become_planes_in_their_channel_order() {
    for (color, order) in [(ColorSpace::Rgb, [0, 1, 2]), (ColorSpace::Bgr, [2, 1, 0])] {
        let (back, mut s) = reload(&image_model(color, ShapeFlex::Fixed));
        assert_eq!(back.description.inputs[0].kind, FeatureKind::Image(color));
        assert_eq!(planes(&mut s, pixels(2, 3, 3)).unwrap(), want(&order, 2, 3));
        // RGBA: the alpha channel is dropped.
        assert_eq!(planes(&mut s, pixels(2, 3, 4)).unwrap(), want(&order, 2, 3));
        let e = format!("{:#}", planes(&mut s, pixels(3, 3, 3)).unwrap_err());
        assert!(e.contains("input `image`") && e.contains("[3, 3]"), "{e}");
        let e = format!("{:#}", planes(&mut s, pixels(2, 3, 2)).unwrap_err());
        assert!(e.contains("image") && e.contains("[2, 3, 2]"), "{e}");
    }
}

#[test]
fn a_grayscale_image_is_one_plane() {
    let (_, mut s) = reload(&image_model(ColorSpace::Grayscale, ShapeFlex::Fixed));
    let gray = pixels(2, 3, 1).reshape((2, 3)).unwrap();
    assert_eq!(planes(&mut s, gray).unwrap(), want(&[0], 2, 3));
    assert!(planes(&mut s, pixels(2, 3, 3)).is_err());
}

#[test]
fn a_flexible_image_size_runs_inside_its_range() {
    let flex = ShapeFlex::Ranges(vec![(1, Some(4)), (1, None)]);
    let (back, mut s) = reload(&image_model(ColorSpace::Rgb, flex.clone()));
    assert_eq!(back.description.inputs[0].flex, flex);
    assert_eq!(
        planes(&mut s, pixels(4, 7, 3)).unwrap(),
        want(&[0, 1, 2], 4, 7)
    );
    assert!(planes(&mut s, pixels(5, 7, 3)).is_err());
}
