//! Pure pricing and charging rules. No I/O: the store and server call these with the facts.

mod charge;
mod mig;
mod price_list;
mod quote;
mod rate;

pub use charge::charge_for_seconds;
pub use price_list::{PriceList, PriceListError, Stepped};
pub use quote::{Quote, QuoteError, Size};
pub use rate::Rate;
