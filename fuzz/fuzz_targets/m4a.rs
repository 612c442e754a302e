//! libFuzzer target: `milkit::fuzzing::m4a` on arbitrary bytes.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = milkit::fuzzing::m4a(data);
});
