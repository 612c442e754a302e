//! libFuzzer target: `milkit::fuzzing::mlmodel` on arbitrary bytes, loaded as the
//! model.mlmodel of a package whose weight.bin is the seed package's (fuzz/seeds/).
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    milkit::fuzzing::MLMODEL_WEIGHTS
        .get_or_init(|| include_bytes!("../seeds/mlmodel.weight.bin").to_vec());
    let _ = milkit::fuzzing::mlmodel(data);
});
