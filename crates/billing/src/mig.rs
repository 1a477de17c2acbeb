//! The default price of a MIG instance: its compute slices' part of the parent GPU's price.

use gpurent_types::{GpuType, Money};

/// A MIG instance's on-demand price per hour when the price file does not list its type:
/// `compute_slices / parent_compute_slices` of the parent model's listed price, rounded down
/// to the micro-unit (a 3g.71gb of a 9.00 H200 costs 3/7 of it, 3.857142). Priced by compute
/// slices rather than memory because the compute slices of any MIG layout add up to at most
/// the whole GPU (7 of 7), so the units of one GPU never sell for more than the card; by
/// memory a 3g.71gb would be 4 of 8 memory slices and 3g.71gb + 2g.35gb + 1g.18gb + 1g.18gb
/// would sell for 8/8 while 3 + 2 + 1 + 1 compute slices is the same card. `None` for a
/// whole GPU's type, or when the parent has no listed price (the caller's per-GB fallback
/// then prices the instance by its own memory).
pub(crate) fn listed_parent_share(
    gpu_type: &GpuType,
    listed: impl Fn(&GpuType) -> Option<Money>,
) -> Option<Money> {
    let slice = gpu_type.mig()?;
    let parent = listed(&slice.parent)?;
    let part = i128::from(parent.micros()) * i128::from(slice.compute_slices)
        / i128::from(slice.parent_compute_slices.max(1));
    Some(Money::from_micros(i64::try_from(part).unwrap_or(i64::MAX)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(name: &str) -> GpuType {
        GpuType::parse(name).unwrap_or_else(|e| panic!("{e}"))
    }

    fn h200_at_9(parent: &GpuType) -> Option<Money> {
        (parent.key() == "h200").then(|| Money::units(9))
    }

    #[test]
    fn a_mig_unit_costs_its_compute_slices_of_the_parent() {
        let price = |name: &str| listed_parent_share(&t(name), h200_at_9).map(|m| m.to_string());
        assert_eq!(price("H200 MIG 3g.71gb").as_deref(), Some("3.857142"));
        assert_eq!(price("H200 MIG 1g.18gb").as_deref(), Some("1.285714"));
        assert_eq!(price("H200 MIG 7g.141gb").as_deref(), Some("9.00"));
        // Not MIG, or a parent without a listed price: the caller decides.
        assert_eq!(price("H200"), None);
        assert_eq!(price("A100-80GB MIG 3g.40gb"), None);
    }

    #[test]
    fn the_price_list_prices_unlisted_mig_units_by_their_parent() {
        let defaults = crate::PriceList::defaults();
        let h200 = defaults.price_per_gpu_hour(&t("H200"), 143_771);
        let unit = defaults.price_per_gpu_hour(&t("H200 MIG 3g.71gb"), 71_680);
        assert_eq!(
            unit,
            listed_parent_share(&t("H200 MIG 3g.71gb"), |_| Some(h200)).unwrap_or_default()
        );
        assert!(unit < h200, "{unit} of {h200}");
        // An owner's price for the MIG type itself wins.
        let listed = crate::PriceList::from_toml("[gpu]\n\"H200 MIG 3g.71gb\" = \"5.00\"\n")
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            listed
                .price_per_gpu_hour(&t("h200 mig 3g.71gb"), 71_680)
                .to_string(),
            "5.00"
        );
    }

    #[test]
    fn the_units_of_a_layout_never_cost_more_than_the_card() {
        // Layouts the MIG user guide allows on a 7-slice GPU.
        let layouts: [&[&str]; 4] = [
            &["3g.71gb", "2g.35gb", "1g.18gb", "1g.18gb"],
            &["4g.71gb", "2g.35gb", "1g.18gb"],
            &["1g.18gb"; 7],
            &["7g.141gb"],
        ];
        for layout in layouts {
            let total = layout
                .iter()
                .filter_map(|p| listed_parent_share(&t(&format!("H200 MIG {p}")), h200_at_9))
                .try_fold(Money::ZERO, Money::checked_add);
            assert!(
                total.is_some_and(|m| m <= Money::units(9) && m > Money::units(8)),
                "{layout:?}: {total:?}"
            );
        }
    }
}
