//! The console's charts that are images: SVG drawn on the server with plotters (the report
//! charts' embedded font and colours, `report/plot.rs`) and served to an `img`, as the admin's
//! report charts are: an endpoint's ready replicas over the last hour (a step line), and an
//! instance's GPU utilisation and memory used over its life (hour by hour).

use std::collections::BTreeMap;

use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Duration, Utc};
use gpurent_types::api::{GpuUsage, ReplicaCount};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::lang::Lang;
use crate::report::plot::{register_font, PlotError, COLOURS, FAMILY};

/// What drawing on an SVG backend answers.
type Drawn = Result<(), DrawingAreaErrorKind<std::io::Error>>;

/// The size of a line chart, in the SVG's pixels (the page scales it to its column).
const SIZE: (u32, u32) = (960, 340);

/// A chart as the answer to an `img`: opened on its own, it runs nothing and loads nothing;
/// plotters draws with presentation attributes (`fill`, `font-size`), which no `style-src`
/// governs.
pub(crate) fn svg_response(svg: String) -> Response {
    let mut response = svg.into_response();
    let h = response.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("image/svg+xml"),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static("default-src 'none'; frame-ancestors 'none'"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

/// Draws `draw` into an SVG document of [`SIZE`].
fn svg(
    name: &'static str,
    draw: impl FnOnce(&DrawingArea<SVGBackend<'_>, Shift>) -> Drawn,
) -> Result<String, PlotError> {
    register_font()?;
    let failed = |e: &dyn std::fmt::Display| PlotError::Draw {
        chart: name,
        message: e.to_string(),
    };
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, SIZE).into_drawing_area();
        draw(&root).map_err(|e| failed(&e))?;
        root.present().map_err(|e| failed(&e))?;
    }
    Ok(out)
}

/// Minutes from `now` (negative: before).
fn minutes(at: DateTime<Utc>, now: DateTime<Utc>) -> f64 {
    #[allow(clippy::cast_precision_loss)] // milliseconds of an hour
    let m = (at - now).num_milliseconds() as f64 / 60_000.0;
    m
}

/// The window of the replicas chart, in minutes before now.
const WINDOW_MIN: f64 = 60.0;

/// The step line of the ready replicas over the last hour, as (minutes from now, ready): each
/// count holds from its point to the next, the last to now. Before the first point of the
/// hour it is not known; with none, the count did not change within the hour, and `ready_now`
/// held all of it.
pub(crate) fn replica_steps(
    points: &[ReplicaCount],
    now: DateTime<Utc>,
    ready_now: u32,
) -> Vec<(f64, f64)> {
    let now_level = f64::from(ready_now);
    let mut path: Vec<(f64, f64)> = Vec::with_capacity(points.len() * 2 + 2);
    let mut level = None;
    for p in points {
        let x = minutes(p.at, now).clamp(-WINDOW_MIN, 0.0);
        if let Some(before) = level {
            path.push((x, before));
        }
        let y = f64::from(p.ready);
        path.push((x, y));
        level = Some(y);
    }
    match level {
        None => vec![(-WINDOW_MIN, now_level), (0.0, now_level)],
        Some(last) => {
            path.push((0.0, last));
            if last != now_level {
                path.push((0.0, now_level));
            }
            path
        }
    }
}

/// An endpoint's ready replicas over the last hour, up to `now`.
pub(crate) fn replicas_svg(
    l: Lang,
    points: &[ReplicaCount],
    now: DateTime<Utc>,
    ready_now: u32,
) -> Result<String, PlotError> {
    let steps = replica_steps(points, now, ready_now);
    let most = points
        .iter()
        .map(|p| p.ready)
        .fold(ready_now, u32::max)
        .max(1);
    let top = f64::from(most.saturating_add(1));
    // A tick per replica, at most 11.
    let ticks = usize::try_from(most.saturating_add(2)).map_or(11, |n| n.min(11));
    svg("replicas", |root| {
        root.fill(&WHITE)?;
        let mut chart = ChartBuilder::on(root)
            .margin(16)
            .x_label_area_size(48)
            .y_label_area_size(56)
            .build_cartesian_2d(-WINDOW_MIN..0.0, 0.0..top)?;
        let at = |m: &f64| {
            #[allow(clippy::cast_possible_truncation)] // minutes of an hour
            let t = now + Duration::seconds((*m * 60.0).round() as i64);
            t.format("%H:%M").to_string()
        };
        chart
            .configure_mesh()
            .x_labels(7)
            .x_label_formatter(&at)
            .y_labels(ticks)
            .y_label_formatter(&whole)
            .x_desc(l.t("Time (UTC)", "时间（UTC）"))
            .y_desc(l.t("Ready replicas", "就绪副本数"))
            .label_style((FAMILY, 13))
            .axis_desc_style((FAMILY, 15))
            .light_line_style(WHITE.mix(0.0))
            .draw()?;
        chart.draw_series(LineSeries::new(steps, COLOURS[0].stroke_width(2)))?;
        Ok(())
    })
}

/// A label for whole numbers only (the ticks between them stay blank).
fn whole(y: &f64) -> String {
    if (y - y.round()).abs() < 1e-9 {
        format!("{y:.0}")
    } else {
        String::new()
    }
}

/// One hour of a reservation's GPUs together: the mean utilisation of its GPUs (percent) and
/// the memory they used (GiB, summed).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct HourFigures {
    /// Hours from the usage's `from`.
    pub at: i64,
    pub utilization_pct: f64,
    pub memory_gib: f64,
}

