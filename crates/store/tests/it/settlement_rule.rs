//! The settlement's charge, computed by the database in SQL, is `Rate::charge_for_seconds`:
//! for random rates (flat and stepped), hours and seconds run, on SQLite and PostgreSQL, the
//! statement's own expression gives the same charge, the same price for the next period, and
//! the same host's part (`gpurent_billing::ending::host_part`). A change to either side alone
//! fails here.

use gpurent_billing::ending::host_part;
use gpurent_billing::Rate;
use gpurent_store::{Backend, SqlStore};
use gpurent_types::Money;
use proptest::prelude::*;

use crate::support::Fixture;

/// Rates, hours and seconds within them, as meters have them (prices up to 100 per hour,
/// up to a year reserved).
fn cases() -> impl Strategy<Value = Vec<(Rate, u64, u64, u32)>> {
    let case = (
        0i64..100_000_000,
        0i64..100_000_000,
        prop::option::of(0u64..400_000),
        1u64..31_622_400,
        0u64..=10_000,
        0u32..=10_000,
    )
        .prop_map(|(first, then, step, duration_s, part, bps)| {
            let rate = match step {
                Some(step_s) => Rate {
                    first: Money::from_micros(first),
                    step_s,
                    then: Money::from_micros(then),
                },
                None => Rate::flat(Money::from_micros(first)),
            };
            // Seconds anywhere in its hours, the step's edges and the end included.
            let seconds = match part {
                0 => 0,
                10_000 => duration_s,
                9_999 => rate.step_s.min(duration_s),
                p => duration_s * p / 10_000,
            };
            (rate, duration_s, seconds, bps)
        });
    proptest::collection::vec(case, 64)
}

async fn check(store: &SqlStore, cases: &[(Rate, u64, u64, u32)]) {
    for (rate, duration_s, seconds, bps) in cases {
        let (charge, rate_now, host) = store
            .settlement_charge(rate, *duration_s, *seconds, *bps)
            .await
            .expect("evaluate the settlement's SQL");
        assert_eq!(
            charge,
            rate.charge_for_seconds(*seconds),
            "the settlement charges {rate:?} for {seconds} s of {duration_s} s unlike the rule"
        );
        assert_eq!(
            host,
            host_part(charge, *bps),
            "the settlement's host part of {charge} at {bps} bps is unlike the rule"
        );
        if seconds < duration_s {
            assert_eq!(
                rate_now,
                rate.per_hour_after(*seconds),
                "the settlement prices the next period of {rate:?} after {seconds} s unlike the rule"
            );
        }
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn run(backend: Backend, batches: Vec<Vec<(Rate, u64, u64, u32)>>) {
    runtime().block_on(async {
        let f = Fixture::new(backend).await;
        for batch in &batches {
            check(&f.store, batch).await;
        }
        f.store.close().await;
    });
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 4, ..ProptestConfig::default() })]

    #[test]
    fn the_settlement_sql_charges_as_the_rule_on_sqlite(batches in proptest::collection::vec(cases(), 4)) {
        run(Backend::Sqlite, batches);
    }

    #[test]
    fn the_settlement_sql_charges_as_the_rule_on_postgres(batches in proptest::collection::vec(cases(), 4)) {
        run(Backend::Postgres, batches);
    }
}
