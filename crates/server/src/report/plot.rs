//! The charts of a daily report: a VRAM heat map (GPU x hour) and a timeline of the
//! reservations on each GPU, drawn with plotters on an embedded font, for `gpurent report
//! daily` (PNG and SVG files) and the console's reports page (SVG).

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use gpurent_types::report::DailyReport;

/// Text is laid out (and in PNG drawn) with this font, so no system font library is needed.
static FONT: &[u8] = include_bytes!("../../assets/fonts/DejaVuSans.ttf");
pub const FAMILY: &str = "sans-serif";
/// Distinguishable colours (matplotlib's first six), then again from the first.
pub const COLOURS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
];
pub const WIDTH: u32 = 1200;

/// Why a chart could not be drawn.
#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    #[error("the embedded font does not parse")]
    Font,
    #[error("cannot draw the {chart} chart: {message}")]
    Draw {
        chart: &'static str,
        message: String,
    },
}

/// Makes the embedded font the one charts draw `FAMILY` with.
pub fn register_font() -> Result<(), PlotError> {
    plotters::style::register_font(FAMILY, FontStyle::Normal, FONT).map_err(|_| PlotError::Font)
}

/// The size of both charts of a report: a row per GPU.
pub fn size(report: &DailyReport) -> (u32, u32) {
    let rows = u32::try_from(report.gpus.len()).unwrap_or(u32::MAX);
    (
        WIDTH,
        rows.saturating_mul(26).saturating_add(150).clamp(320, 8000),
    )
}

/// One chart of a report as an SVG document.
pub fn svg(chart: Chart, report: &DailyReport) -> Result<String, PlotError> {
    register_font()?;
    let failed = |e: &dyn std::fmt::Display| PlotError::Draw {
        chart: chart.name(),
        message: e.to_string(),
    };
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, size(report)).into_drawing_area();
        chart.draw(&root, report).map_err(|e| failed(&e))?;
        root.present().map_err(|e| failed(&e))?;
    }
    Ok(out)
}

const NO_SAMPLES: RGBColor = RGBColor(225, 225, 225);

pub type Drawn<DB> = Result<(), DrawingAreaErrorKind<<DB as DrawingBackend>::ErrorType>>;

/// The two charts of a daily report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Chart {
    Heatmap,
    Timeline,
}

impl Chart {
    /// Its file name without the extension, as `gpurent report daily` writes it.
    pub fn name(self) -> &'static str {
        match self {
            Chart::Heatmap => "vram-heatmap",
            Chart::Timeline => "timeline",
        }
    }

    /// Draws it on any plotters backend (PNG, SVG); `register_font` first.
    pub fn draw<DB: DrawingBackend>(
        self,
        root: &DrawingArea<DB, Shift>,
        r: &DailyReport,
    ) -> Drawn<DB> {
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
