//! Report windows: a UTC day or ISO week from the query, and the seconds of an interval that
//! fall in a window and in each of its hours.

use chrono::{DateTime, Datelike, Duration, NaiveDate, Utc, Weekday};

/// A window the query asked for that is not one; each message starts with the field's name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum WindowError {
    #[error("{field}: {value:?} is not YYYY-MM-DD")]
    Date { field: &'static str, value: String },
    #[error("week: {0:?} is not an ISO week YYYY-Www")]
    Week(String),
    #[error("week: give either week or from, not both")]
    Both,
}

/// Seven UTC days, [from, to), and the ISO week's name when they are one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Week {
    pub name: Option<String>,
    pub from: DateTime<Utc>,
    pub to: DateTime<Utc>,
}

/// The UTC day `YYYY-MM-DD` as [from, to).
pub(crate) fn day(date: &str) -> Result<(NaiveDate, DateTime<Utc>, DateTime<Utc>), WindowError> {
    let d = NaiveDate::parse_from_str(date, "%Y-%m-%d")
        .ok()
        .filter(|_| date.len() == 10)
        .ok_or_else(|| WindowError::Date {
            field: "date",
            value: date.to_owned(),
        })?;
    let from = midnight(d);
    Ok((d, from, from + Duration::days(1)))
}

/// Seven days from a date, or the ISO week `YYYY-Www`, or (neither) the last whole ISO week
/// before `now`.
pub(crate) fn week(
    week: Option<&str>,
    from: Option<&str>,
    now: DateTime<Utc>,
) -> Result<Week, WindowError> {
    let start = match (week, from) {
        (Some(_), Some(_)) => return Err(WindowError::Both),
        (None, Some(from)) => {
            let (_, start, _) = day(from).map_err(|_| WindowError::Date {
                field: "from",
                value: from.to_owned(),
            })?;
            start
        }
        (Some(w), None) => midnight(parse_iso_week(w)?),
        (None, None) => {
            let today = now.date_naive();
            let monday = today - Duration::days(i64::from(today.weekday().num_days_from_monday()));
            midnight(monday - Duration::days(7))
        }
    };
    let d = start.date_naive();
    let iso = d.iso_week();
    let name =
        (d.weekday() == Weekday::Mon).then(|| format!("{:04}-W{:02}", iso.year(), iso.week()));
    Ok(Week {
        name,
        from: start,
        to: start + Duration::days(7),
    })
}

fn parse_iso_week(w: &str) -> Result<NaiveDate, WindowError> {
    let bad = || WindowError::Week(w.to_owned());
    let (year, week) = w.split_once("-W").ok_or_else(bad)?;
    if year.len() != 4 || week.len() != 2 {
        return Err(bad());
    }
    let year: i32 = year.parse().map_err(|_| bad())?;
    let week: u32 = week.parse().map_err(|_| bad())?;
    NaiveDate::from_isoywd_opt(year, week, Weekday::Mon).ok_or_else(bad)
}

fn midnight(d: NaiveDate) -> DateTime<Utc> {
    d.and_time(chrono::NaiveTime::MIN).and_utc()
}

/// Whole seconds of [start, end) within [from, to), as (first, last) unix seconds; `None`
/// when they do not meet.
pub(crate) fn clip(start: i64, end: i64, from: i64, to: i64) -> Option<(i64, i64)> {
    let (s, e) = (start.max(from), end.min(to));
    (s < e).then_some((s, e))
}

/// The seconds of [start, end) in each hour of the `hours` hours from `from` (unix seconds).
pub(crate) fn per_hour(start: i64, end: i64, from: i64, hours: usize) -> Vec<i64> {
    (0..hours)
        .map(|h| {
            let h0 = from + 3600 * i64::try_from(h).unwrap_or(i64::MAX / 3600 - 1);
            clip(start, end, h0, h0 + 3600).map_or(0, |(s, e)| e - s)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone;
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn a_day_is_midnight_to_midnight_and_bad_dates_name_the_field() {
        let (d, from, to) = day("2026-03-01").unwrap();
        assert_eq!(d.to_string(), "2026-03-01");
        assert_eq!(from, Utc.with_ymd_and_hms(2026, 3, 1, 0, 0, 0).unwrap());
        assert_eq!(to, Utc.with_ymd_and_hms(2026, 3, 2, 0, 0, 0).unwrap());
        for bad in [
            "2026-02-30",
            "2026-3-1",
            "yesterday",
            "2026-03-01T00:00:00Z",
        ] {
            assert!(
                day(bad).unwrap_err().to_string().starts_with("date:"),
                "{bad}"
            );
        }
    }

    #[test]
    fn weeks_by_name_by_start_and_by_default() {
        let now = Utc.with_ymd_and_hms(2026, 3, 4, 10, 0, 0).unwrap(); // a Wednesday, W10
        let w9 = week(Some("2026-W09"), None, now).unwrap();
        assert_eq!(w9.name.as_deref(), Some("2026-W09"));
        assert_eq!(w9.from, Utc.with_ymd_and_hms(2026, 2, 23, 0, 0, 0).unwrap());
        assert_eq!(w9.to - w9.from, Duration::days(7));
        assert_eq!(week(None, None, now).unwrap(), w9);
        let w = week(None, Some("2026-03-04"), now).unwrap();
        assert_eq!(
            (w.name, w.from),
            (None, Utc.with_ymd_and_hms(2026, 3, 4, 0, 0, 0).unwrap())
        );
        let message = |r: Result<Week, WindowError>| r.unwrap_err().to_string();
        assert!(message(week(Some("2026-W54"), None, now)).starts_with("week:"));
        assert!(message(week(None, Some("2026-13-01"), now)).starts_with("from:"));
        assert_eq!(
            week(Some("2026-W09"), Some("2026-03-04"), now),
            Err(WindowError::Both)
        );
    }

    #[test]
    fn half_past_ten_to_noon_is_half_an_hour_then_a_whole_one() {
        let hours = per_hour(10 * 3600 + 1800, 12 * 3600, 0, 24);
        assert_eq!(
            (hours[9], hours[10], hours[11], hours[12]),
            (0, 1800, 3600, 0)
        );
        assert_eq!(hours.iter().sum::<i64>(), 5400);
    }

    proptest! {
        #[test]
        fn the_hours_add_up_to_the_clipped_interval(
            start in -200_000i64..200_000, len in 0i64..200_000
        ) {
            let end = start + len;
            let hours = per_hour(start, end, 0, 24);
            let clipped = clip(start, end, 0, 86_400).map_or(0, |(s, e)| e - s);
            prop_assert_eq!(hours.iter().sum::<i64>(), clipped);
            prop_assert!(hours.iter().all(|&s| (0..=3600).contains(&s)));
        }
    }
}
