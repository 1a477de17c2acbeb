//! The Prometheus text exposition format (version 0.0.4), written by hand: the control
//! plane's and the agents' `/metrics` share this writer and its escaping rules.

use std::fmt::{self, Display, Write};

/// The `Content-Type` of the text format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// What a metric family is, as its `# TYPE` line says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// A histogram's state: cumulative counts per upper bound (without `+Inf`, which is `count`),
/// the sum of the observations, and how many there were.
#[derive(Debug, Clone, PartialEq)]
pub struct HistogramSample<'a, S: Display> {
    pub buckets: &'a [(f64, u64)],
    pub sum: S,
    pub count: u64,
}

/// A text exposition being written: families in the order they are begun, each with its
/// `# HELP` and `# TYPE` lines before its samples.
#[derive(Debug, Default)]
pub struct Exposition {
    out: String,
}

impl Exposition {
    pub fn new() -> Self {
        Exposition::default()
    }

    /// Begins a family. Every sample of a family must follow its header before the next one.
    pub fn family(&mut self, name: &str, kind: Kind, help: &str) {
        let _ = writeln!(self.out, "# HELP {name} {}", escape_help(help));
        let _ = writeln!(self.out, "# TYPE {name} {}", kind.as_str());
    }

    /// One sample of a counter or a gauge.
    pub fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: impl Display) {
        self.out.push_str(name);
        write_labels(&mut self.out, labels, None);
        let _ = writeln!(self.out, " {value}");
    }

    /// A family of one unlabelled sample.
    pub fn single(&mut self, name: &str, kind: Kind, help: &str, value: impl Display) {
        self.family(name, kind, help);
        self.sample(name, &[], value);
    }

    /// The samples of one histogram series: `_bucket` per bound and `+Inf`, `_sum`, `_count`.
    pub fn histogram<S: Display>(
        &mut self,
        name: &str,
        labels: &[(&str, &str)],
        h: &HistogramSample<'_, S>,
    ) {
        for (le, cumulative) in h.buckets {
            let _ = write!(self.out, "{name}_bucket");
            write_labels(&mut self.out, labels, Some(&Bound(*le).to_string()));
            let _ = writeln!(self.out, " {cumulative}");
        }
        let _ = write!(self.out, "{name}_bucket");
        write_labels(&mut self.out, labels, Some("+Inf"));
        let _ = writeln!(self.out, " {}", h.count);
        let _ = write!(self.out, "{name}_sum");
        write_labels(&mut self.out, labels, None);
        let _ = writeln!(self.out, " {}", h.sum);
        let _ = write!(self.out, "{name}_count");
        write_labels(&mut self.out, labels, None);
        let _ = writeln!(self.out, " {}", h.count);
    }

    pub fn finish(self) -> String {
        self.out
    }
}

/// A bucket bound as Prometheus writes it (`0.005`, `1`, `2.5`).
struct Bound(f64);

impl Display for Bound {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.fract() == 0.0 && self.0.abs() < 1e15 {
            write!(f, "{:.0}", self.0)
        } else {
            write!(f, "{}", self.0)
        }
    }
}

fn write_labels(out: &mut String, labels: &[(&str, &str)], le: Option<&str>) {
    if labels.is_empty() && le.is_none() {
        return;
    }
    out.push('{');
    let mut first = true;
    for (name, value) in labels.iter().copied().chain(le.map(|le| ("le", le))) {
        if !first {
            out.push(',');
        }
        first = false;
        out.push_str(name);
        out.push_str("=\"");
        for c in value.chars() {
            match c {
                '\\' => out.push_str("\\\\"),
                '"' => out.push_str("\\\""),
                '\n' => out.push_str("\\n"),
                c => out.push(c),
            }
        }
        out.push('"');
    }
    out.push('}');
}

fn escape_help(help: &str) -> String {
    help.replace('\\', "\\\\").replace('\n', "\\n")
}

/// Micro-units (money, or microseconds) as an exact decimal: `12.000345`, `-0.5`.
pub fn micros(value: i64) -> Decimal6 {
    Decimal6(value)
}

/// Thousandths (milliwatts, say) as an exact decimal: `687.933`.
pub fn millis(value: u64) -> Decimal3 {
    Decimal3(value)
}

/// An integer count of millionths, shown exactly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decimal6(i64);

impl Display for Decimal6 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sign = if self.0 < 0 { "-" } else { "" };
        let abs = self.0.unsigned_abs();
        let (units, frac) = (abs / 1_000_000, abs % 1_000_000);
        if frac == 0 {
            write!(f, "{sign}{units}")
        } else {
            let digits = format!("{frac:06}");
            write!(f, "{sign}{units}.{}", digits.trim_end_matches('0'))
        }
    }
}

/// An integer count of thousandths, shown exactly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decimal3(u64);

impl Display for Decimal3 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (units, frac) = (self.0 / 1000, self.0 % 1000);
        if frac == 0 {
            write!(f, "{units}")
        } else {
            let digits = format!("{frac:03}");
            write!(f, "{units}.{}", digits.trim_end_matches('0'))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_labels_and_histograms() {
        let mut e = Exposition::new();
        e.family("x_total", Kind::Counter, "Things.\nMore \\ lines.");
        e.sample("x_total", &[("route", "/a/{id}"), ("q", "say \"hi\"\n")], 3);
        e.family("d_seconds", Kind::Histogram, "Durations.");
        e.histogram(
            "d_seconds",
            &[("m", "GET")],
            &HistogramSample {
                buckets: &[(0.005, 1), (1.0, 2), (2.5, 2)],
                sum: micros(1_250_000),
                count: 3,
            },
        );
        assert_eq!(
            e.finish(),
            "# HELP x_total Things.\\nMore \\\\ lines.\n# TYPE x_total counter\n\
             x_total{route=\"/a/{id}\",q=\"say \\\"hi\\\"\\n\"} 3\n\
             # HELP d_seconds Durations.\n# TYPE d_seconds histogram\n\
             d_seconds_bucket{m=\"GET\",le=\"0.005\"} 1\n\
             d_seconds_bucket{m=\"GET\",le=\"1\"} 2\n\
             d_seconds_bucket{m=\"GET\",le=\"2.5\"} 2\n\
             d_seconds_bucket{m=\"GET\",le=\"+Inf\"} 3\n\
             d_seconds_sum{m=\"GET\"} 1.25\n\
             d_seconds_count{m=\"GET\"} 3\n"
        );
    }

    #[test]
    fn exact_decimals() {
        assert_eq!(micros(12_000_345).to_string(), "12.000345");
        assert_eq!(micros(-500_000).to_string(), "-0.5");
        assert_eq!(micros(7_000_000).to_string(), "7");
        assert_eq!(millis(687_933).to_string(), "687.933");
        assert_eq!(millis(250_500).to_string(), "250.5");
        assert_eq!(millis(0).to_string(), "0");
    }
}
