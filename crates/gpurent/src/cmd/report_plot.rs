//! The charts of `gpurent report daily`: a VRAM heat map (GPU x hour) and a timeline of the
//! reservations on each GPU, each as PNG and SVG, drawn with the embedded font of `sim_plot`.

use std::path::{Path, PathBuf};

use anyhow::Context;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use gpurent_types::report::DailyReport;

use super::sim_plot::{register_font, COLOURS, FAMILY};

const WIDTH: u32 = 1200;
const NO_SAMPLES: RGBColor = RGBColor(225, 225, 225);

type Drawn<DB> = Result<(), DrawingAreaErrorKind<<DB as DrawingBackend>::ErrorType>>;

/// Draws both charts into `dir` as PNG and SVG; returns the files written.
pub fn write(dir: &Path, report: &DailyReport) -> anyhow::Result<Vec<PathBuf>> {
    register_font()?;
    let rows = u32::try_from(report.gpus.len()).unwrap_or(u32::MAX);
    let size = (WIDTH, (150 + 26 * rows).clamp(320, 8000));
    let mut files = Vec::new();
    for (name, chart) in [
        ("vram-heatmap", Chart::Heatmap),
        ("timeline", Chart::Timeline),
    ] {
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

#[derive(Debug, Clone, Copy)]
enum Chart {
    Heatmap,
    Timeline,
}

impl Chart {
    fn draw<DB: DrawingBackend>(self, root: &DrawingArea<DB, Shift>, r: &DailyReport) -> Drawn<DB> {
        match self {
            Chart::Heatmap => heatmap(root, r),
            Chart::Timeline => timeline(root, r),
        }
    }
}

/// "node #index", top to bottom in the report's order.
fn labels(r: &DailyReport) -> Vec<String> {
    r.gpus
        .iter()
        .map(|g| format!("{} #{}", g.node, g.index))
        .collect()
}

fn label_area(labels: &[String]) -> u32 {
    let widest = labels.iter().map(|l| l.chars().count()).max().unwrap_or(4);
    u32::try_from(widest * 8 + 24).unwrap_or(300).min(320)
}

/// Row `i` (0 at the top) of `n` spans y in [n-1-i, n-i).
fn row_y(i: usize, n: usize) -> f64 {
    #[allow(clippy::cast_precision_loss)] // a few thousand rows at most
    let y = (n - 1 - i) as f64;
    y
}

/// The GPU labels left of the plotting area, one per row, centred on it.
fn draw_row_labels<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    chart: &ChartContext<
        '_,
        DB,
        Cartesian2d<plotters::coord::types::RangedCoordf64, plotters::coord::types::RangedCoordf64>,
    >,
    labels: &[String],
) -> Drawn<DB> {
    let style = TextStyle::from((FAMILY, 13).into_font()).pos(Pos::new(HPos::Right, VPos::Center));
    let (root_left, root_top) = root.get_base_pixel();
    for (i, label) in labels.iter().enumerate() {
        let (x, y) = chart.backend_coord(&(0.0, row_y(i, labels.len()) + 0.5));
        root.draw(&Text::new(
            label.as_str(),
            (x - 8 - root_left, y - root_top),
            style.clone(),
        ))?;
    }
    Ok(())
}

/// A white-to-dark-blue ramp over [0, 1].
fn ramp(fraction: f64) -> RGBColor {
    let f = fraction.clamp(0.0, 1.0);
    let mix = |a: u8, b: u8| {
        let v = f64::from(a) + (f64::from(b) - f64::from(a)) * f;
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)] // within 0..=255
        let v = v.round().clamp(0.0, 255.0) as u8;
        v
    };
    RGBColor(mix(247, 8), mix(251, 48), mix(255, 107))
}

