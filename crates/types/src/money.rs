//! Money as integer micro-units, shown and parsed as decimal strings ("2.50").

use std::fmt;
use std::str::FromStr;

use rust_decimal::Decimal;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Micro-units per unit of currency: money has at most 6 decimals.
pub const MICROS_PER_UNIT: i64 = 1_000_000;
/// The most digits before the point an amount may be written with (the schema's `{1,12}`).
const MAX_UNIT_DIGITS: usize = 12;

/// An amount of money in micro-units of the platform currency. Never a float.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Money(i64);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MoneyError {
    #[error("{0:?} is not a decimal amount (expected something like \"2.50\")")]
    NotDecimal(String),
    #[error("{0:?} has more than 6 decimals")]
    TooPrecise(String),
    #[error("{0:?} is out of range")]
    OutOfRange(String),
}

impl Money {
    pub const ZERO: Money = Money(0);

    pub const fn from_micros(micros: i64) -> Self {
        Money(micros)
    }

    pub const fn micros(self) -> i64 {
        self.0
    }

    /// Whole units, for defaults written in code: `Money::units(2)` is 2.00.
    pub const fn units(units: i64) -> Self {
        Money(units * MICROS_PER_UNIT)
    }

    pub fn checked_add(self, other: Money) -> Option<Money> {
        self.0.checked_add(other.0).map(Money)
    }

    pub fn checked_sub(self, other: Money) -> Option<Money> {
        self.0.checked_sub(other.0).map(Money)
    }

    pub fn checked_mul(self, n: i64) -> Option<Money> {
        self.0.checked_mul(n).map(Money)
    }

    pub fn is_negative(self) -> bool {
        self.0 < 0
    }

    pub fn to_decimal(self) -> Decimal {
        Decimal::new(self.0, 6)
    }
}

impl FromStr for Money {
    type Err = MoneyError;

    /// Exactly the schema's form, `^-?[0-9]{1,12}(\.[0-9]{1,6})?$`: no sign but a minus, no
    /// spaces, no bare or trailing point, no exponent, at most six decimals.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let not_decimal = || MoneyError::NotDecimal(s.to_owned());
        let (negative, digits) = match s.strip_prefix('-') {
            Some(rest) => (true, rest),
            None => (false, s),
        };
        let (units, frac) = match digits.split_once('.') {
            Some((units, frac)) => (units, Some(frac)),
            None => (digits, None),
        };
        let all_digits = |t: &str| !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit());
        if !all_digits(units) || frac.is_some_and(|f| !all_digits(f)) {
            return Err(not_decimal());
        }
        let frac = frac.unwrap_or("");
        if frac.len() > 6 {
            return Err(MoneyError::TooPrecise(s.to_owned()));
        }
        if units.len() > MAX_UNIT_DIGITS {
            return Err(MoneyError::OutOfRange(s.to_owned()));
        }
        // Twelve digits of units and six of micros fit an i64 with room to spare.
        let parse = |t: &str| t.parse::<i64>().map_err(|_| not_decimal());
        let micros = parse(units)? * MICROS_PER_UNIT
            + if frac.is_empty() {
                0
            } else {
                parse(frac)? * 10i64.pow(6 - u32::try_from(frac.len()).unwrap_or(6))
            };
        Ok(Money(if negative { -micros } else { micros }))
    }
}

impl fmt::Display for Money {
    /// At least two decimals, at most six, no trailing zeros beyond the second: "2.50", "0.006944".
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sign = if self.0 < 0 { "-" } else { "" };
        let abs = self.0.unsigned_abs();
        let units = abs / MICROS_PER_UNIT.unsigned_abs();
        let frac = abs % MICROS_PER_UNIT.unsigned_abs();
        let mut digits = format!("{frac:06}");
        while digits.len() > 2 && digits.ends_with('0') {
            digits.pop();
        }
        write!(f, "{sign}{units}.{digits}")
    }
}

impl Serialize for Money {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Money {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

impl utoipa::PartialSchema for Money {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        utoipa::openapi::ObjectBuilder::new()
            .schema_type(utoipa::openapi::schema::Type::String)
            .description(Some(
                "Decimal amount with at most 6 decimals, e.g. \"2.50\"",
            ))
            .pattern(Some(r"^-?[0-9]{1,12}(\.[0-9]{1,6})?$"))
            .examples([serde_json::json!("2.50")])
            .into()
    }
}

impl utoipa::ToSchema for Money {}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_and_formats() {
        assert_eq!("2.50".parse::<Money>(), Ok(Money(2_500_000)));
        assert_eq!("2.5".parse::<Money>(), Ok(Money(2_500_000)));
        assert_eq!("100".parse::<Money>(), Ok(Money(100_000_000)));
        assert_eq!("0.000001".parse::<Money>(), Ok(Money(1)));
        assert_eq!("-1.25".parse::<Money>(), Ok(Money(-1_250_000)));
        assert_eq!(Money(2_500_000).to_string(), "2.50");
        assert_eq!(Money(6_944).to_string(), "0.006944");
        assert_eq!(Money(100_000_000).to_string(), "100.00");
        assert_eq!(Money(-1_250_000).to_string(), "-1.25");
        assert_eq!("007.10".parse::<Money>(), Ok(Money(7_100_000)));
        assert_eq!(
            "999999999999.999999".parse::<Money>(),
            Ok(Money(999_999_999_999_999_999))
        );
    }

    #[test]
    fn rejects_what_is_not_money() {
        assert!(matches!(
            "0.0000001".parse::<Money>(),
            Err(MoneyError::TooPrecise(_))
        ));
        assert!(matches!(
            "1e3".parse::<Money>(),
            Err(MoneyError::NotDecimal(_))
        ));
        assert!(matches!(
            "abc".parse::<Money>(),
            Err(MoneyError::NotDecimal(_))
        ));
        assert!(matches!(
            "".parse::<Money>(),
            Err(MoneyError::NotDecimal(_))
        ));
        assert!(matches!(
            "99999999999999999".parse::<Money>(),
            Err(MoneyError::OutOfRange(_))
        ));
        // What the schema's pattern forbids, though a decimal parser would take it.
        for bad in [
            "+5",
            " 5",
            "5 ",
            "5.",
            ".5",
            "-",
            "-.5",
            "1.5000000",
            "1_000",
            "٣",
            "5\n",
            "--5",
        ] {
            assert!(bad.parse::<Money>().is_err(), "{bad:?}");
        }
    }

    proptest! {
        #[test]
        fn display_then_parse_round_trips(micros in -999_999_999_999_999_999i64..=999_999_999_999_999_999) {
            let m = Money(micros);
            prop_assert_eq!(m.to_string().parse::<Money>(), Ok(m));
        }
    }
}
