//! Atomic output of packages (or of a directory holding several packages): everything is
//! built in a hidden temporary directory beside the target, synced to disk, then renamed into
//! place, so a crash or an error never leaves a half-written package at the target path.
//!
//! Temporary names are `.<name>.milkit-tmp-<pid>-<n>` (and `.<name>.milkit-old-<pid>-<n>` for
//! a replaced output moved aside): hidden, recognisable, and carrying the writer's process id.
//! A run killed with `kill -9` leaves its temporary directory behind; the next write to the
//! same target removes every such leftover whose process is no longer alive (see
//! [`clean_stale`]), and restores a moved-aside previous output if the target is missing.

use anyhow::{bail, Context, Result};
use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// How a Git LFS pointer file (a repository copy without `git lfs pull`) starts.
pub(crate) const LFS_POINTER: &[u8] = b"version https://git-lfs.github.com/spec/";

/// Distinguishes temporary names made by several calls within one process.
static SEQUENCE: AtomicU64 = AtomicU64::new(0);

/// Builds `target` atomically.
///
/// - If `target` exists and `force` is false: error (naming it and suggesting `--force`);
///   nothing is touched.
/// - Otherwise removes stale leftovers of killed runs on the same target ([`clean_stale`]),
///   creates an empty hidden directory `.<name>.milkit-tmp-<pid>-<n>` in the target's
///   parent (created if missing), calls `fill` with it, fsyncs every file and directory in
///   it, and renames it to `target`. With `force` an existing target is first renamed aside
///   (`.<name>.milkit-old-<pid>-<n>`), and removed after the new one is in place.
/// - On any error (including a panic in `fill`) the temporary directory is removed, and an
///   existing target is left as it was.
///
/// `fill` may create one package directly in the directory it gets (target = `x.mlpackage`)
/// or several packages inside it (target = an output directory).
pub fn write_package_atomically(
    target: &Path,
    force: bool,
    fill: impl FnOnce(&Path) -> Result<()>,
) -> Result<()> {
    if let (Some(parent), Some(name)) = (target.parent(), target.file_name()) {
        let parent = if parent.as_os_str().is_empty() {
            Path::new(".")
        } else {
            parent
        };
        clean_stale(parent, &name.to_string_lossy());
    }
    let exists = fs::symlink_metadata(target).is_ok();
    if exists && !force {
        bail!(
            "{} already exists; pass --force to replace it",
            target.display()
        );
    }
    let name = target
        .file_name()
        .with_context(|| format!("{}: output path has no file name", target.display()))?
        .to_string_lossy()
        .into_owned();
    let parent = match target.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    fs::create_dir_all(&parent)
        .with_context(|| format!("cannot create output directory {}", parent.display()))?;

    let tmp = TempDir::create(&parent, &name)?;
    fill(&tmp.path).with_context(|| format!("while writing {}", target.display()))?;
    sync_tree(&tmp.path)?;

    if exists {
        let old = unique_path(&parent, &name, "old");
        fs::rename(target, &old).with_context(|| {
            format!(
                "cannot move the existing {} aside to replace it",
                target.display()
            )
        })?;
        if let Err(e) = fs::rename(&tmp.path, target) {
            // Put the old output back so a failed replace changes nothing.
            let restored = fs::rename(&old, target);
            return Err(e).with_context(|| {
                format!(
                    "cannot move the new output into {}{}",
                    target.display(),
                    if restored.is_err() {
                        " (the previous output is at a hidden .old path)"
                    } else {
                        ""
                    }
                )
            });
        }
        tmp.disarm();
        remove_any(&old).with_context(|| {
            format!(
                "replaced {}, but cannot remove {}",
                target.display(),
                old.display()
            )
        })?;
    } else {
        fs::rename(&tmp.path, target)
            .with_context(|| format!("cannot move the new output into {}", target.display()))?;
        tmp.disarm();
    }
    sync_dir(&parent);
    Ok(())
}

/// `<parent>/.<name>.milkit-<tag>-<pid>-<n>`, a name no other writer uses.
fn unique_path(parent: &Path, name: &str, tag: &str) -> PathBuf {
    let n = SEQUENCE.fetch_add(1, Ordering::Relaxed);
    parent.join(format!(".{name}.milkit-{tag}-{}-{n}", std::process::id()))
}

/// The tag (`tmp` or `old`) and writer pid of a temporary name made by [`unique_path`] for
/// `name`, or `None` for any other file name.
pub fn temporary_of(file_name: &str, name: &str) -> Option<(&'static str, u32)> {
    let rest = file_name.strip_prefix('.')?.strip_prefix(name)?;
    let rest = rest.strip_prefix(".milkit-")?;
    let (tag, rest) = if let Some(r) = rest.strip_prefix("tmp-") {
        ("tmp", r)
    } else {
        ("old", rest.strip_prefix("old-")?)
    };
    let (pid, n) = rest.split_once('-')?;
    if n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((tag, pid.parse().ok()?))
}