fn heatmap<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, r: &DailyReport) -> Drawn<DB> {
    root.fill(&WHITE)?;
    let labels = labels(r);
    let n = labels.len().max(1);
    #[allow(clippy::cast_precision_loss)]
    let rows = n as f64;
    let mut chart = ChartBuilder::on(root)
        .caption(
            format!(
                "VRAM used per GPU and hour, {} (UTC): darker is fuller, grey has no samples",
                r.date
            ),
            (FAMILY, 20),
        )
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(label_area(&labels))
        .build_cartesian_2d(0.0..24.0, 0.0..rows)?;
    chart
        .configure_mesh()
        .disable_mesh()
        .x_labels(25)
        .y_labels(0)
        .x_label_formatter(&|h| format!("{h:02.0}"))
        .x_desc("Hour (UTC)")
        .label_style((FAMILY, 13))
        .axis_desc_style((FAMILY, 15))
        .draw()?;
    let cell_text =
        TextStyle::from((FAMILY, 11).into_font()).pos(Pos::new(HPos::Center, VPos::Center));
    for (i, g) in r.gpus.iter().enumerate() {
        let y = row_y(i, n);
        for h in &g.hours {
            let x = f64::from(h.hour);
            #[allow(clippy::cast_precision_loss)] // MiB
            let fraction = h.used_mb.map(|u| u as f64 / g.vram_mb.max(1) as f64);
            let colour = fraction.map_or(NO_SAMPLES, ramp);
            chart.draw_series(std::iter::once(Rectangle::new(
                [(x, y), (x + 1.0, y + 1.0)],
                colour.filled(),
            )))?;
            if let Some(f) = fraction {
                let ink = if f > 0.5 { WHITE } else { BLACK };
                chart.draw_series(std::iter::once(Text::new(
                    format!("{:.0}", f * 100.0),
                    (x + 0.5, y + 0.5),
                    cell_text.clone().color(&ink),
                )))?;
            }
        }
    }
    draw_row_labels(root, &chart, &labels)
}

fn timeline<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, r: &DailyReport) -> Drawn<DB> {
    root.fill(&WHITE)?;
    let labels = labels(r);
    let n = labels.len().max(1);
    #[allow(clippy::cast_precision_loss)]
    let rows = n as f64;
    let mut chart = ChartBuilder::on(root)
        .caption(
            format!("Reservations per GPU, {} (UTC)", r.date),
            (FAMILY, 20),
        )
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(label_area(&labels))
        .build_cartesian_2d(0.0..24.0, 0.0..rows)?;
    chart
        .configure_mesh()
        .y_labels(0)
        .x_labels(25)
        .x_label_formatter(&|h| format!("{h:02.0}"))
        .x_desc("Hour (UTC)")
        .label_style((FAMILY, 13))
        .axis_desc_style((FAMILY, 15))
        .light_line_style(WHITE.mix(0.0))
        .draw()?;
    let row_of: std::collections::HashMap<&str, usize> = r
        .gpus
        .iter()
        .enumerate()
        .map(|(i, g)| (g.uuid.as_str(), i))
        .collect();
    let mut tenants: Vec<&str> = r.timeline.iter().map(|e| e.tenant.as_str()).collect();
    tenants.sort_unstable();
    tenants.dedup();
    let day_start = r.from;
    let hours = |t: chrono::DateTime<chrono::Utc>| {
        #[allow(clippy::cast_precision_loss)] // seconds of a day
        let h = (t - day_start).num_seconds() as f64 / 3600.0;
        h
    };
    let text = TextStyle::from((FAMILY, 11).into_font()).pos(Pos::new(HPos::Left, VPos::Center));
    for (k, tenant) in tenants.iter().enumerate() {
        let colour = COLOURS[k % COLOURS.len()];
        let mut bars = Vec::new();
        let mut names = Vec::new();
        for e in r.timeline.iter().filter(|e| e.tenant == *tenant) {
            // At least two minutes wide, so that a short reservation still shows.
            let (x0, x1) = (
                hours(e.start),
                hours(e.end).max(hours(e.start) + 2.0 / 60.0),
            );
            for uuid in &e.gpus {
                let Some(&i) = row_of.get(uuid.as_str()) else {
                    continue;
                };
                let y = row_y(i, n);
                bars.push(Rectangle::new(
                    [(x0, y + 0.15), (x1, y + 0.85)],
                    colour.mix(0.85).filled(),
                ));
                if x1 - x0 >= 1.5 {
                    let id: String = e.reservation_id.chars().take(8).collect();
                    names.push(Text::new(
                        id,
                        (x0 + 0.1, y + 0.5),
                        text.clone().color(&WHITE),
                    ));
                }
            }
        }
        chart
            .draw_series(bars)?
            .label(*tenant)
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 14, y + 5)], colour.filled()));
        chart.draw_series(names)?;
    }
    if !tenants.is_empty() {
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .margin(12)
            .label_font((FAMILY, 13))
            .background_style(WHITE.mix(0.9))
            .border_style(BLACK.mix(0.4))
            .draw()?;
    }
    draw_row_labels(root, &chart, &labels)
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
