//! What loading a package costs in memory: the heap bytes the runtime allocates while it
//! compiles a synthetic encoder (fp16 and LUT4), counted by `milkit::alloc::Counting`
//! (the `milkit` binary's allocator with counters), against the bytes of the package's
//! weight file. Weights are copied out of the mapped file once, into their packed form;
//! neither an fp16 weight nor a LUT4 one may be held expanded next to that copy, and
//! (Linux) the file's pages do not stay resident next to the copies.

mod common;

use common::milkit;
use milkit::alloc::{live_bytes, peak_bytes, reset_peak};
use std::path::Path;

#[global_allocator]
static ALLOC: milkit::alloc::Counting = milkit::alloc::Counting;

/// Heap a load may take beyond the weights: the program, the plan, biases widened to
/// f32, the palettes, and the shared block the small packed weights move into while
/// their own copies are still live (`kernels::gemv::share_arena`).
const ALLOWANCE: usize = 16 << 20;

fn ok(o: &std::process::Output) {
    assert!(
        o.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
}

fn weight_file_bytes(pkg: &Path) -> usize {
    std::fs::metadata(pkg.join("Data/com.apple.CoreML/weights/weight.bin"))
        .unwrap()
        .len() as usize
}

/// Bytes of `file`'s mapped pages resident in this process (`None` where
/// `/proc/self/smaps` is unreadable).
fn mapped_resident(file: &Path) -> Option<usize> {
    let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
    let file = file.canonicalize().ok()?;
    let name = file.to_str()?;
    let mut inside = false;
    let mut kb = 0;
    for line in smaps.lines() {
        let first = line.split_whitespace().next().unwrap_or("");
        if first.contains('-') && first.chars().all(|c| c.is_ascii_hexdigit() || c == '-') {
            inside = line.ends_with(name);
        } else if inside && line.starts_with("Rss:") {
            kb += line.split_whitespace().nth(1)?.parse::<usize>().ok()?;
        }
    }
    Some(kb * 1024)
}

/// Peak heap bytes above those live before while `pkg` loads into a session, and the
/// bytes of its weight file left resident once it has.
fn load_peak(pkg: &Path) -> (usize, Option<usize>) {
    let before = live_bytes();
    reset_peak();
    let s = milkit::runtime::Session::load(pkg).unwrap();
    let peak = peak_bytes() - before;
    let resident = mapped_resident(&pkg.join("Data/com.apple.CoreML/weights/weight.bin"));
    drop(s);
    (peak, resident)
}

#[test]
fn loading_an_encoder_allocates_its_weights_about_once() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("base");
    ok(&milkit()
        .args(["synth", "--quiet", "--preset", "base", "--out"])
        .arg(&ckpt)
        .output()
        .unwrap());
    let fp16 = dir.path().join("fp16.mlpackage");
    let lut4 = dir.path().join("lut4.mlpackage");
    for (pkg, extra) in [
        (&fp16, &[][..]),
        (
            &lut4,
            &[
                "--palettize",
                "kmeans",
                "--nbits",
                "4",
                "--granularity",
                "per-grouped-channel",
                "--group-size",
                "16",
            ][..],
        ),
    ] {
        ok(&milkit()
            .args(["export", "--component", "encoder", "--abi", "whisperkit"])
            .arg("--model")
            .arg(&ckpt)
            .args(extra)
            .arg("--out")
            .arg(pkg)
            .output()
            .unwrap());
    }
    // The LUT4 file is about a quarter of the fp16 one: its codes are 4 bits.
    let (w16, w4) = (weight_file_bytes(&fp16), weight_file_bytes(&lut4));
    assert!(w4 * 3 < w16, "LUT4 weights {w4} bytes against fp16 {w16}");
    for (name, pkg, w) in [("fp16", &fp16, w16), ("LUT4", &lut4, w4)] {
        let (peak, resident) = load_peak(pkg);
        let bound = w + w / 10 + ALLOWANCE;
        eprintln!(
            "{name}: weight file {w} bytes, load peak {peak} bytes (bound {bound}), \
             {resident:?} bytes of the file resident after"
        );
        if let Some(r) = resident {
            assert!(
                r <= w / 8,
                "{name}: {r} bytes of the {w}-byte weight file stay resident next to the \
                 packed copies"
            );
        }
        assert!(
            peak <= bound,
            "{name}: loading took {peak} bytes of heap at its peak, over 1.1 × the \
             {w}-byte weight file + {ALLOWANCE}"
        );
    }
}
