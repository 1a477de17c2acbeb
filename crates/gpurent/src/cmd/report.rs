//! `gpurent report daily|weekly`: fetches a usage report from the API and writes its files
//! (CSV, JSON, charts) or prints its table.

use std::path::{Path, PathBuf};

use gpurent_types::report::{DailyReport, WeeklyReport};
use serde::Serialize;

use super::{report_csv, report_plot};
use crate::api_client::{ApiClient, CliError};
use crate::cli::ReportCommand;
use crate::output::{print_json, print_line, print_table};

/// What `--json` prints: the files written.
#[derive(Debug, Serialize)]
struct Files {
    files: Vec<String>,
}

fn cannot(path: &Path, e: impl std::fmt::Display) -> CliError {
    CliError::new("io_error", format!("cannot write {}: {e}", path.display()))
}

fn write(dir: &Path, name: &str, text: &str, files: &mut Vec<PathBuf>) -> Result<(), CliError> {
    let path = dir.join(name);
    std::fs::write(&path, text).map_err(|e| cannot(&path, e))?;
    files.push(path);
    Ok(())
}

fn create(dir: &Path) -> Result<(), CliError> {
    std::fs::create_dir_all(dir).map_err(|e| cannot(dir, e))
}

fn opt_pct(p: Option<f64>) -> String {
    p.map_or_else(|| "-".to_owned(), |p| format!("{p:.1}%"))
}

pub async fn run(api: &ApiClient, command: ReportCommand, json: bool) -> Result<(), CliError> {
    match command {
        ReportCommand::Daily { date, out } => {
            let report: DailyReport = api
                .get(&format!("/api/v1/reports/daily?date={date}"))
                .await?;
            create(&out)?;
            let mut files = Vec::new();
            write(
                &out,
                "tenants.csv",
                &report_csv::tenants(&report),
                &mut files,
            )?;
            write(&out, "nodes.csv", &report_csv::nodes(&report), &mut files)?;
            write(&out, "gpus.csv", &report_csv::gpus(&report), &mut files)?;
            write(
                &out,
                "gpu-hours.csv",
                &report_csv::gpu_hours(&report),
                &mut files,
            )?;
            let text = serde_json::to_string_pretty(&report)
                .map_err(|e| CliError::new("bad_response", e.to_string()))?;
            write(&out, "report.json", &text, &mut files)?;
            files.extend(
                report_plot::write(&out, &report)
                    .map_err(|e| CliError::new("io_error", format!("{e:#}")))?,
            );
            let files: Vec<String> = files.iter().map(|f| f.display().to_string()).collect();
            if json {
                return print_json(&Files { files });
            }
            let t = &report.totals;
            print_line(&format!(
                "{} (UTC): {} GPU-hours of {} GPUs ({:.1}% allocated), {} GB-hours of VRAM, revenue {}, utilisation {}",
                report.date,
                t.gpu_hours,
                t.gpus,
                t.allocation_pct,
                t.vram_gb_hours,
                t.revenue,
                opt_pct(t.utilization_pct)
            ));
            let rows: Vec<Vec<String>> = report
                .tenants
                .iter()
                .map(|t| {
                    vec![
                        t.tenant.clone(),
                        t.reservations.to_string(),
                        t.gpu_hours.to_string(),
                        t.vram_gb_hours.to_string(),
                        t.revenue.to_string(),
                        opt_pct(t.utilization_pct),
                    ]
                })
                .collect();
            print_table(
                &[
                    "TENANT",
                    "RESERVATIONS",
                    "GPU-HOURS",
                    "VRAM-GB-HOURS",
                    "REVENUE",
                    "UTILISATION",
                ],
                &rows,
            );
            print_line(&format!("wrote {} files to {}", files.len(), out.display()));
            Ok(())
        }
        ReportCommand::Weekly { week, from, out } => {
            let query = match (week, from) {
                (Some(w), _) => format!("?week={w}"),
                (None, Some(d)) => format!("?from={d}"),
                (None, None) => String::new(),
            };
            let report: WeeklyReport = api.get(&format!("/api/v1/reports/weekly{query}")).await?;
            let mut files = Vec::new();
            if let Some(dir) = &out {
                create(dir)?;
                write(dir, "weekly.csv", &report_csv::weekly(&report), &mut files)?;
                let text = serde_json::to_string_pretty(&report)
                    .map_err(|e| CliError::new("bad_response", e.to_string()))?;
                write(dir, "weekly.json", &text, &mut files)?;
            }
            if json {
                return print_json(&report);
            }
            let span = format!(
                "{} to {} (UTC, the end excluded)",
                report.from.format("%Y-%m-%d"),
                report.to.format("%Y-%m-%d")
            );
            print_line(&match &report.week {
                Some(week) => format!("{week}: {span}"),
                None => span,
            });
            let rows: Vec<Vec<String>> = report
                .tiers
                .iter()
                .chain([&report.total])
                .map(|t| {
                    vec![
                        t.tier.map_or_else(|| "total".to_owned(), |t| t.to_string()),
                        t.reservations.to_string(),
                        t.gpu_hours.to_string(),
                        t.charged.to_string(),
                        t.price_per_gpu_hour
                            .map_or_else(|| "-".to_owned(), |p| p.to_string()),
                        t.preemptions.to_string(),
                        t.host_earnings.to_string(),
                        t.platform_return.to_string(),
                    ]
                })
                .collect();
            print_table(
                &[
                    "TIER",
                    "RESERVATIONS",
                    "GPU-HOURS",
                    "CHARGED",
                    "PER-GPU-HOUR",
                    "PREEMPTIONS",
                    "HOSTS",
                    "RETURN",
                ],
                &rows,
            );
            for f in &files {
                print_line(&format!("wrote {}", f.display()));
            }
            Ok(())
        }
    }
}
