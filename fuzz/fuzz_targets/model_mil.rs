//! libFuzzer target: `milkit::fuzzing::model_mil` on arbitrary bytes, with the mlmodel
//! target's seed weights as the compiled folder's weight.bin.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    milkit::fuzzing::MLMODEL_WEIGHTS
        .get_or_init(|| include_bytes!("../seeds/mlmodel.weight.bin").to_vec());
    let _ = milkit::fuzzing::model_mil(data);
});