/// The usage's hours, its GPUs taken together, in order.
pub(crate) fn by_hour(usage: &GpuUsage) -> Vec<HourFigures> {
    let mut hours: BTreeMap<i64, (f64, f64, u32)> = BTreeMap::new();
    for h in &usage.hours {
        let at = (h.hour - usage.from).num_hours();
        let e = hours.entry(at).or_insert((0.0, 0.0, 0));
        e.0 += h.utilization_pct;
        e.1 += h.memory_used_mb / 1024.0;
        e.2 += 1;
    }
    hours
        .into_iter()
        .map(|(at, (util, mem, n))| HourFigures {
            at,
            utilization_pct: util / f64::from(n.max(1)),
            memory_gib: mem,
        })
        .collect()
}

/// Step lines of one figure: a level per hour, broken where an hour has no samples.
fn hour_steps(hours: &[HourFigures], value: impl Fn(&HourFigures) -> f64) -> Vec<Vec<(f64, f64)>> {
    let mut runs: Vec<Vec<(f64, f64)>> = Vec::new();
    let mut last_at = None;
    for h in hours {
        #[allow(clippy::cast_precision_loss)] // hours of a few weeks
        let x = h.at as f64;
        let y = value(h);
        match runs.last_mut() {
            Some(run) if last_at == Some(h.at - 1) => {
                run.push((x, y));
                run.push((x + 1.0, y));
            }
            _ => runs.push(vec![(x, y), (x + 1.0, y)]),
        }
        last_at = Some(h.at);
    }
    runs
}

