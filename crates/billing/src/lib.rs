//! Pure pricing and charging rules. No I/O: the store and server call these with the facts.

mod charge;
mod price_list;

pub use charge::{charge_due, charge_for_seconds, share_price_per_hour};
pub use price_list::{PriceList, PriceListError};
