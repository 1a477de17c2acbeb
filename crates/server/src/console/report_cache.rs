//! Daily reports the admin pages show, kept for a few seconds: the fleet page refreshes every
//! 2 s and the reports page draws its two charts from the same report, while a report reads
//! the whole day from the store.

use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

use gpurent_store::Store;
use gpurent_types::report::DailyReport;

use super::api::{enc, Api, Failure};
use crate::state::AppState;

/// How long a report is reused: revenue shown at most this late.
pub(crate) const KEEP: Duration = Duration::from_secs(15);
/// Reports kept at once (dates, across control planes in one process).
const MOST: usize = 8;

/// A report as one control plane (its store, held weakly so that its address cannot be
/// another's: tests run several in one process) gave it.
struct Kept {
    store: Weak<dyn Store>,
    date: String,
    at: Instant,
    report: Arc<DailyReport>,
}

static KEPT: Mutex<Vec<Kept>> = Mutex::new(Vec::new());

/// The daily report of `date`, from the API (as the viewer, an admin) or reused.
pub(crate) async fn daily(
    state: &AppState,
    api: &Api,
    date: &str,
) -> Result<Arc<DailyReport>, Failure> {
    let store = Arc::downgrade(&state.store);
    {
        let mut kept = KEPT.lock().unwrap_or_else(PoisonError::into_inner);
        kept.retain(|k| k.at.elapsed() < KEEP && k.store.strong_count() > 0);
        if let Some(k) = kept
            .iter()
            .find(|k| Weak::ptr_eq(&k.store, &store) && k.date == date)
        {
            return Ok(Arc::clone(&k.report));
        }
    }
    let report: Arc<DailyReport> = Arc::new(
        api.get(&format!("/api/v1/reports/daily?date={}", enc(date)))
            .await?,
    );
    let mut kept = KEPT.lock().unwrap_or_else(PoisonError::into_inner);
    if kept.len() >= MOST {
        kept.remove(0);
    }
    kept.push(Kept {
        store,
        date: date.to_owned(),
        at: Instant::now(),
        report: Arc::clone(&report),
    });
    Ok(report)
}