/// A reservation's GPU utilisation (left axis) and memory used (right axis) over its life,
/// hour by hour.
pub(crate) fn gpu_svg(l: Lang, usage: &GpuUsage) -> Result<String, PlotError> {
    let hours = by_hour(usage);
    #[allow(clippy::cast_precision_loss)] // hours of a few weeks
    let span = ((usage.to - usage.from).num_minutes() as f64 / 60.0)
        .ceil()
        .max(hours.last().map_or(1.0, |h| (h.at + 1) as f64))
        .max(1.0);
    let memory_top = hours
        .iter()
        .map(|h| h.memory_gib)
        .fold(0.0, f64::max)
        .max(1.0)
        * 1.1;
    let from = usage.from;
    svg("gpu", |root| {
        root.fill(&WHITE)?;
        let mut chart = ChartBuilder::on(root)
            .margin(16)
            .x_label_area_size(48)
            .y_label_area_size(56)
            .right_y_label_area_size(64)
            .build_cartesian_2d(0.0..span, 0.0..100.0)?
            .set_secondary_coord(0.0..span, 0.0..memory_top);
        let at = |h: &f64| {
            #[allow(clippy::cast_possible_truncation)] // hours of a few weeks
            let t = from + Duration::minutes((*h * 60.0).round() as i64);
            t.format("%m-%d %H:%M").to_string()
        };
        chart
            .configure_mesh()
            .x_labels(7)
            .x_label_formatter(&at)
            .y_labels(6)
            .y_label_formatter(&|y| format!("{y:.0}"))
            .x_desc(l.t("Time (UTC)", "时间（UTC）"))
            .y_desc(l.t("Utilisation (%)", "利用率（%）"))
            .label_style((FAMILY, 13))
            .axis_desc_style((FAMILY, 15))
            .light_line_style(WHITE.mix(0.0))
            .draw()?;
        chart
            .configure_secondary_axes()
            .y_labels(6)
            .y_label_formatter(&|y| format!("{y:.1}"))
            .y_desc(l.t("Memory used (GiB)", "显存使用（GiB）"))
            .label_style((FAMILY, 13))
            .axis_desc_style((FAMILY, 15))
            .draw()?;
        let util = COLOURS[0].stroke_width(2);
        let memory = COLOURS[1].stroke_width(2);
        for (i, run) in hour_steps(&hours, |h| h.utilization_pct)
            .into_iter()
            .enumerate()
        {
            let drawn = chart.draw_series(LineSeries::new(run, util))?;
            if i == 0 {
                drawn
                    .label(l.t("Utilisation (%)", "利用率（%）"))
                    .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], util));
            }
        }
        for (i, run) in hour_steps(&hours, |h| h.memory_gib).into_iter().enumerate() {
            let drawn = chart.draw_secondary_series(LineSeries::new(run, memory))?;
            if i == 0 {
                drawn
                    .label(l.t("Memory used (GiB)", "显存使用（GiB）"))
                    .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], memory));
            }
        }
        if hours.is_empty() {
            let style =
                TextStyle::from((FAMILY, 16).into_font()).pos(Pos::new(HPos::Center, VPos::Center));
            let (w, h) = root.dim_in_pixel();
            let (x, y) = (
                i32::try_from(w / 2).unwrap_or(0),
                i32::try_from(h / 2).unwrap_or(0),
            );
            root.draw(&Text::new(l.t("No samples yet", "尚无采样"), (x, y), style))?;
        } else {
            chart
                .configure_series_labels()
                .position(SeriesLabelPosition::UpperLeft)
                .margin(12)
                .label_font((FAMILY, 13))
                .background_style(WHITE.mix(0.9))
                .border_style(BLACK.mix(0.4))
                .draw()?;
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpurent_types::api::GpuUsageHour;

    fn at(now: DateTime<Utc>, minutes: i64) -> DateTime<Utc> {
        now + Duration::minutes(minutes)
    }

    #[test]
    fn replicas_are_a_step_line_to_now() {
        let now = Utc::now();
        let points = [
            ReplicaCount {
                at: at(now, -30),
                ready: 1,
            },
            ReplicaCount {
                at: at(now, -10),
                ready: 2,
            },
        ];
        assert_eq!(
            replica_steps(&points, now, 2),
            vec![(-30.0, 1.0), (-10.0, 1.0), (-10.0, 2.0), (0.0, 2.0)]
        );
        assert_eq!(
            replica_steps(&[], now, 3),
            vec![(-60.0, 3.0), (0.0, 3.0)],
            "no change within the hour: the count now held all of it"
        );
        let svg = replicas_svg(Lang::En, &points, now, 2).unwrap_or_default();
        assert!(svg.starts_with("<svg"), "{svg}");
        assert!(svg.contains("Ready replicas"), "{svg}");
    }

    #[test]
    fn gpus_are_taken_together_hour_by_hour() {
        let from = Utc::now() - Duration::hours(5);
        let hour = |h: i64, gpu: &str, util: f64, mem: f64| GpuUsageHour {
            hour: from + Duration::hours(h),
            gpu: gpu.into(),
            samples: 10,
            utilization_pct: util,
            memory_used_mb: mem,
            memory_max_mb: 0,
        };
        let usage = GpuUsage {
            from,
            to: from + Duration::minutes(270),
            shared: false,
            hours: vec![
                hour(0, "a", 50.0, 1024.0),
                hour(0, "b", 100.0, 2048.0),
                hour(1, "a", 10.0, 512.0),
                hour(3, "a", 0.0, 0.0),
            ],
        };
        let hours = by_hour(&usage);
        assert_eq!(hours.len(), 3);
        assert_eq!(
            (hours[0].at, hours[0].utilization_pct, hours[0].memory_gib),
            (0, 75.0, 3.0)
        );
        let runs = hour_steps(&hours, |h| h.utilization_pct);
        assert_eq!(runs.len(), 2, "broken where an hour has no samples");
        assert_eq!(
            runs[0],
            vec![(0.0, 75.0), (1.0, 75.0), (1.0, 10.0), (2.0, 10.0)]
        );
        let svg = gpu_svg(Lang::ZhCn, &usage).unwrap_or_default();
        assert!(svg.starts_with("<svg") && svg.contains("利用率"), "{svg}");
        let empty = GpuUsage {
            hours: Vec::new(),
            ..usage
        };
        let svg = gpu_svg(Lang::En, &empty).unwrap_or_default();
        assert!(svg.contains("No samples yet"), "{svg}");
    }
}
