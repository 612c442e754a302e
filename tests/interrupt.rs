//! Interruption: `kill -9` of a child `milkit export`, `compress` and `export --component
//! all` at several moments (right after the start, when its temporary folder appears, once
//! data is being written into it, and later) must leave nothing at the target; what a killed
//! run leaves behind is a hidden `.<name>.milkit-tmp-<pid>-<n>` folder, which the next run on
//! the same target removes (only leftovers of dead processes). Uses the real tiny.en
//! checkpoint (big enough to be caught mid-write); skips without fixtures.

mod common;

use milkit::package::fsio::{clean_stale, temporary_of, write_package_atomically};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[derive(Clone, Copy, Debug)]
enum Moment {
    /// Right after the process starts.
    Start,
    /// As soon as its temporary folder exists.
    TmpAppears,
    /// Once a file inside the temporary folder holds data.
    TmpHasData,
    /// Once the temporary folder holds this many bytes (mid-write).
    TmpHolds(u64),
    /// After this many milliseconds.
    After(u64),
}

/// Temporary entries for `name` in `parent` (any pid).
fn leftovers(parent: &Path, name: &str) -> Vec<(PathBuf, u32)> {
    std::fs::read_dir(parent)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let f = e.file_name().to_string_lossy().into_owned();
            temporary_of(&f, name).map(|(_, pid)| (e.path(), pid))
        })
        .collect()
}

fn bytes_under(dir: &Path) -> u64 {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return 0;
    };
    rd.filter_map(|e| e.ok())
        .map(|e| {
            let p = e.path();
            if p.is_dir() {
                bytes_under(&p)
            } else {
                e.metadata().map(|m| m.len()).unwrap_or(0)
            }
        })
        .sum()
}

