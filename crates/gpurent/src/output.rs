//! Printing results: one JSON document with `--json`, aligned tables for people otherwise.

use std::io::Write;

use serde::Serialize;

use crate::api_client::CliError;

pub fn print_line(s: &str) {
    let mut out = std::io::stdout().lock();
    // A closed stdout (`| head`) is not worth a panic.
    let _ = writeln!(out, "{s}");
}

/// Text as it came (a CSV document, a log), without adding a newline.
pub fn print_raw(s: &str) {
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(s.as_bytes());
}

pub fn print_json<T: Serialize>(value: &T) -> Result<(), CliError> {
    let text = serde_json::to_string_pretty(value)
        .map_err(|e| CliError::new("bad_response", e.to_string()))?;
    print_line(&text);
    Ok(())
}

/// Prints `value` as one line of JSON (a stream of them: `--follow --json`).
pub fn print_json_line<T: Serialize>(value: &T) -> Result<(), CliError> {
    let text =
        serde_json::to_string(value).map_err(|e| CliError::new("bad_response", e.to_string()))?;
    print_line(&text);
    Ok(())
}

/// Prints rows under a header, each column as wide as its widest cell.
pub fn print_table(header: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let padded: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        padded.join("  ").trim_end().to_owned()
    };
    print_line(&line(header.to_vec()));
    for row in rows {
        print_line(&line(row.iter().map(String::as_str).collect()));
    }
}
