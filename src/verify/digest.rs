//! Receipts: sha256 of `model.mlmodel`, of `weight.bin` and of the whole package, plus file
//! sizes. The package digest is sha256 over the lines `<relative path>\0<file sha256 hex>\n`
//! of every file in byte order of the paths, so it depends on contents and names only (not on
//! timestamps, directory order or where the package lives). Symlinks are hashed as the text
//! `symlink:<target>` and never followed, so a digest never reads outside the package.

use crate::report::{Digests, FileDigest, FileSize, Receipt};
use anyhow::{Context, Result};
use sha2::{Digest, Sha256};
use std::io::Read;
use std::path::{Path, PathBuf};

fn hex(d: &[u8]) -> String {
    d.iter().map(|b| format!("{b:02x}")).collect()
}

/// sha256 of a file, streamed.
pub fn sha256_file(path: &Path) -> Result<String> {
    let mut f =
        std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f
            .read(&mut buf)
            .with_context(|| format!("cannot read {}", path.display()))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(hex(&h.finalize()))
}

/// Every entry below `root` that is not a directory: (relative `/`-path, absolute path).
fn walk(root: &Path) -> Result<Vec<(String, PathBuf)>> {
    let mut out = Vec::new();
    let mut stack = vec![(String::new(), root.to_path_buf())];
    while let Some((rel, dir)) = stack.pop() {
        let rd =
            std::fs::read_dir(&dir).with_context(|| format!("cannot list {}", dir.display()))?;
        for e in rd {
            let e = e.with_context(|| format!("cannot list {}", dir.display()))?;
            let name = e.file_name().to_string_lossy().into_owned();
            let r = if rel.is_empty() {
                name
            } else {
                format!("{rel}/{name}")
            };
            let ft = e
                .file_type()
                .with_context(|| format!("cannot stat {}", e.path().display()))?;
            if ft.is_dir() {
                stack.push((r, e.path()));
            } else {
                out.push((r, e.path()));
            }
        }
    }
    out.sort();
    Ok(out)
}

/// Size and sha256 of every file of the package, sorted by relative path.
pub fn file_digests(root: &Path) -> Result<Vec<FileDigest>> {
    walk(root)?
        .into_iter()
        .map(|(rel, abs)| {
            let meta = std::fs::symlink_metadata(&abs)
                .with_context(|| format!("cannot stat {}", abs.display()))?;
            let sha256 = if meta.file_type().is_symlink() {
                let t = std::fs::read_link(&abs)
                    .with_context(|| format!("cannot read link {}", abs.display()))?;
                hex(&Sha256::digest(
                    format!("symlink:{}", t.to_string_lossy()).as_bytes(),
                ))
            } else {
                sha256_file(&abs)?
            };
            Ok(FileDigest {
                path: rel,
                bytes: if meta.is_file() { meta.len() } else { 0 },
                sha256,
            })
        })
        .collect()
}

/// The package digest of a sorted file list (see the module doc).
pub fn package_digest(files: &[FileDigest]) -> String {
    let mut h = Sha256::new();
    for f in files {
        h.update(f.path.as_bytes());
        h.update([0u8]);
        h.update(f.sha256.as_bytes());
        h.update(b"\n");
    }
    hex(&h.finalize())
}

/// File sizes for `inspect`; unreadable entries are left out (inspect reports what it can).
pub fn file_sizes(root: &Path) -> Vec<FileSize> {
    walk(root)
        .unwrap_or_default()
        .into_iter()
        .filter_map(|(rel, abs)| {
            let m = std::fs::symlink_metadata(&abs).ok()?;
            Some(FileSize {
                path: rel,
                bytes: if m.is_file() { m.len() } else { 0 },
            })
        })
        .collect()
}

fn relative(root: &Path, p: &Path) -> Option<String> {
    let r = p.strip_prefix(root).ok()?;
    Some(
        r.components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join("/"),
    )
}

/// Builds the receipt of a package whose root model file is `model_file` and weights file (if
/// any) `weights_file`, both inside `root`.
pub fn receipt(
    root: &Path,
    model_file: &Path,
    weights_file: Option<&Path>,
    command_line: &[String],
) -> Result<Receipt> {
    let files = file_digests(root)
        .with_context(|| format!("cannot hash the files of {}", root.display()))?;
    let lookup = |p: &Path| -> Result<String> {
        match relative(root, p).and_then(|r| files.iter().find(|f| f.path == r)) {
            Some(f) => Ok(f.sha256.clone()),
            None => sha256_file(p),
        }
    };
    let digests = Digests {
        model_mlmodel: lookup(model_file)?,
        weight_bin: match weights_file {
            Some(w) if w.exists() => Some(lookup(w)?),
            _ => None,
        },
        package: package_digest(&files),
    };
    Ok(Receipt {
        tool: "milkit".into(),
        version: env!("CARGO_PKG_VERSION").into(),
        command_line: command_line.to_vec(),
        package: root.display().to_string(),
        digests,
        files,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn package_digest_depends_on_names_and_contents_only() {
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        for (d, order) in [(a.path(), [0, 1]), (b.path(), [1, 0])] {
            std::fs::create_dir_all(d.join("Data/x")).unwrap();
            for i in order {
                std::fs::write(d.join(format!("Data/x/f{i}")), format!("content {i}")).unwrap();
            }
        }
        let fa = file_digests(a.path()).unwrap();
        let fb = file_digests(b.path()).unwrap();
        assert_eq!(fa, fb);
        assert_eq!(fa[0].path, "Data/x/f0");
        // sha256("content 0"), computed independently with coreutils' sha256sum.
        assert_eq!(
            fa[0].sha256,
            "75e0d458fc2da40b5b8b8b614d0192e9da7fffc2d6042f33300fdb0e8a83dfb4"
        );
        assert_eq!(fa[0].bytes, 9);
        assert_eq!(package_digest(&fa), package_digest(&fb));
        std::fs::write(b.path().join("Data/x/f1"), "changed").unwrap();
        assert_ne!(
            package_digest(&fa),
            package_digest(&file_digests(b.path()).unwrap())
        );
    }
}
