//! Package reading and writing: packages coremltools made load with every op re-inferred;
//! write → read → write is byte-identical.

mod common;
use milkit::package::{load_package, save_package};

#[test]
fn loads_coremltools_packages() {
    let Some(fx) = common::fixtures() else { return };
    for name in [
        "tiny.en-encoder-fp16",
        "tiny.en-encoder-lut4-kmeans",
        "tiny.en-encoder-int4-block32",
    ] {
        let p = fx.join(format!("coremltools/{name}.mlpackage"));
        let m = load_package(&p).unwrap_or_else(|e| panic!("{name}: {e:#}"));
        assert_eq!(m.spec_version, 9);
        let f = m.program.main().unwrap();
        assert_eq!(f.inputs[0].name, "logmel_data");
        let n = f.block.walk().len();
        assert!(n > 200, "{name}: {n} ops");
    }
}

#[test]
fn rewrite_is_byte_identical() {
    let Some(fx) = common::fixtures() else { return };
    let p = fx.join("coremltools/tiny.en-encoder-lut4-kmeans.mlpackage");
    let m = load_package(&p).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a.mlpackage");
    let b = dir.path().join("b.mlpackage");
    save_package(&m, &a, false, &mut |_| {}).unwrap();
    let m2 = load_package(&a).unwrap();
    assert_eq!(m, m2);
    save_package(&m2, &b, false, &mut |_| {}).unwrap();
    for f in [
        "Manifest.json",
        "Data/com.apple.CoreML/model.mlmodel",
        "Data/com.apple.CoreML/weights/weight.bin",
    ] {
        assert_eq!(
            std::fs::read(a.join(f)).unwrap(),
            std::fs::read(b.join(f)).unwrap(),
            "{f} differs"
        );
    }
    common::validate(&a);
}
