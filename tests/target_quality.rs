//! `milkit export --recipe R --calibrate-on CLIPS` with a quality target, on a very small
//! random Whisper checkpoint and real speech: a target every plan meets gives the fewest
//! bits, a target only fp16 meets gives an uncompressed folder, a target no plan up to
//! `max_bits` meets is refused naming the best plan reached, a second run reads statistics
//! and measurements from the cache and writes the same folder, and a recipe without a
//! target takes its statistics from the clips in the same command.

mod common;

use common::milkit;
use std::path::{Path, PathBuf};
use std::process::Output;

/// A very small random Whisper checkpoint (d 64, 2 + 2 layers).
fn micro(dir: &Path) -> PathBuf {
    let hf = dir.join("micro");
    let opts = milkit::whisper::synth::SynthOptions {
        seed: 11,
        dtype: milkit::whisper::synth::SynthDType::F16,
        progress: false,
        force: false,
    };
    milkit::whisper::synth::synthesize_with(&common::micro_config(), None, &hf, &opts).unwrap();
    hf
}

/// A WhisperKit recipe whose encoder is k-means palettized (decoder fp16), with `extra`
/// added at the top level (e.g. a `[target]` table goes after the components).
fn recipe(dir: &Path, target: &str) -> PathBuf {
    let p = dir.join("r.toml");
    std::fs::write(
        &p,
        format!(
            "name = \"t\"\ncopy_model_files = true\n\n[[component]]\ncomponent = \"mel\"\n\
             file = \"MelSpectrogram.mlpackage\"\n\n[[component]]\ncomponent = \"encoder\"\n\
             file = \"AudioEncoder.mlpackage\"\n\n[component.compress]\npalettize = \"kmeans\"\n\
             nbits = 4\ngroup_size = 16\n\n[[component]]\ncomponent = \"decoder\"\n\
             file = \"TextDecoder.mlpackage\"\n\n{target}"
        ),
    )
    .unwrap();
    p
}

fn export(
    hf: &Path,
    r: &Path,
    out: &Path,
    cache: &Path,
    clips: &[PathBuf],
    extra: &[&str],
) -> Output {
    let mut c = milkit();
    c.args(["export", "--recipe"])
        .arg(r)
        .arg("--model")
        .arg(hf)
        .arg("--out")
        .arg(out)
        .arg("--force")
        .arg("--cache-dir")
        .arg(cache)
        .arg("--calibrate-on")
        .args(clips)
        .args(extra);
    c.output().unwrap()
}

fn bits(folder: &Path) -> Option<f64> {
    milkit::quality::bits::folder_bits(folder).unwrap().avg_bits
}

fn clips(fx: &Path) -> Vec<PathBuf> {
    vec![
        fx.join("audio/jfk.wav"),
        fx.join("audio/ljspeech_LJ001-0001.wav"),
    ]
}

#[test]
fn a_met_target_gives_the_fewest_bits_and_a_strict_one_gives_fp16() {
    let Some(fx) = common::fixtures() else { return };
    let dir = tempfile::tempdir().unwrap();
    let hf = micro(dir.path());
    let cache = dir.path().join("cache");
    // Every plan agrees on at least no token: the 2-bit plan is the fewest bits.
    let r = recipe(dir.path(), "[target]\nmin_top1 = 0.0\n");
    let out = dir.path().join("loose");
    let o = export(&hf, &r, &out, &cache, &clips(&fx), &[]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("chosen: 2 bits"), "{err}");
    let b = bits(&out).expect("a compressed folder");
    assert!(b > 2.0 && b < 2.5, "2-bit tables and their overhead: {b}");
    // Zero KL: no compressed plan reaches it; fp16 does (the same folder as its baseline).
    let out = dir.path().join("strict");
    let o = export(
        &hf,
        &r,
        &out,
        &cache,
        &clips(&fx),
        &["--target-quality", "max_mean_kl=0"],
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("chosen: fp16"), "{err}");
    assert!(
        err.contains("no: mean KL"),
        "the plans that miss say why: {err}"
    );
    assert_eq!(bits(&out), None, "nothing compressed");
    assert!(out.join("AudioEncoder.mlpackage").is_dir());
}

#[test]
fn a_target_no_plan_meets_is_refused_naming_the_best_reached() {
    let Some(fx) = common::fixtures() else { return };
    let dir = tempfile::tempdir().unwrap();
    let hf = micro(dir.path());
    let r = recipe(dir.path(), "[target]\nmax_mean_kl = 0.0\nmax_bits = 8\n");
    let out = dir.path().join("none");
    let o = export(&hf, &r, &out, &dir.path().join("cache"), &clips(&fx), &[]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(
        err.contains("no plan up to 8 bits meets the quality target max_mean_kl=0"),
        "{err}"
    );
    assert!(err.contains("the best reached is 8 bits"), "{err}");
    assert!(!out.exists(), "nothing written on refusal");
    // A target with no clips to measure on is refused before anything runs.
    let o = milkit()
        .args(["export", "--recipe"])
        .arg(&r)
        .arg("--model")
        .arg(&hf)
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("--calibrate-on"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

#[test]
fn a_second_run_reads_its_measurements_from_the_cache_and_writes_the_same_folder() {
    let Some(fx) = common::fixtures() else { return };
    let dir = tempfile::tempdir().unwrap();
    let hf = micro(dir.path());
    let cache = dir.path().join("cache");
    let r = recipe(dir.path(), "[target]\nmin_encoder_psnr_db = 20\n");
    let first = dir.path().join("a");
    let o = export(&hf, &r, &first, &cache, &clips(&fx), &[]);
    let err1 = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(o.status.success(), "{err1}");
    assert!(!err1.contains("cached"), "a cold cache: {err1}");
    let second = dir.path().join("b");
    let o = export(&hf, &r, &second, &cache, &clips(&fx), &[]);
    let err2 = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(o.status.success(), "{err2}");
    assert!(err2.contains("encoder statistics: cached"), "{err2}");
    assert!(err2.contains("(cached)"), "{err2}");
    let chosen = |e: &str| {
        e.lines()
            .find(|l| l.starts_with("chosen:"))
            .map(str::to_string)
    };
    assert_eq!(chosen(&err1), chosen(&err2));
    let blob = |d: &Path| {
        std::fs::read(d.join("AudioEncoder.mlpackage/Data/com.apple.CoreML/weights/weight.bin"))
            .unwrap()
    };
    assert_eq!(blob(&first), blob(&second), "the same plan, the same bytes");
    // Other clips are another key: measured afresh.
    let third = dir.path().join("c");
    let other = vec![
        fx.join("audio/jfk.wav"),
        fx.join("audio/librivox_ss01_0880.wav"),
    ];
    let o = export(&hf, &r, &third, &cache, &other, &[]);
    let err3 = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err3}");
    assert!(!err3.contains("cached"), "{err3}");
}

#[test]
fn without_a_target_the_clips_give_the_statistics_in_the_same_command() {
    let Some(fx) = common::fixtures() else { return };
    let dir = tempfile::tempdir().unwrap();
    let hf = micro(dir.path());
    let r = recipe(dir.path(), "");
    let out = dir.path().join("plain");
    let cache = dir.path().join("cache");
    let o = export(&hf, &r, &out, &cache, &clips(&fx)[..1], &[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let stats: Vec<_> = std::fs::read_dir(cache.join("statistics"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(stats.len(), 1, "{stats:?}");
    assert!(stats[0].ends_with(".encoder.st"), "{stats:?}");
    let b = bits(&out).unwrap();
    assert!(b > 4.0 && b < 4.5, "{b}");
}