/// Whether process `pid` is still running: `kill(pid, 0)` does not fail with `ESRCH`.
#[cfg(unix)]
fn alive(pid: u32) -> bool {
    let Ok(p) = libc::pid_t::try_from(pid) else {
        return false;
    };
    if p <= 0 {
        return false;
    }
    // SAFETY: signal 0 only checks whether the process exists; nothing is sent.
    let r = unsafe { libc::kill(p, 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

/// Elsewhere every process counts as alive, so nothing is ever cleaned there.
#[cfg(not(unix))]
fn alive(_pid: u32) -> bool {
    true
}

/// Removes the leftovers of killed writers of `<parent>/<name>`: temporary directories and
/// files (`.<name>.milkit-tmp-<pid>-<n>`) whose process is gone. A moved-aside previous output
/// (`.<name>.milkit-old-…`) of a dead writer is put back when the target is missing (the kill
/// came between the two renames of a replace), else removed. Leftovers of live processes
/// (another writer at work) and every other name are left alone. Best effort: errors are
/// ignored, the write that follows reports what matters.
pub fn clean_stale(parent: &Path, name: &str) {
    let Ok(entries) = fs::read_dir(parent) else {
        return;
    };
    let target = parent.join(name);
    for entry in entries.flatten() {
        let file_name = entry.file_name();
        let Some((tag, pid)) = temporary_of(&file_name.to_string_lossy(), name) else {
            continue;
        };
        if pid == std::process::id() || alive(pid) {
            continue;
        }
        let path = entry.path();
        if tag == "old" && fs::symlink_metadata(&target).is_err() {
            let _ = fs::rename(&path, &target);
        } else {
            let _ = remove_any(&path);
        }
    }
}

/// A temporary directory removed on drop unless disarmed.
struct TempDir {
    path: PathBuf,
    armed: bool,
}

impl TempDir {
    fn create(parent: &Path, name: &str) -> Result<TempDir> {
        let path = unique_path(parent, name, "tmp");
        fs::create_dir(&path)
            .with_context(|| format!("cannot create temporary directory {}", path.display()))?;
        Ok(TempDir { path, armed: true })
    }

    fn disarm(mut self) {
        self.armed = false;
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if self.armed {
            // Best effort: the error that got us here is more useful than a cleanup error.
            let _ = fs::remove_dir_all(&self.path);
        }
    }
}

fn remove_any(path: &Path) -> std::io::Result<()> {
    if fs::symlink_metadata(path)?.is_dir() {
        fs::remove_dir_all(path)
    } else {
        fs::remove_file(path)
    }
}

/// fsyncs every regular file under `dir` and the directories themselves (children first), so
/// the rename publishes complete data.
fn sync_tree(dir: &Path) -> Result<()> {
    for entry in fs::read_dir(dir).with_context(|| format!("cannot list {}", dir.display()))? {
        let entry = entry.with_context(|| format!("cannot list {}", dir.display()))?;
        let path = entry.path();
        let kind = entry
            .file_type()
            .with_context(|| format!("cannot stat {}", path.display()))?;
        if kind.is_dir() {
            sync_tree(&path)?;
        } else if kind.is_file() {
            File::open(&path)
                .and_then(|f| f.sync_all())
                .with_context(|| format!("cannot sync {} to disk", path.display()))?;
        }
    }
    sync_dir(dir);
    Ok(())
}

/// fsyncs a directory's entries where the platform allows it (not on Windows, where a
/// directory cannot be opened as a file; there the rename is what we rely on).
fn sync_dir(dir: &Path) {
    if cfg!(unix) {
        if let Ok(f) = File::open(dir) {
            let _ = f.sync_all();
        }
    }
}

/// Writes one file atomically: into a hidden temporary file beside `target`, synced, then
/// renamed into place. Refuses an existing `target` unless `force`.
pub fn write_file_atomically(target: &Path, data: &[u8], force: bool) -> Result<()> {
    use std::io::Write;
    if fs::symlink_metadata(target).is_ok() && !force {
        bail!(
            "{} already exists; pass --force to replace it",
            target.display()
        );
    }
    let name = target
        .file_name()
        .with_context(|| format!("{}: output path has no file name", target.display()))?
        .to_string_lossy()
        .into_owned();
    let parent = match target.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    fs::create_dir_all(&parent)
        .with_context(|| format!("cannot create output directory {}", parent.display()))?;
    clean_stale(&parent, &name);
    let tmp = unique_path(&parent, &name, "tmp");
    let r = (|| -> Result<()> {
        let mut f = File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
        f.write_all(data)?;
        f.sync_all()?;
        fs::rename(&tmp, target)
            .with_context(|| format!("cannot move the new file into {}", target.display()))
    })();
    if r.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    r
}
