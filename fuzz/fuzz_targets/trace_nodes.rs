//! The trace's node list (`gpurent sim --nodes`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = gpurent_sched::trace::parse_nodes(text);
    }
});
