//! `POST /api/v1/reservations` bodies: JSON into `CreateReservation`, then the money and
//! GPU-type parsing the server's validation does (the validation itself is private to the
//! server crate; this covers the parsers it relies on).
#![no_main]

use gpurent_types::api::CreateReservation;
use gpurent_types::{GpuType, Money};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(body) = serde_json::from_slice::<CreateReservation>(data) {
        let _ = GpuType::parse(&body.gpu_type);
        // What validation does with the hours: bounded there, so only finite values matter.
        if body.hours.is_finite() && body.hours > 0.0 && body.hours <= 8760.0 {
            let _ = (body.hours * 3600.0).round();
        }
        // A body that parsed serialises again (request hashes for idempotency).
        let _ = serde_json::to_vec(&body);
    }
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(m) = text.parse::<Money>() {
            // Money round-trips through its text form.
            let again: Money = m
                .to_string()
                .parse()
                .unwrap_or_else(|e| panic!("{m} does not parse again: {e}"));
            assert_eq!(m, again);
        }
        if let Ok(t) = GpuType::parse(text) {
            let again = GpuType::parse(&t.to_string())
                .unwrap_or_else(|e| panic!("{t} does not parse again: {e}"));
            assert_eq!(t, again);
        }
    }
});
