//! `gpurent sim --plot`: GPU allocation against arrived GPU request, one line per policy, as PNG or SVG.

use std::path::Path;

use anyhow::{bail, Context};
use plotters::coord::Shift;
use plotters::prelude::*;

/// The font and colours of every chart (the report's, in the server crate).
pub use gpurent_server::report_plot::{COLOURS, FAMILY};
const SIZE: (u32, u32) = (960, 640);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Png,
    Svg,
}

impl Format {
    /// The chart's format, from the file's extension.
    pub fn of(path: &Path) -> anyhow::Result<Format> {
        let ext = path
            .extension()
            .and_then(|e| e.to_str())
            .map(str::to_ascii_lowercase);
        match ext.as_deref() {
            Some("png") => Ok(Format::Png),
            Some("svg") => Ok(Format::Svg),
            _ => bail!(
                "--plot {}: the chart is written as PNG or SVG, so the file name must end in .png or .svg",
                path.display()
            ),
        }
    }
}

/// One policy's line: its label and (arrived, allocation) points in percent of capacity.
#[derive(Debug)]
pub struct Line {
    pub label: String,
    pub points: Vec<(f64, f64)>,
}

/// Makes the embedded font the one charts draw `FAMILY` with.
pub fn register_font() -> anyhow::Result<()> {
    Ok(gpurent_server::report_plot::register_font()?)
}

/// Draws the chart into `path`.
pub fn write(path: &Path, format: Format, title: &str, lines: &[Line]) -> anyhow::Result<()> {
    register_font()?;
    let cannot = || format!("cannot write the chart {}", path.display());
    match format {
        Format::Png => {
            let root = BitMapBackend::new(path, SIZE).into_drawing_area();
            draw(&root, title, lines).with_context(cannot)?;
            root.present().with_context(cannot)?;
        }
        Format::Svg => {
            let root = SVGBackend::new(path, SIZE).into_drawing_area();
            draw(&root, title, lines).with_context(cannot)?;
            root.present().with_context(cannot)?;
        }
    }
    Ok(())
}

fn draw<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    title: &str,
    lines: &[Line],
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(root)
        .caption(title, (FAMILY, 22))
        .margin(16)
        .x_label_area_size(52)
        .y_label_area_size(64)
        .build_cartesian_2d(0.0..130.0, 0.0..100.0)?;
    chart
        .configure_mesh()
        .x_labels(14)
        .y_labels(11)
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|y| format!("{y:.0}"))
        .x_desc("Arrived GPU request (% of capacity)")
        .y_desc("GPU allocation (% of capacity)")
        .label_style((FAMILY, 14))
        .axis_desc_style((FAMILY, 16))
        .light_line_style(WHITE.mix(0.0))
        .draw()?;
    for (line, &colour) in lines.iter().zip(COLOURS.iter().cycle()) {
        let style = colour.stroke_width(2);
        chart
            .draw_series(LineSeries::new(line.points.iter().copied(), style))?
            .label(line.label.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], style));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .margin(16)
        .label_font((FAMILY, 14))
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK.mix(0.4))
        .draw()?;
    Ok(())
}
