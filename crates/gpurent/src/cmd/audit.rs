//! `gpurent audit verify|ls|export`: the audit trail through the API (admin).

use std::io::Write;

use chrono::{DateTime, NaiveDate, Utc};
use gpurent_types::api::{AuditPage, AuditRecord, AuditVerdict};

use crate::api_client::{ApiClient, CliError};
use crate::cli::{AuditCommand, AuditFilterArgs};
use crate::output::{print_json, print_line, print_table};

/// Records asked for per request by `export`.
const PAGE: u32 = 1000;

pub async fn run(api: &ApiClient, command: AuditCommand, json: bool) -> Result<(), CliError> {
    match command {
        AuditCommand::Verify => verify(api, json).await,
        AuditCommand::Ls(filter) => {
            let limit = filter.limit.clamp(1, PAGE);
            let page: AuditPage = api.get(&query(&filter, 0, limit)?).await?;
            if json {
                return print_json(&page.records);
            }
            print_table(
                &[
                    "SEQ", "AT", "USER", "ACTION", "RESOURCE", "OUTCOME", "CLIENT", "GPUS",
                ],
                &rows(&page.records),
            );
            Ok(())
        }
        AuditCommand::Export { filter, out } => {
            let mut sink: Box<dyn Write> = match &out {
                Some(path) => Box::new(std::io::BufWriter::new(
                    std::fs::File::create(path).map_err(|e| {
                        CliError::new("io_error", format!("cannot write {}: {e}", path.display()))
                    })?,
                )),
                None => Box::new(std::io::stdout().lock()),
            };
            let mut after = 0;
            let mut written = 0u64;
            loop {
                let page: AuditPage = api.get(&query(&filter, after, PAGE)?).await?;
                for r in &page.records {
                    let line = serde_json::to_string(r)
                        .map_err(|e| CliError::new("internal", e.to_string()))?;
                    writeln!(sink, "{line}")
                        .map_err(|e| CliError::new("io_error", e.to_string()))?;
                }
                written += u64::try_from(page.records.len()).unwrap_or(0);
                match page.next_after {
                    Some(next) => after = next,
                    None => break,
                }
            }
            sink.flush()
                .map_err(|e| CliError::new("io_error", e.to_string()))?;
            if let Some(path) = out {
                eprintln!("{written} records written to {}", path.display());
            }
            Ok(())
        }
    }
}

async fn verify(api: &ApiClient, json: bool) -> Result<(), CliError> {
    let verdict: AuditVerdict = api.get("/api/v1/audit/verify").await?;
    if json {
        print_json(&serde_json::json!({
            "ok": verdict.ok,
            "records": verdict.records,
            "checkpoints": verdict.checkpoints,
            "first_bad": verdict.first_bad,
            "public_key": verdict.public_key,
        }))?;
    } else {
        match &verdict.first_bad {
            None => print_line(&format!(
                "ok: {} records, {} signed checkpoints matched (key {})",
                verdict.records, verdict.checkpoints, verdict.public_key
            )),
            Some(bad) => print_line(&format!(
                "BROKEN at record {} ({}): {}",
                bad.seq, bad.problem, bad.message
            )),
        }
    }
    if !verdict.ok {
        // Exit 1 with the verdict already printed: not an error of the command.
        std::process::exit(1);
    }
    Ok(())
}

/// A time as the API takes it: RFC 3339, or a UTC day's midnight.
fn time(what: &str, text: &str) -> Result<String, CliError> {
    if let Ok(t) = DateTime::parse_from_rfc3339(text) {
        return Ok(t.with_timezone(&Utc).to_rfc3339());
    }
    NaiveDate::parse_from_str(text, "%Y-%m-%d")
        .ok()
        .and_then(|d| d.and_hms_opt(0, 0, 0))
        .map(|t| t.and_utc().to_rfc3339())
        .ok_or_else(|| {
            CliError::new(
                "invalid_value",
                format!("--{what}: {text:?} is neither RFC 3339 nor YYYY-MM-DD"),
            )
        })
}

fn query(filter: &AuditFilterArgs, after: u64, limit: u32) -> Result<String, CliError> {
    let mut params = vec![format!("after={after}"), format!("limit={limit}")];
    let from = filter
        .from
        .as_deref()
        .map(|t| time("from", t))
        .transpose()?;
    let to = filter.to.as_deref().map(|t| time("to", t)).transpose()?;
    for (key, value) in [
        ("user", filter.user.clone()),
        ("resource", filter.resource.clone()),
        ("from", from),
        ("to", to),
    ] {
        if let Some(v) = value {
            params.push(format!("{key}={}", super::client::segment(&v)));
        }
    }
    Ok(format!("/api/v1/audit?{}", params.join("&")))
}

fn rows(records: &[AuditRecord]) -> Vec<Vec<String>> {
    records
        .iter()
        .map(|r| {
            vec![
                r.seq.to_string(),
                r.at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
                r.user_id.clone().unwrap_or_else(|| "-".to_owned()),
                r.action.clone(),
                r.resource.clone(),
                r.outcome.to_string(),
                r.client.clone(),
                r.allocation.clone().unwrap_or_default(),
            ]
        })
        .collect()
}
