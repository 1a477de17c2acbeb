//! Daily reports the admin pages show, kept for a few seconds: the fleet page refreshes every
//! 2 s and the reports page draws its two charts from the same report, while a report reads
//! the whole day from the store.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use gpurent_types::report::DailyReport;

use super::api::{enc, Api, Failure};
use crate::state::AppState;

/// How long a report is reused: revenue shown at most this late.
pub(crate) const KEEP: Duration = Duration::from_secs(15);
/// Reports kept at once (dates).
const MOST: usize = 8;

/// This control plane's recent daily reports (`AppState::console_reports`).
#[derive(Debug, Default)]
pub struct ReportCache {
    kept: Mutex<Vec<(String, Instant, Arc<DailyReport>)>>,
}

/// The daily report of `date`, from the API (as the viewer, an admin) or reused.
pub(crate) async fn daily(
    state: &AppState,
    api: &Api,
    date: &str,
) -> Result<Arc<DailyReport>, Failure> {
    let cache = &state.console_reports;
    {
        let mut kept = cache.kept.lock().unwrap_or_else(PoisonError::into_inner);
        kept.retain(|(_, at, _)| at.elapsed() < KEEP);
        if let Some((_, _, report)) = kept.iter().find(|(d, _, _)| d == date) {
            return Ok(Arc::clone(report));
        }
    }
    let report: Arc<DailyReport> = Arc::new(
        api.get(&format!("/api/v1/reports/daily?date={}", enc(date)))
            .await?,
    );
    let mut kept = cache.kept.lock().unwrap_or_else(PoisonError::into_inner);
    if kept.len() >= MOST {
        kept.remove(0);
    }
    kept.push((date.to_owned(), Instant::now(), Arc::clone(&report)));
    Ok(report)
}
