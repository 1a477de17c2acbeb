//! The console's static files, built into the binary: served at `/assets/NAME` under a
//! version of their content, cached for a year, gzipped once for clients that take it.

use std::io::Write;
use std::sync::OnceLock;

use axum::extract::Path;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};

pub(crate) struct Asset {
    pub name: &'static str,
    pub content_type: &'static str,
    pub bytes: &'static [u8],
}

/// Every file the console serves.
pub(crate) const ASSETS: &[Asset] = &[
    Asset {
        name: "console.css",
        content_type: "text/css; charset=utf-8",
        bytes: include_bytes!("../../assets/console.css"),
    },
    Asset {
        name: "console.js",
        content_type: "text/javascript; charset=utf-8",
        bytes: include_bytes!("../../assets/console.js"),
    },
    Asset {
        name: "favicon.svg",
        content_type: "image/svg+xml",
        bytes: include_bytes!("../../assets/favicon.svg"),
    },
    // The instance page's web terminal (`terminal.rs`): its script and the vendored xterm.js,
    // byte for byte the files `vendor/vendor.lock` names (a test of `terminal.rs` checks).
    Asset {
        name: "terminal.js",
        content_type: "text/javascript; charset=utf-8",
        bytes: include_bytes!("../../assets/terminal.js"),
    },
    Asset {
        name: "xterm.js",
        content_type: "text/javascript; charset=utf-8",
        bytes: include_bytes!("../../assets/vendor/xterm.js"),
    },
    Asset {
        name: "xterm.css",
        content_type: "text/css; charset=utf-8",
        bytes: include_bytes!("../../assets/vendor/xterm.css"),
    },
    Asset {
        name: "addon-fit.js",
        content_type: "text/javascript; charset=utf-8",
        bytes: include_bytes!("../../assets/vendor/addon-fit.js"),
    },
    Asset {
        name: "xterm.LICENSE",
        content_type: "text/plain; charset=utf-8",
        bytes: include_bytes!("../../assets/vendor/xterm.LICENSE"),
    },
    Asset {
        name: "addon-fit.LICENSE",
        content_type: "text/plain; charset=utf-8",
        bytes: include_bytes!("../../assets/vendor/addon-fit.LICENSE"),
    },
];

struct Prepared {
    version: String,
    gzip: Vec<u8>,
}

fn prepared() -> &'static [Prepared] {
    static PREPARED: OnceLock<Vec<Prepared>> = OnceLock::new();
    PREPARED.get_or_init(|| {
        ASSETS
            .iter()
            .map(|a| Prepared {
                version: hex::encode(&Sha256::digest(a.bytes)[..6]),
                gzip: gzip(a.bytes, flate2::Compression::best()),
            })
            .collect()
    })
}

/// Gzipped: the best compression for files (once per process), a fast one for pages.
pub(crate) fn gzip(bytes: &[u8], level: flate2::Compression) -> Vec<u8> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), level);
    // Writing to a Vec cannot fail.
    if encoder.write_all(bytes).is_err() {
        return Vec::new();
    }
    encoder.finish().unwrap_or_default()
}

/// Where a page links a file: its name and the version of its content, so a new binary's
/// files are fetched anew while each stays cached.
pub(crate) fn url(name: &str) -> String {
    match ASSETS.iter().position(|a| a.name == name) {
        Some(i) => format!("/assets/{name}?v={}", prepared()[i].version),
        None => format!("/assets/{name}"),
    }
}

pub(crate) fn accepts_gzip(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT_ENCODING)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|e| {
            let mut parts = e.split(';');
            let name = parts.next().unwrap_or("").trim();
            let refused = parts.any(|p| matches!(p.trim(), "q=0" | "q=0.0" | "q=0.00" | "q=0.000"));
            name.eq_ignore_ascii_case("gzip") && !refused
        })
}

pub(crate) async fn serve(Path(name): Path<String>, headers: HeaderMap) -> Response {
    let Some(i) = ASSETS.iter().position(|a| a.name == name) else {
        return (StatusCode::NOT_FOUND, "no such file").into_response();
    };
    let asset = &ASSETS[i];
    let prepared = &prepared()[i];
    let mut response = if accepts_gzip(&headers) && !prepared.gzip.is_empty() {
        let mut r = prepared.gzip.clone().into_response();
        r.headers_mut()
            .insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
        r
    } else {
        asset.bytes.into_response()
    };
    let h = response.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(asset.content_type),
    );
    h.insert(header::VARY, HeaderValue::from_static("accept-encoding"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("public, max-age=31536000, immutable"),
    );
    response
}