/// Runs `cmd` (whose output is `target`) once per moment, killing it then with SIGKILL, and
/// checks that nothing is at the target and that whatever is left is a recognisable
/// temporary of the killed pid; then runs it to the end and checks that the output is whole
/// and every leftover is gone. Returns how many kills left a temporary behind.
fn kill_at_moments(cmd: &dyn Fn() -> Command, target: &Path, moments: &[Moment]) -> usize {
    let parent = target.parent().unwrap();
    let name = target.file_name().unwrap().to_string_lossy().into_owned();
    let mut left_behind = 0;
    let mut killed = Vec::new();
    for &moment in moments {
        let start = Instant::now();
        let mut child = cmd()
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let pid = child.id();
        let mut finished = None;
        loop {
            if let Some(st) = child.try_wait().unwrap() {
                finished = Some(st);
                break;
            }
            let mine: Vec<_> = leftovers(parent, &name)
                .into_iter()
                .filter(|(_, p)| *p == pid)
                .collect();
            let reached = match moment {
                Moment::Start => true,
                Moment::TmpAppears => !mine.is_empty(),
                Moment::TmpHasData => mine.iter().any(|(p, _)| bytes_under(p) > 0),
                Moment::TmpHolds(n) => mine.iter().any(|(p, _)| bytes_under(p) >= n),
                Moment::After(ms) => start.elapsed() >= Duration::from_millis(ms),
            };
            if reached {
                break;
            }
            assert!(
                start.elapsed() < Duration::from_secs(300),
                "{moment:?} never came"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        if let Some(st) = finished {
            // It ended before the moment came: then it must have succeeded, whole.
            assert!(st.success(), "{moment:?}: the run itself failed: {st:?}");
            assert!(target.exists());
            remove(target);
            eprintln!("{name}: finished before {moment:?}");
            continue;
        }
        child.kill().unwrap();
        let st = child.wait().unwrap();
        if st.success() {
            // It finished between the last look and the kill (the signal reached a process
            // that had already exited): the same as finishing before the moment.
            assert!(target.exists());
            remove(target);
            eprintln!("{name}: finished just before the kill at {moment:?}");
            continue;
        }
        killed.push(pid);
        assert!(
            !target.exists(),
            "{moment:?}: something is at {} after kill -9",
            target.display()
        );
        // Temporaries of this kill, and of earlier ones when this run was killed before it
        // got to its own write (where it cleans them up).
        let left = leftovers(parent, &name);
        for (p, owner) in &left {
            assert!(
                killed.contains(owner),
                "{}: not from a killed run",
                p.display()
            );
        }
        // Nothing else appeared in the parent: only the temporaries of the kill.
        let others: Vec<_> = std::fs::read_dir(parent)
            .unwrap()
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|f| f.contains(&name) && temporary_of(f, &name).is_none())
            .collect();
        assert!(others.is_empty(), "{moment:?}: unexpected {others:?}");
        if left.iter().any(|(_, owner)| *owner == pid) {
            left_behind += 1;
        }
        eprintln!(
            "{name}: killed at {moment:?} after {} ms, {} temporary left",
            start.elapsed().as_millis(),
            left.len()
        );
    }
    // The next run on the same target completes and removes the stale temporaries.
    let o = cmd().output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(target.exists());
    let left = leftovers(parent, &name);
    assert!(left.is_empty(), "stale temporaries not cleaned: {left:?}");
    left_behind
}

fn remove(p: &Path) {
    if p.is_dir() {
        std::fs::remove_dir_all(p).unwrap();
    } else {
        std::fs::remove_file(p).unwrap();
    }
}

/// For one package (the tiny.en encoder is 16 MB in fp16, 4 MB in LUT4).
const MOMENTS: &[Moment] = &[
    Moment::Start,
    Moment::After(50),
    Moment::TmpAppears,
    Moment::TmpHasData,
    Moment::TmpHolds(1 << 20),
    Moment::TmpHolds(3 << 20),
];

fn tiny() -> Option<PathBuf> {
    Some(common::fixtures()?.join("models/whisper-tiny.en"))
}

#[test]
fn kill_9_during_export_leaves_nothing_at_the_target() {
    let Some(model) = tiny() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let target = tmp.path().join("enc.mlpackage");
    let cmd = || {
        let mut c = common::milkit();
        c.args(["export", "--quiet", "--component", "encoder", "--model"])
            .arg(&model)
            .arg("--out")
            .arg(&target);
        c
    };
    let left = kill_at_moments(&cmd, &target, MOMENTS);
    assert!(
        left > 0,
        "no kill landed while the package was being written"
    );
    milkit::package::load_package(&target).unwrap();
}

#[test]
fn kill_9_during_compress_leaves_nothing_at_the_target() {
    let Some(model) = tiny() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("enc.mlpackage");
    let o = common::milkit()
        .args(["export", "--quiet", "--component", "encoder", "--model"])
        .arg(&model)
        .arg("--out")
        .arg(&input)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let target = tmp.path().join("lut.mlpackage");
    let cmd = || {
        let mut c = common::milkit();
        c.args([
            "compress",
            "--quiet",
            "--palettize",
            "uniform",
            "--nbits",
            "4",
        ])
        .arg(&input)
        .arg("--out")
        .arg(&target);
        c
    };
    let left = kill_at_moments(&cmd, &target, MOMENTS);
    assert!(
        left > 0,
        "no kill landed while the package was being written"
    );
    milkit::package::load_package(&target).unwrap();
}

#[test]
fn kill_9_during_a_whole_folder_export_leaves_nothing_at_the_target() {
    let Some(model) = tiny() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let target = tmp.path().join("folder");
    let cmd = || {
        let mut c = common::milkit();
        c.args(["export", "--quiet", "--component", "all", "--model"])
            .arg(&model)
            .arg("--out")
            .arg(&target);
        c
    };
    let left = kill_at_moments(
        &cmd,
        &target,
        &[
            Moment::Start,
            Moment::TmpAppears,
            Moment::TmpHasData,
            Moment::TmpHolds(4 << 20),
            Moment::TmpHolds(20 << 20),
            Moment::TmpHolds(60 << 20),
        ],
    );
    assert!(
        left > 0,
        "no kill landed while the folder was being written"
    );
    assert!(target.join("AudioEncoder.mlpackage").is_dir());
    assert!(target.join("tokenizer.json").is_file());
}

/// The pid of a process that has ended (a `true` that was waited for).
fn dead_pid() -> u32 {
    let mut c = Command::new("true").spawn().unwrap();
    let pid = c.id();
    c.wait().unwrap();
    pid
}

#[test]
fn stale_temporaries_are_cleaned_only_when_their_process_is_gone() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let dead = dead_pid();
    let stale = d.join(format!(".x.mlpackage.milkit-tmp-{dead}-0"));
    let stale_file = d.join(format!(".x.mlpackage.milkit-tmp-{dead}-3"));
    // pid 1 is always alive: another writer at work, left alone.
    let live = d.join(".x.mlpackage.milkit-tmp-1-0");
    // Names that only look similar: never touched.
    let other_target = d.join(format!(".y.mlpackage.milkit-tmp-{dead}-0"));
    let not_ours = d.join(format!(".x.mlpackage.tmp-{dead}-0"));
    let user = d.join("x.mlpackage.milkit-tmp-1-0");
    for p in [&stale, &live, &other_target, &not_ours, &user] {
        std::fs::create_dir(p).unwrap();
        std::fs::write(p.join("weight.bin"), "partial").unwrap();
    }
    std::fs::write(&stale_file, "partial").unwrap();
    clean_stale(d, "x.mlpackage");
    assert!(!stale.exists() && !stale_file.exists());
    for p in [&live, &other_target, &not_ours, &user] {
        assert!(p.exists(), "{} was removed", p.display());
    }
    assert_eq!(
        temporary_of(&format!(".x.mlpackage.milkit-old-{dead}-7"), "x.mlpackage"),
        Some(("old", dead))
    );
    assert_eq!(
        temporary_of(".x.mlpackage.milkit-tmp-12-", "x.mlpackage"),
        None
    );
    assert_eq!(
        temporary_of(".x.mlpackage.milkit-tmp-a-1", "x.mlpackage"),
        None
    );

    // A previous output moved aside by a replace killed between its two renames comes back
    // when the target is missing; a new write without --force then refuses to replace it.
    let old = d.join(format!(".z.mlpackage.milkit-old-{dead}-0"));
    std::fs::create_dir(&old).unwrap();
    std::fs::write(old.join("keep"), "previous").unwrap();
    let target = d.join("z.mlpackage");
    let e = write_package_atomically(&target, false, |_| Ok(())).unwrap_err();
    assert!(format!("{e:#}").contains("already exists"), "{e:#}");
    assert_eq!(
        std::fs::read_to_string(target.join("keep")).unwrap(),
        "previous"
    );
    assert!(!old.exists());
    // With the target present, a stale moved-aside copy is removed instead.
    std::fs::create_dir(&old).unwrap();
    write_package_atomically(&target, true, |dir| {
        std::fs::write(dir.join("new"), "new").map_err(Into::into)
    })
    .unwrap();
    assert!(!old.exists() && target.join("new").exists() && !target.join("keep").exists());
}
