//! Where an owner's price file contradicts itself: a share that costs more than its card.
//! The server warns of each at start-up; the defaults have none.

use gpurent_types::Money;

use crate::price_list::{known_models, PriceList};

/// What to do about either: derived share prices stop at the card's.
const FIX: &str = "without per_gb_hour a share costs its fraction of the card's price, plus [shares] premium_percent";

/// A share priced above its whole card (only an explicit `[shares] per_gb_hour` can do that).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Incoherence {
    #[error("a share of all {gb} GB of one {model} costs {share}/h at [shares] per_gb_hour = \"{per_gb}\", more than the whole card's {card}/h ({FIX})")]
    Listed {
        model: String,
        gb: u32,
        share: Money,
        card: Money,
        per_gb: Money,
    },
    #[error("[shares] per_gb_hour = \"{per_gb}\" is more than a whole card costs per GB of the models not under [gpu] ({fallback}): their shares cost more than the card ({FIX})")]
    Unlisted { per_gb: Money, fallback: Money },
}

impl PriceList {
    /// Every model whose share, at its largest, costs more than its whole card: the listed
    /// models gpurent knows the memory of, and the unlisted ones (priced per GB).
    pub fn incoherences(&self) -> Vec<Incoherence> {
        let Some(per_gb) = self.share_per_gb_hour else {
            return Vec::new();
        };
        let mut found: Vec<Incoherence> = known_models()
            .filter(|(t, _)| self.is_listed(t))
            .filter_map(|(t, gb)| {
                let card = self.price_per_gpu_hour(&t, u64::from(gb) * 1024);
                let share = per_gb.checked_mul(i64::from(gb))?;
                (share > card).then(|| Incoherence::Listed {
                    model: t.to_string(),
                    gb,
                    share,
                    card,
                    per_gb,
                })
            })
            .collect();
        let fallback = self.per_gb_hour_fallback();
        if per_gb > fallback {
            found.push(Incoherence::Unlisted { per_gb, fallback });
        }
        found
    }
}
