//! Metric families read at scrape time, written with `prometheus-client`'s encoder: one
//! helper each for the gauges and the counters that both `/metrics` endpoints serve.

use std::fmt;

use prometheus_client::encoding::{
    DescriptorEncoder, EncodeCounterValue, EncodeGaugeValue, EncodeLabelSet, EncodeMetric,
};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;

/// A gauge family: its `# HELP` and `# TYPE`, then one sample per label set (none: the header
/// only, so that alert rules find the family).
pub fn gauges<L: EncodeLabelSet, V: EncodeGaugeValue>(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    samples: impl IntoIterator<Item = (L, V)>,
) -> fmt::Result {
    let mut family = e.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (labels, value) in samples {
        ConstGauge::new(value).encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}

/// As [`gauges`], for a counter: `name` is the samples' name, with the `_total` that the
/// encoder appends to every counter.
pub fn counters<L: EncodeLabelSet, V: EncodeCounterValue>(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    samples: impl IntoIterator<Item = (L, V)>,
) -> fmt::Result {
    let name = name.strip_suffix("_total").unwrap_or(name);
    let mut family = e.encode_descriptor(name, help, None, MetricType::Counter)?;
    for (labels, value) in samples {
        ConstCounter::new(value).encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}
