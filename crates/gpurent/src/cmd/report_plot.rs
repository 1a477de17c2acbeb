//! The charts of `gpurent report daily`: the VRAM heat map and the timeline of the server's
//! `report_plot` (shared with the console), each written as PNG and SVG.

use std::path::{Path, PathBuf};

use anyhow::Context;
use gpurent_server::report_plot::{register_font, size, Chart};
use plotters::prelude::*;

use gpurent_types::report::DailyReport;

/// Draws both charts into `dir` as PNG and SVG; returns the files written.
pub fn write(dir: &Path, report: &DailyReport) -> anyhow::Result<Vec<PathBuf>> {
    register_font()?;
    let size = size(report);
    let mut files = Vec::new();
    for chart in [Chart::Heatmap, Chart::Timeline] {
        let name = chart.name();
        let png = dir.join(format!("{name}.png"));
        let cannot = |p: &Path| format!("cannot draw {}", p.display());
        {
            let root = BitMapBackend::new(&png, size).into_drawing_area();
            chart.draw(&root, report).with_context(|| cannot(&png))?;
            root.present().with_context(|| cannot(&png))?;
        }
        let svg = dir.join(format!("{name}.svg"));
        {
            let root = SVGBackend::new(&svg, size).into_drawing_area();
            chart.draw(&root, report).with_context(|| cannot(&svg))?;
            root.present().with_context(|| cannot(&svg))?;
        }
        files.extend([png, svg]);
    }
    Ok(files)
}

#[cfg(test)]
mod tests {
    use chrono::{NaiveDate, TimeZone, Utc};
    use gpurent_types::report::{DayTotals, GpuHourUsage, GpuUsage, TimelineEntry};
    use gpurent_types::{Money, ReservationStatus, Tier};

    use super::*;

    fn report(gpus: u32) -> DailyReport {
        let from = Utc.with_ymd_and_hms(2026, 3, 1, 0, 0, 0).unwrap();
        DailyReport {
            date: NaiveDate::from_ymd_opt(2026, 3, 1).unwrap(),
            from,
            to: from + chrono::Duration::days(1),
            totals: DayTotals {
                gpus,
                gpu_hours: 0.0,
                vram_gb_hours: 0.0,
                revenue: Money::ZERO,
                host_earnings: Money::ZERO,
                allocation_pct: 0.0,
                utilization_pct: None,
            },
            tenants: vec![],
            nodes: vec![],
            gpus: (0..gpus)
                .map(|i| GpuUsage {
                    uuid: format!("GPU-{i}"),
                    node: "box".into(),
                    index: i,
                    model: "RTX 4090".into(),
                    vram_mb: 24_576,
                    gpu_hours: 0.0,
                    vram_gb_hours: 0.0,
                    revenue: Money::ZERO,
                    allocation_pct: 0.0,
                    utilization_pct: None,
                    hours: (0..24)
                        .map(|h| GpuHourUsage {
                            hour: h,
                            allocated_mb: 0,
                            used_mb: (h >= 8 + i).then(|| u64::from(h * 1000 + i * 3000)),
                            used_max_mb: None,
                            utilization_pct: None,
                            samples: u64::from(h >= 8 + i),
                        })
                        .collect(),
                })
                .collect(),
            timeline: (0..gpus)
                .map(|i| TimelineEntry {
                    reservation_id: format!("r{i}-0123456789"),
                    tenant: format!("tenant-{}", i % 2),
                    node: Some("box".into()),
                    gpus: vec![format!("GPU-{i}")],
                    tier: Tier::OnDemand,
                    status: ReservationStatus::Stopped,
                    vram_mb: None,
                    start: from + chrono::Duration::minutes(i64::from(60 * i + 90)),
                    end: from + chrono::Duration::minutes(i64::from(60 * i + 400)),
                    ongoing: false,
                    made_by: None,
                })
                .collect(),
        }
    }

    #[test]
    fn charts_are_drawn_for_an_empty_fleet_and_a_busy_one() {
        for gpus in [0, 3] {
            let dir = tempfile::tempdir().unwrap();
            let files = write(dir.path(), &report(gpus)).unwrap();
            assert_eq!(files.len(), 4);
            for f in files {
                assert!(
                    std::fs::metadata(&f).unwrap().len() > 1000,
                    "{}",
                    f.display()
                );
            }
        }
    }
}
