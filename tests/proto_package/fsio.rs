//! Atomic package output: refusals leave the target untouched, failures leave nothing behind.

use milkit::package::fsio::write_package_atomically;
use std::path::Path;

/// Names in `dir`, sorted (hidden temporaries included).
fn entries(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

fn fill_one(dir: &Path, content: &str) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir.join("Data/com.apple.CoreML"))?;
    std::fs::write(dir.join("Data/com.apple.CoreML/model.mlmodel"), content)?;
    std::fs::write(dir.join("Manifest.json"), "{}")?;
    Ok(())
}

#[test]
fn writes_a_new_package() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("out/sub/a.mlpackage");
    write_package_atomically(&target, false, |d| fill_one(d, "v1")).unwrap();
    assert_eq!(
        std::fs::read_to_string(target.join("Data/com.apple.CoreML/model.mlmodel")).unwrap(),
        "v1"
    );
    assert_eq!(entries(&dir.path().join("out/sub")), vec!["a.mlpackage"]);
}

#[test]
fn existing_target_without_force_is_an_error_and_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("a.mlpackage");
    write_package_atomically(&target, false, |d| fill_one(d, "v1")).unwrap();
    let mut called = false;
    let e = write_package_atomically(&target, false, |d| {
        called = true;
        fill_one(d, "v2")
    })
    .unwrap_err();
    let msg = format!("{e:#}");
    assert!(
        msg.contains("a.mlpackage") && msg.contains("--force"),
        "{msg}"
    );
    assert!(!called, "fill ran although the target exists");
    assert_eq!(
        std::fs::read_to_string(target.join("Data/com.apple.CoreML/model.mlmodel")).unwrap(),
        "v1"
    );
    assert_eq!(entries(dir.path()), vec!["a.mlpackage"]);
    // A plain file at the target counts as existing too.
    let file_target = dir.path().join("f.mlpackage");
    std::fs::write(&file_target, "x").unwrap();
    assert!(write_package_atomically(&file_target, false, |d| fill_one(d, "v")).is_err());
    assert_eq!(std::fs::read_to_string(&file_target).unwrap(), "x");
}

#[test]
fn failing_fill_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("a.mlpackage");
    let e = write_package_atomically(&target, false, |d| {
        fill_one(d, "partial")?;
        anyhow::bail!("conversion failed halfway")
    })
    .unwrap_err();
    assert!(format!("{e:#}").contains("conversion failed halfway"));
    assert!(
        entries(dir.path()).is_empty(),
        "leftovers: {:?}",
        entries(dir.path())
    );

    // With force and an existing target, a failed fill keeps the old package intact.
    write_package_atomically(&target, false, |d| fill_one(d, "v1")).unwrap();
    assert!(write_package_atomically(&target, true, |_| anyhow::bail!("nope")).is_err());
    assert_eq!(
        std::fs::read_to_string(target.join("Data/com.apple.CoreML/model.mlmodel")).unwrap(),
        "v1"
    );
    assert_eq!(entries(dir.path()), vec!["a.mlpackage"]);

    // A panic inside fill also cleans up.
    let t2 = dir.path().join("b.mlpackage");
    let r = std::panic::catch_unwind(|| {
        let _ = write_package_atomically(&t2, false, |d| {
            fill_one(d, "x").unwrap();
            panic!("boom")
        });
    });
    assert!(r.is_err());
    assert_eq!(entries(dir.path()), vec!["a.mlpackage"]);
}

#[test]
fn force_replaces_an_existing_target() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("a.mlpackage");
    write_package_atomically(&target, false, |d| {
        fill_one(d, "v1")?;
        std::fs::write(d.join("stale.txt"), "old only")?;
        Ok(())
    })
    .unwrap();
    write_package_atomically(&target, true, |d| fill_one(d, "v2")).unwrap();
    assert_eq!(
        std::fs::read_to_string(target.join("Data/com.apple.CoreML/model.mlmodel")).unwrap(),
        "v2"
    );
    assert!(
        !target.join("stale.txt").exists(),
        "old contents survived the replace"
    );
    assert_eq!(entries(dir.path()), vec!["a.mlpackage"]);
    // Replacing a plain file works as well.
    let file_target = dir.path().join("f.mlpackage");
    std::fs::write(&file_target, "x").unwrap();
    write_package_atomically(&file_target, true, |d| fill_one(d, "v3")).unwrap();
    assert!(file_target.join("Manifest.json").is_file());
}

#[test]
fn directory_of_several_packages() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("whisper-tiny");
    write_package_atomically(&target, false, |d| {
        fill_one(&d.join("encoder.mlpackage"), "enc")?;
        fill_one(&d.join("decoder.mlpackage"), "dec")?;
        Ok(())
    })
    .unwrap();
    assert_eq!(
        entries(&target),
        vec!["decoder.mlpackage", "encoder.mlpackage"]
    );
    // A failure after the first package leaves no partial directory.
    let other = dir.path().join("whisper-base");
    assert!(write_package_atomically(&other, false, |d| {
        fill_one(&d.join("encoder.mlpackage"), "enc")?;
        anyhow::bail!("decoder failed")
    })
    .is_err());
    assert_eq!(entries(dir.path()), vec!["whisper-tiny"]);
}
