//! `gpurent report daily|weekly` against a real `gpurent up`: a reservation that ran a few
//! seconds appears in the CSV and JSON files with its exact revenue, the charts decode as PNG
//! and parse as SVG, and bad dates are usage errors.

use chrono::{DateTime, Utc};
use serde_json::Value;

use crate::support::{cli, eventually, read_token, Daemon};

fn csv_rows(path: &std::path::Path) -> Vec<Vec<String>> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| l.split(',').map(str::to_owned).collect())
        .collect()
}

#[test]
fn a_daily_report_writes_csv_json_and_charts() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let up = Daemon::up_sim(&data, "2xRTX4090", &[], &dir.path().join("up.log"));
    let url = up.url.clone();
    let admin = read_token(&data);
    let alice = cli(
        &url,
        Some(&admin),
        true,
        &["users", "create", "alice", "--credit", "100"],
    );
    let token = alice.json()["token"].as_str().unwrap().to_owned();
    let t = Some(token.as_str());
    let r = cli(
        &url,
        t,
        true,
        &[
            "reserve", "--gpu", "rtx4090", "--count", "2", "--hours", "1",
        ],
    );
    assert_eq!(r.code, 0, "{r:?}");
    let id = r.json()["id"].as_str().unwrap().to_owned();
    eventually("running", 30, || {
        cli(&url, t, true, &["get", &id]).json()["status"] == "running"
    });
    std::thread::sleep(std::time::Duration::from_millis(2100));
    cli(&url, t, true, &["stop", &id]);
    eventually("stopped", 30, || {
        cli(&url, t, true, &["get", &id]).json()["status"] == "stopped"
    });
    let done = cli(&url, t, true, &["get", &id]).json();
    let started: DateTime<Utc> = done["started_at"].as_str().unwrap().parse().unwrap();
    let date = started.format("%Y-%m-%d").to_string();

    let out = dir.path().join("report");
    let run = cli(
        &url,
        Some(&admin),
        true,
        &[
            "report",
            "daily",
            "--date",
            &date,
            "--out",
            out.to_str().unwrap(),
        ],
    );
    assert_eq!(run.code, 0, "{run:?}");
    let files: Vec<String> = run.json()["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f.as_str().unwrap().to_owned())
        .collect();
    let names: Vec<String> = files
        .iter()
        .map(|f| {
            let p = std::path::Path::new(f);
            assert!(p.starts_with(&out) && p.is_file(), "{f}");
            p.file_name().unwrap().to_str().unwrap().to_owned()
        })
        .collect();
    assert_eq!(
        names,
        [
            "tenants.csv",
            "nodes.csv",
            "gpus.csv",
            "gpu-hours.csv",
            "report.json",
            "vram-heatmap.png",
            "vram-heatmap.svg",
            "timeline.png",
            "timeline.svg",
        ]
    );

    // tenants.csv: alice, her revenue exactly what she was charged, two GPUs for the seconds
    // she was billed (to the stop; the stop may come up to a second after `get` says running).
    let tenants = csv_rows(&out.join("tenants.csv"));
    assert_eq!(
        tenants[0],
        [
            "date",
            "tenant_id",
            "tenant",
            "kind",
            "reservations",
            "gpu_hours",
            "vram_gb_hours",
            "revenue",
            "utilization_pct"
        ]
    );
    assert_eq!(tenants.len(), 2, "{tenants:?}");
    let row = &tenants[1];
    assert_eq!(
        (
            row[0].as_str(),
            row[2].as_str(),
            row[3].as_str(),
            row[4].as_str()
        ),
        (date.as_str(), "alice", "user", "1")
    );
    assert_eq!(row[7], done["charged"].as_str().unwrap());
    let ended: DateTime<Utc> = done["ended_at"].as_str().unwrap().parse().unwrap();
    #[allow(clippy::cast_precision_loss)]
    let expected = 2.0 * (ended - started).num_milliseconds() as f64 / 3_600_000.0;
    let gpu_hours: f64 = row[5].parse().unwrap();
    assert!(
        (gpu_hours - expected).abs() < 0.001,
        "{gpu_hours} vs {expected}"
    );
    let gpus = csv_rows(&out.join("gpus.csv"));
    assert_eq!(gpus.len(), 3, "{gpus:?}");
    let hours = csv_rows(&out.join("gpu-hours.csv"));
    assert_eq!(hours.len(), 1 + 2 * 24);
    let report: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("report.json")).unwrap()).unwrap();
    assert_eq!(report["totals"]["revenue"], done["charged"]);
    assert_eq!(report["timeline"][0]["reservation_id"], id.as_str());

    for name in ["vram-heatmap", "timeline"] {
        let png = image::open(out.join(format!("{name}.png")))
            .unwrap_or_else(|e| panic!("{name}.png does not decode: {e}"))
            .to_rgb8();
        assert!(png.width() >= 1000 && png.height() >= 300, "{name}");
        // Not a blank page: more than white and the axes' black.
        let mut colours: Vec<[u8; 3]> = png.pixels().map(|p| p.0).collect();
        colours.sort_unstable();
        colours.dedup();
        assert!(
            colours.len() > 10,
            "{name}.png has {} colours",
            colours.len()
        );
        let svg = std::fs::read_to_string(out.join(format!("{name}.svg"))).unwrap();
        assert!(
            svg.contains("<svg") && svg.trim_end().ends_with("</svg>"),
            "{name}.svg"
        );
        assert!(svg.contains(&date), "{name}.svg names the day");
    }
    let timeline = std::fs::read_to_string(out.join("timeline.svg")).unwrap();
    assert!(timeline.contains("alice"), "the legend names the tenant");

    // Without --json: a summary for people.
    let human = cli(
        &url,
        Some(&admin),
        false,
        &[
            "report",
            "daily",
            "--date",
            &date,
            "--out",
            out.to_str().unwrap(),
        ],
    );
    assert_eq!(human.code, 0, "{human:?}");
    assert!(
        human.stdout.contains("alice") && human.stdout.contains("wrote 9 files"),
        "{human:?}"
    );

    // The week of that day, from its first day, also as CSV.
    let week = cli(
        &url,
        Some(&admin),
        true,
        &[
            "report",
            "weekly",
            "--from",
            &date,
            "--out",
            out.to_str().unwrap(),
        ],
    )
    .json();
    assert_eq!(week["total"]["charged"], done["charged"], "{week}");
    assert_eq!(week["tiers"][0]["tier"], "on-demand");
    let weekly = csv_rows(&out.join("weekly.csv"));
    assert_eq!(weekly[0][1], "tier");
    let tiers: Vec<&str> = weekly[1..].iter().map(|r| r[1].as_str()).collect();
    assert_eq!(tiers, ["on-demand", "stepped", "spot", "reserved", "total"]);
    assert_eq!(weekly[5][4], done["charged"].as_str().unwrap());

    // Bad dates are usage errors (exit 2); tenants may not see reports.
    let bad = cli(
        &url,
        Some(&admin),
        true,
        &["report", "daily", "--date", "2026-02-30", "--out", "x"],
    );
    assert_eq!(bad.code, 2, "{bad:?}");
    assert_eq!(bad.json()["error"]["code"], "usage");
    let bad = cli(
        &url,
        Some(&admin),
        false,
        &["report", "weekly", "--week", "2026-9"],
    );
    assert_eq!(bad.code, 2, "{bad:?}");
    let denied = cli(&url, t, true, &["report", "weekly"]);
    assert_eq!(denied.code, 1);
    assert_eq!(denied.json()["error"]["code"], "forbidden");
}
