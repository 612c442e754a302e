//! libFuzzer target: `milkit::fuzzing::pytorch` on arbitrary bytes.
//!
//! milkit catches the panic candle's pickle reader raises on some malformed pickles and
//! reports an error; libfuzzer-sys's panic hook would abort on that caught panic, so this
//! target installs a silent hook. A panic milkit does not catch still reaches
//! libfuzzer-sys's own catch and aborts: still a finding.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| std::panic::set_hook(Box::new(|_| {})));
    let _ = milkit::fuzzing::pytorch(data);
});
