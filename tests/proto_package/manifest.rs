//! Manifest.json: deterministic output in libmodelpackage's format, and a reader that keeps
//! every item inside the package.

use milkit::package::manifest::{
    item_identifier, read_package, Manifest, MANIFEST_FILE, MODEL_ITEM_PATH, WEIGHTS_ITEM_PATH,
};
use std::path::{Path, PathBuf};

fn is_uuid_text(s: &str) -> bool {
    let groups: Vec<&str> = s.split('-').collect();
    groups.iter().map(|g| g.len()).collect::<Vec<_>>() == [8, 4, 4, 4, 12]
        && s.chars()
            .all(|c| c == '-' || c.is_ascii_digit() || ('a'..='f').contains(&c))
}

/// A package skeleton in `dir` with our manifest, an (empty) model file and weights dir.
fn make_package(dir: &Path, manifest: &Manifest) -> PathBuf {
    let pkg = dir.join("m.mlpackage");
    std::fs::create_dir_all(pkg.join("Data/com.apple.CoreML/weights")).unwrap();
    std::fs::write(pkg.join("Data/com.apple.CoreML/model.mlmodel"), b"").unwrap();
    manifest.write(&pkg).unwrap();
    pkg
}

#[test]
fn mlprogram_manifest_is_deterministic_and_parses_back() {
    let m = Manifest::mlprogram(true);
    let text = m.to_json().unwrap();
    assert_eq!(text, Manifest::mlprogram(true).to_json().unwrap());
    assert!(text.ends_with("}\n") && text.contains("\n    \"itemInfoEntries\": {\n"));
    assert_eq!(
        Manifest::parse(&text, Path::new("Manifest.json")).unwrap(),
        m
    );
    let ids: Vec<&String> = m.item_info_entries.keys().collect();
    assert_eq!(ids.len(), 2);
    assert!(ids.iter().all(|id| is_uuid_text(id)), "{ids:?}");
    assert_eq!(m.root_model_identifier, item_identifier(MODEL_ITEM_PATH));
    assert_ne!(
        item_identifier(MODEL_ITEM_PATH),
        item_identifier(WEIGHTS_ITEM_PATH)
    );
    let root = m.root_item().unwrap();
    assert_eq!(
        (root.name.as_str(), root.path.as_str()),
        ("model.mlmodel", MODEL_ITEM_PATH)
    );
    assert_eq!(root.author, "com.apple.CoreML");
    assert_eq!(root.description, "CoreML Model Specification");
    let w = m.find_item("com.apple.CoreML", "weights").unwrap();
    assert_eq!(
        (w.path.as_str(), w.description.as_str()),
        (WEIGHTS_ITEM_PATH, "CoreML Model Weights")
    );
    assert_eq!(Manifest::mlprogram(false).item_info_entries.len(), 1);
}

#[test]
fn coremltools_manifests_parse_and_reprint_identically() {
    let Some(fx) = crate::fixtures() else { return };
    for pkg in crate::fixture_packages(&fx) {
        let path = pkg.join(MANIFEST_FILE);
        let text = std::fs::read_to_string(&path).unwrap();
        let m = Manifest::parse(&text, &path).unwrap();
        // Same JSON layout as libmodelpackage: our printer reproduces its file exactly.
        assert_eq!(m.to_json().unwrap(), text, "{}", path.display());
        let layout = read_package(&pkg).unwrap();
        assert_eq!(
            layout.model,
            pkg.join("Data/com.apple.CoreML/model.mlmodel")
        );
        assert_eq!(
            layout.weights_dir,
            Some(pkg.join("Data/com.apple.CoreML/weights"))
        );
    }
}

fn read_err(pkg: &Path) -> String {
    let e = format!("{:#}", read_package(pkg).expect_err("should be refused"));
    assert!(
        e.contains("Manifest.json") || e.contains("m.mlpackage"),
        "error names no file: {e}"
    );
    e
}

#[test]
fn reader_refuses_escaping_or_broken_manifests() {
    let dir = tempfile::tempdir().unwrap();
    let good = Manifest::mlprogram(true);
    let pkg = make_package(dir.path(), &good);
    assert!(read_package(&pkg).unwrap().weights_dir.is_some());
    let weights_id = item_identifier(WEIGHTS_ITEM_PATH);

    let with_path = |p: &str| {
        let mut m = good.clone();
        m.item_info_entries.get_mut(&weights_id).unwrap().path = p.into();
        m.write(&pkg).unwrap();
    };
    for (bad, why) in [
        ("/etc", "absolute"),
        ("../../etc", ".."),
        ("com.apple.CoreML/../../x", ".."),
        ("com.apple.CoreML\\weights", "backslash"),
        ("", "empty"),
    ] {
        with_path(bad);
        let e = read_err(&pkg);
        assert!(
            e.contains("Manifest.json") && e.contains(why),
            "{bad:?}: {e}"
        );
    }
    with_path("com.apple.CoreML/missing");
    assert!(read_err(&pkg).contains("does not exist"));
    with_path("com.apple.CoreML/model.mlmodel");
    assert!(read_err(&pkg).contains("not a directory"));

    // A symlink inside Data/ that points outside the package.
    #[cfg(unix)]
    {
        let outside = dir.path().join("outside");
        std::fs::create_dir_all(&outside).unwrap();
        std::os::unix::fs::symlink(&outside, pkg.join("Data/escape")).unwrap();
        with_path("escape");
        assert!(read_err(&pkg).contains("outside the package"));
        // A symlink that stays inside is fine.
        std::os::unix::fs::symlink("com.apple.CoreML/weights", pkg.join("Data/inside")).unwrap();
        with_path("inside");
        assert!(read_package(&pkg).is_ok());
    }

    let mut m = good.clone();
    m.root_model_identifier = "nope".into();
    m.write(&pkg).unwrap();
    assert!(read_err(&pkg).contains("rootModelIdentifier"));
    let mut m = good.clone();
    m.file_format_version = "2.0.0".into();
    m.write(&pkg).unwrap();
    assert!(read_err(&pkg).contains("fileFormatVersion"));
    std::fs::write(pkg.join(MANIFEST_FILE), "{\"fileFormatVersion\": 1}").unwrap();
    assert!(read_err(&pkg).contains("not a valid package manifest"));
    std::fs::remove_file(pkg.join(MANIFEST_FILE)).unwrap();
    assert!(read_err(&pkg).contains("cannot read"));
}

const PY_LOAD: &str = r#"
import sys
from coremltools.libmodelpackage import ModelPackage
p = ModelPackage(sys.argv[1])
print(p.getRootModel().path())
"#;

#[test]
fn libmodelpackage_accepts_our_manifest() {
    let Some(py) = crate::python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let pkg = make_package(dir.path(), &Manifest::mlprogram(true));
    let before = std::fs::read(pkg.join(MANIFEST_FILE)).unwrap();
    let out = crate::run_python(&py, PY_LOAD, &[pkg.as_os_str()]);
    assert_eq!(
        Path::new(out.trim()),
        pkg.join("Data/com.apple.CoreML/model.mlmodel")
    );
    // libmodelpackage rewrites the manifest when it closes the package: it writes the very
    // same bytes we did.
    assert_eq!(std::fs::read(pkg.join(MANIFEST_FILE)).unwrap(), before);
}
