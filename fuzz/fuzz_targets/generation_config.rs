//! libFuzzer target: `milkit::fuzzing::generation_config` on arbitrary bytes.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = milkit::fuzzing::generation_config(data);
});
