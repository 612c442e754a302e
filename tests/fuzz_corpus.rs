//! Replays the committed fuzz corpus and crash reproducers (`fuzz/corpus/TARGET/*`,
//! `fuzz/regressions/TARGET/*`) through the harnesses the libFuzzer targets call
//! (`milkit::fuzzing`), so a regression of any finding fails `cargo test` and CI without
//! building the fuzz crate.
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Longest one input may take through its harness (the fuzz runs use `-timeout=10`).
const PER_INPUT: Duration = Duration::from_secs(10);

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz")
}

fn files(dir: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = match std::fs::read_dir(dir) {
        Ok(rd) => rd
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.is_file())
            .collect(),
        Err(_) => Vec::new(),
    };
    out.sort();
    out
}

#[test]
fn every_corpus_and_regression_file_runs_through_its_harness_without_panicking_in_bounded_time() {
    let weights = std::fs::read(fuzz_dir().join("seeds/mlmodel.weight.bin"))
        .expect("fuzz/seeds/mlmodel.weight.bin (the mlmodel target's weights) is committed");
    milkit::fuzzing::MLMODEL_WEIGHTS.get_or_init(|| weights);
    let mut failures = Vec::new();
    let mut replayed = 0;
    for (target, harness) in milkit::fuzzing::TARGETS {
        let mut inputs = files(&fuzz_dir().join("corpus").join(target));
        assert!(
            !inputs.is_empty(),
            "fuzz/corpus/{target} is empty: every target keeps a corpus"
        );
        inputs.extend(files(&fuzz_dir().join("regressions").join(target)));
        for input in inputs {
            let data = std::fs::read(&input).unwrap();
            let start = Instant::now();
            let outcome = std::panic::catch_unwind(|| harness(&data));
            let took = start.elapsed();
            replayed += 1;
            if outcome.is_err() {
                failures.push(format!(
                    "{}: the {target} harness panicked",
                    input.display()
                ));
            } else if took > PER_INPUT {
                failures.push(format!(
                    "{}: the {target} harness took {took:?} (limit {PER_INPUT:?})",
                    input.display()
                ));
            }
        }
    }
    milkit::fuzzing::remove_scratch();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(replayed >= milkit::fuzzing::TARGETS.len());
}

#[test]
fn every_harness_has_a_fuzz_target_and_every_target_a_harness() {
    let mut targets: Vec<String> = files(&fuzz_dir().join("fuzz_targets"))
        .iter()
        .filter_map(|p| Some(p.file_stem()?.to_str()?.to_string()))
        .collect();
    targets.sort();
    let mut harnesses: Vec<String> = milkit::fuzzing::TARGETS
        .iter()
        .map(|(n, _)| n.to_string())
        .collect();
    harnesses.sort();
    assert_eq!(targets, harnesses);
    let manifest = std::fs::read_to_string(fuzz_dir().join("Cargo.toml")).unwrap();
    for t in &targets {
        assert!(
            manifest.contains(&format!("name = \"{t}\"")),
            "fuzz/Cargo.toml has no [[bin]] {t}"
        );
    }
}

#[test]
fn the_seed_inputs_are_accepted_so_the_fuzzer_starts_from_valid_files() {
    // A corpus of files the parsers reject would only fuzz the first error path. The real
    // seeds (named after their origin, not libFuzzer's hashes) must parse.
    let weights = std::fs::read(fuzz_dir().join("seeds/mlmodel.weight.bin")).unwrap();
    milkit::fuzzing::MLMODEL_WEIGHTS.get_or_init(|| weights);
    for (target, seed) in [
        ("config", "tiny.en.json"),
        ("generation_config", "tiny.en.json"),
        ("safetensors", "tiny.en-4-tensors.safetensors"),
        ("shard_index", "index.json"),
        ("manifest", "milkit.json"),
        ("mlmodel", "synth-encoder-lut4.mlmodel"),
        ("model_mil", "synth-encoder-lut4.mil"),
        ("model_mil", "fluidaudio-TransposeEncoder.mil"),
        ("model_mil", "hand-state.mil"),
        ("model_mil", "hand-while-cond.mil"),
        ("coremldata", "fluidaudio-TransposeEncoder.bin"),
        ("coremldata", "silero-vad.bin"),
        ("coremldata", "mnist.bin"),
        ("weight_bin", "synth-enc-first6.bin"),
        ("wav", "jfk-50ms-16bit.wav"),
        ("tokenizer", "small.json"),
        ("recipe", "whisperkit-tiny-lut4.toml"),
        ("pytorch", "tiny-2-tensors.bin"),
    ] {
        let path = fuzz_dir().join("corpus").join(target).join(seed);
        let data = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let harness = milkit::fuzzing::harness(target).unwrap();
        if let Err(e) = harness(&data) {
            panic!("{}: the {target} seed is rejected: {e:#}", path.display());
        }
    }
    milkit::fuzzing::remove_scratch();
}
