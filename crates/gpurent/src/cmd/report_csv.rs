//! The CSV files of `gpurent report`: one row per tenant, node, GPU, GPU-hour or tier, RFC 4180.

use gpurent_types::report::{DailyReport, WeeklyReport};

fn cell(value: &str) -> String {
    if value.contains([',', '"', '\r', '\n']) {
        format!("\"{}\"", value.replace('"', "\"\""))
    } else {
        value.to_owned()
    }
}

fn opt<T: ToString>(v: Option<T>) -> String {
    v.map(|v| v.to_string()).unwrap_or_default()
}

fn table(header: &[&str], rows: impl IntoIterator<Item = Vec<String>>) -> String {
    let mut out = header.join(",");
    out.push_str("\r\n");
    for row in rows {
        let cells: Vec<String> = row.iter().map(|c| cell(c)).collect();
        out.push_str(&cells.join(","));
        out.push_str("\r\n");
    }
    out
}

pub fn tenants(r: &DailyReport) -> String {
    table(
        &[
            "date",
            "tenant_id",
            "tenant",
            "kind",
            "reservations",
            "gpu_hours",
            "vram_gb_hours",
            "revenue",
            "utilization_pct",
        ],
        r.tenants.iter().map(|t| {
            vec![
                r.date.to_string(),
                t.tenant_id.clone(),
                t.tenant.clone(),
                if t.team { "team" } else { "user" }.to_owned(),
                t.reservations.to_string(),
                t.gpu_hours.to_string(),
                t.vram_gb_hours.to_string(),
                t.revenue.to_string(),
                opt(t.utilization_pct),
            ]
        }),
    )
}

pub fn nodes(r: &DailyReport) -> String {
    table(
        &[
            "date",
            "node_id",
            "node",
            "gpus",
            "gpu_hours",
            "vram_gb_hours",
            "revenue",
            "host_earnings",
            "allocation_pct",
            "utilization_pct",
        ],
        r.nodes.iter().map(|n| {
            vec![
                r.date.to_string(),
                n.node_id.clone(),
                n.node.clone(),
                n.gpus.to_string(),
                n.gpu_hours.to_string(),
                n.vram_gb_hours.to_string(),
                n.revenue.to_string(),
                n.host_earnings.to_string(),
                n.allocation_pct.to_string(),
                opt(n.utilization_pct),
            ]
        }),
    )
}

pub fn gpus(r: &DailyReport) -> String {
    table(
        &[
            "date",
            "gpu_uuid",
            "node",
            "index",
            "model",
            "vram_mb",
            "gpu_hours",
            "vram_gb_hours",
            "revenue",
            "allocation_pct",
            "utilization_pct",
        ],
        r.gpus.iter().map(|g| {
            vec![
                r.date.to_string(),
                g.uuid.clone(),
                g.node.clone(),
                g.index.to_string(),
                g.model.clone(),
                g.vram_mb.to_string(),
                g.gpu_hours.to_string(),
                g.vram_gb_hours.to_string(),
                g.revenue.to_string(),
                g.allocation_pct.to_string(),
                opt(g.utilization_pct),
            ]
        }),
    )
}

/// Each GPU's 24 hours: what the heat map draws.
pub fn gpu_hours(r: &DailyReport) -> String {
    table(
        &[
            "date",
            "gpu_uuid",
            "node",
            "hour",
            "allocated_mb",
            "used_mb",
            "used_max_mb",
            "utilization_pct",
            "samples",
        ],
        r.gpus.iter().flat_map(|g| {
            g.hours.iter().map(move |h| {
                vec![
                    r.date.to_string(),
                    g.uuid.clone(),
                    g.node.clone(),
                    h.hour.to_string(),
                    h.allocated_mb.to_string(),
                    opt(h.used_mb),
                    opt(h.used_max_mb),
                    opt(h.utilization_pct),
                    h.samples.to_string(),
                ]
            })
        }),
    )
}

pub fn weekly(r: &WeeklyReport) -> String {
    let from = r.from.format("%Y-%m-%d").to_string();
    table(
        &[
            "from",
            "tier",
            "reservations",
            "gpu_hours",
            "charged",
            "price_per_gpu_hour",
            "preemptions",
            "host_earnings",
            "platform_return",
        ],
        r.tiers.iter().chain([&r.total]).map(|t| {
            vec![
                from.clone(),
                t.tier.map_or_else(|| "total".to_owned(), |t| t.to_string()),
                t.reservations.to_string(),
                t.gpu_hours.to_string(),
                t.charged.to_string(),
                opt(t.price_per_gpu_hour),
                t.preemptions.to_string(),
                t.host_earnings.to_string(),
                t.platform_return.to_string(),
            ]
        }),
    )
}
