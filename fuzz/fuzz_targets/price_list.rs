//! Price plans (`--prices FILE`): TOML into a `PriceList`, then a price looked up from it.
#![no_main]

use gpurent_billing::PriceList;
use gpurent_types::GpuType;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(list) = PriceList::from_toml(text) {
            if let Ok(t) = GpuType::parse("RTX 4090") {
                let _ = list.price_per_gpu_hour(&t, 24 * 1024);
                let _ = list.price_per_gpu_hour(&t, 0);
            }
        }
    }
});
