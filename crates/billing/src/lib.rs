//! Pure pricing and charging rules. No I/O: the store and server call these with the facts.

pub mod budget;
mod charge;
mod coherence;
pub mod ending;
mod mig;
mod price_list;
mod quote;
mod rate;
mod storage;

#[cfg(test)]
mod golden;

pub use charge::charge_for_seconds;
pub use coherence::Incoherence;
pub use price_list::{PriceList, PriceListError, Stepped, DEFAULT_CURRENCY};
pub use quote::{Quote, QuoteError, Size};
pub use rate::Rate;
pub use storage::{storage_charge, storage_due, BYTES_PER_GB, SECONDS_PER_MONTH};
