//! What a node agent sends on every sync: JSON into `SyncRequest`.
#![no_main]

use gpurent_types::agent::SyncRequest;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(req) = serde_json::from_slice::<SyncRequest>(data) {
        let _ = serde_json::to_vec(&req);
    }
});
