//! `milkit export --recipe R --calibrate-on CLIPS` with a quality target, on a very small
//! random Whisper checkpoint and real speech: a target every plan meets gives the fewest
//! bits, a target only fp16 meets gives an uncompressed folder, a target no plan up to
//! `max_bits` meets is refused naming the best plan reached, a second run reads statistics
//! and measurements from the cache and writes the same folder, and a recipe without a
//! target takes its statistics from the clips in the same command, end-metric sensitivity
//! curves included where the recipe asks for them (the same curves as `milkit calibrate
//! --sensitivity-recipe`, then read from the cache). And `milkit compress
//! --target-quality` on one package, judged by its own outputs: the plan written meets the
//! bound (recomputed here in float64) while the uniform width below it does not, a bound no
//! plan meets is refused naming the best reached, and inputs random probes cannot stand for
//! are named.

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

#[test]
fn sensitivity_widths_in_a_recipe_measure_the_curves_calibrate_would_in_the_same_command() {
    let Some(fx) = common::fixtures() else { return };
    let dir = tempfile::tempdir().unwrap();
    let hf = micro(dir.path());
    // A decoder planned by end-metric sensitivity at 4 and 8 bits, no encoder compression.
    let r = dir.path().join("s.toml");
    std::fs::write(
        &r,
        "name = \"s\"\n\n[[component]]\ncomponent = \"decoder\"\nfile = \"TextDecoder.mlpackage\"\n\
         sensitivity_widths = [8, 4]\n\n[component.compress]\npalettize = \"kmeans\"\nnbits = 4\n\
         group_size = 8\ntarget_bits = 4.5\n",
    )
    .unwrap();
    let clip = &clips(&fx)[..1];
    let cache = dir.path().join("cache");
    let out = dir.path().join("one");
    let o = export(&hf, &r, &out, &cache, clip, &[]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    let stats: Vec<PathBuf> = std::fs::read_dir(cache.join("statistics"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(stats.len(), 1, "{stats:?}");
    let one = milkit::passes::calibrate::Calibration::load(&stats[0]).unwrap();
    // The three-step form on the same clip.
    let st = dir.path().join("dec.st");
    let o = milkit()
        .args([
            "calibrate",
            "--component",
            "decoder",
            "--widths",
            "4,8",
            "--sensitivity-recipe",
        ])
        .arg(&r)
        .arg("--model")
        .arg(&hf)
        .arg("--audio")
        .arg(&clip[0])
        .arg("--out")
        .arg(&st)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let three = milkit::passes::calibrate::Calibration::load(&st).unwrap();
    assert!(one.has_end_metric(), "curves measured");
    let weights: Vec<&String> = three.moments.keys().collect();
    assert!(!weights.is_empty());
    let mut curves = 0;
    for w in weights {
        let (a, b) = (one.end_metric(w).unwrap(), three.end_metric(w).unwrap());
        assert_eq!(a.is_some(), b.is_some(), "{w}");
        if let (Some(a), Some(b)) = (a, b) {
            assert_eq!(a.iter().map(|c| c.0).collect::<Vec<_>>(), vec![4, 8], "{w}");
            for ((_, x), (_, y)) in a.iter().zip(&b) {
                assert!(
                    (x - y).abs() <= 1e-9 * y.abs().max(1e-12),
                    "{w}: {x} vs {y}"
                );
            }
            curves += 1;
        }
    }
    assert!(curves > 0, "compressed weights have curves");
    // Again: the statistics, curves included, come from the cache.
    let o = export(&hf, &r, &dir.path().join("two"), &cache, clip, &[]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("decoder statistics: cached"), "{err}");
    // Only a compressed encoder or decoder takes widths.
    std::fs::write(
        &r,
        "name = \"s\"\n\n[[component]]\ncomponent = \"decoder\"\nfile = \"TextDecoder.mlpackage\"\n\
         sensitivity_widths = [4]\n",
    )
    .unwrap();
    let o = export(&hf, &r, &dir.path().join("three"), &cache, clip, &[]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("sets sensitivity_widths but is not compressed"),
        "{err}"
    );
}

/// One component's package (iOS18) of the checkpoint `hf`, written to `out`.
fn export_component(hf: &Path, component: &str, out: &Path) {
    let o = milkit()
        .args([
            "export",
            "--component",
            component,
            "--target",
            "ios18",
            "--model",
        ])
        .arg(hf)
        .arg("--out")
        .arg(out)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

/// The encoder package (iOS18) of the micro checkpoint.
fn micro_encoder(dir: &Path) -> PathBuf {
    let hf = micro(dir);
    let enc = dir.join("enc.mlpackage");
    export_component(&hf, "encoder", &enc);
    enc
}

fn compress(input: &Path, out: &Path, extra: &[&str]) -> Output {
    milkit()
        .arg("compress")
        .arg(input)
        .arg("--out")
        .arg(out)
        .args(["--palettize", "kmeans"])
        .args(extra)
        .output()
        .unwrap()
}

/// The lowest PSNR (peak = the reference's largest magnitude) of `candidate`'s outputs
/// against `reference`'s over the probes, in float64.
fn lowest_psnr(
    reference: &Path,
    candidate: &Path,
    probes: &[Vec<(String, milkit::runtime::Tensor)>],
) -> f64 {
    let mut a = milkit::runtime::Session::load(reference).unwrap();
    let mut b = milkit::runtime::Session::load(candidate).unwrap();
    let mut lowest = f64::INFINITY;
    for p in probes {
        let feeds: Vec<(&str, milkit::runtime::Tensor)> =
            p.iter().map(|(n, t)| (n.as_str(), t.clone())).collect();
        for ((_, x), (_, y)) in a
            .predict(&feeds)
            .unwrap()
            .iter()
            .zip(b.predict(&feeds).unwrap())
        {
            let x: Vec<f64> = x
                .flatten_all()
                .unwrap()
                .to_dtype(candle_core::DType::F64)
                .unwrap()
                .to_vec1()
                .unwrap();
            let y: Vec<f64> = y
                .flatten_all()
                .unwrap()
                .to_dtype(candle_core::DType::F64)
                .unwrap()
                .to_vec1()
                .unwrap();
            let mse = x.iter().zip(&y).map(|(p, q)| (p - q).powi(2)).sum::<f64>() / x.len() as f64;
            let peak = x.iter().fold(0f64, |m, v| m.max(v.abs()));
            lowest = lowest.min(10.0 * (peak * peak / mse).log10());
        }
    }
    lowest
}

#[test]
fn compress_with_a_quality_target_writes_the_fewest_uniform_bits_whose_outputs_meet_it() {
    let dir = tempfile::tempdir().unwrap();
    let enc = micro_encoder(dir.path());
    let out = dir.path().join("c.mlpackage");
    let o = compress(&enc, &out, &["--target-quality", "min_psnr_db=30"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    let chosen = err
        .lines()
        .find_map(|l| l.strip_prefix("chosen: "))
        .unwrap_or_else(|| panic!("a chosen plan: {err}"));
    let nbits: u32 = chosen
        .split(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap_or_else(|_| {
            panic!("on this model a uniform width meets it before any mixed plan below: {chosen}")
        });
    assert!(
        err.contains("| no: PSNR"),
        "the plans that miss say why: {err}"
    );
    let model = milkit::package::load_package(&enc).unwrap();
    let probes = milkit::quality::output_target::random_probes(&model, 4, 0).unwrap();
    let psnr = lowest_psnr(&enc, &out, &probes);
    assert!(psnr >= 30.0, "the written plan meets the bound: {psnr} dB");
    // The uniform width below it, compressed the same way, does not.
    let below = match nbits {
        8 => 6,
        6 => 4,
        n => n - 1,
    };
    let lower = dir.path().join("below.mlpackage");
    let o = compress(&enc, &lower, &["--nbits", &below.to_string()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let psnr_below = lowest_psnr(&enc, &lower, &probes);
    assert!(
        psnr_below < 30.0,
        "{below} bits would have met it too: {psnr_below} dB"
    );
    // The report's bits are the written package's.
    let written = milkit::quality::bits::package_bits(&out)
        .unwrap()
        .avg_bits
        .unwrap();
    let bits_col = format!("| {nbits} bits | {written:.3} |");
    assert!(err.contains(&bits_col), "{bits_col} in {err}");
}

#[test]
fn compress_refuses_a_target_no_plan_meets_naming_the_best_reached_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let enc = micro_encoder(dir.path());
    let out = dir.path().join("c.mlpackage");
    let o = compress(&enc, &out, &["--target-quality", "min_psnr_db=200"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(
        err.contains("no plan up to 8 bits meets the quality target min_psnr_db=200")
            && err.contains("the best reached is 8 bits"),
        "{err}"
    );
    assert!(!out.exists(), "nothing written");
    // max_bits bounds the plans tried.
    let o = compress(
        &enc,
        &out,
        &["--target-quality", "min_psnr_db=200,max_bits=4"],
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("the best reached is 4 bits"), "{err}");
    // A Whisper-folder measure is not a package's.
    let o = compress(&enc, &out, &["--target-quality", "max_wer_delta=0.5"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("unknown quality target `max_wer_delta` for one package"),
        "{err}"
    );
}

#[test]
fn compress_target_probes_come_from_files_and_an_integer_input_must_be_given() {
    let dir = tempfile::tempdir().unwrap();
    let enc = micro_encoder(dir.path());
    // The caller's probe: a quiet input makes every plan's error relative to small outputs.
    let model = milkit::package::load_package(&enc).unwrap();
    let f = &model.description.inputs[0];
    let n: usize = f.shape.iter().product();
    let t = milkit::runtime::Tensor::from_vec(
        (0..n)
            .map(|i| ((i % 97) as f32 / 97.0) - 0.5)
            .collect::<Vec<f32>>(),
        f.shape.as_slice(),
        &candle_core::Device::Cpu,
    )
    .unwrap();
    let npy = dir.path().join("probe.npy");
    milkit::runtime::io::write_npy(&npy, &t).unwrap();
    let out = dir.path().join("c.mlpackage");
    let spec = format!("{}={}", f.name, npy.display());
    let o = compress(
        &enc,
        &out,
        &[
            "--target-quality",
            "min_psnr_db=20",
            "--target-input",
            &spec,
        ],
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("(1 probe)"), "{err}");
    let o = compress(
        &enc,
        &dir.path().join("d.mlpackage"),
        &[
            "--target-quality",
            "min_psnr_db=20",
            "--target-input",
            "nosuch=x.npy",
        ],
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("has no input `nosuch`"), "{err}");
    // A decoder takes token ids: no random value stands for them.
    let hf = dir.path().join("micro");
    let dec = dir.path().join("dec.mlpackage");
    export_component(&hf, "decoder", &dec);
    let o = compress(
        &dec,
        &dir.path().join("e.mlpackage"),
        &["--target-quality", "min_psnr_db=20"],
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("input `input_ids` is not a float array")
            && err.contains("--target-input input_ids=FILE.npy"),
        "{err}"
    );
}
