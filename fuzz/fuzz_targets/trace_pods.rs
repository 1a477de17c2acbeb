//! The trace's pod list (`gpurent sim --pods`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = gpurent_sched::trace::parse_pods(text);
    }
});
