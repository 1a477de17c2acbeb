//! The audit verifier on arbitrary records and checkpoints (an exported trail, JSON lines:
//! the first line the checkpoints, the rest records).
#![no_main]

use gpurent_audit::{Checkpoint, Record, Verifier};
use libfuzzer_sys::fuzz_target;

const KEY: &str = "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a";

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let mut lines = text.lines();
    let checkpoints: Vec<Checkpoint> = lines
        .next()
        .and_then(|l| serde_json::from_str(l).ok())
        .unwrap_or_default();
    let anchor = checkpoints.first().cloned();
    let mut v = Verifier::new(KEY, checkpoints, anchor.as_ref());
    let mut last = None;
    for line in lines {
        if let Ok(r) = serde_json::from_str::<Record>(line) {
            v.push(&r);
            last = Some((r.seq, r.hash));
        }
    }
    let verdict = v.finish(last.as_ref().map(|(s, h)| (*s, h.as_str())));
    let _ = serde_json::to_string(&verdict);
});
