//! Printing results: one JSON document with `--json`, aligned tables for people otherwise,
//! with the control characters of what the server sent shown escaped, never sent to the terminal.

use std::borrow::Cow;
use std::io::Write;

use serde::Serialize;

use crate::api_client::CliError;

/// `s` with every character that could drive a terminal or hide text written as Rust writes it
/// (`\u{1b}`, `\r`, `\n`, `\t`): C0 and C1 controls and DEL (an ESC starts a sequence that
/// can recolour, retitle or clear the screen; a CR overwrites the line), and the bidirectional
/// overrides and isolates that reorder what is shown. Backslashes are left as they are.
pub fn escape_control(s: &str) -> Cow<'_, str> {
    let unsafe_char =
        |c: char| c.is_control() || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}');
    if !s.chars().any(unsafe_char) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if unsafe_char(c) {
            out.extend(c.escape_debug());
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// One line for people: control characters escaped (one line stays one line).
pub fn print_line(s: &str) {
    write_line(&escape_control(s));
}

/// One line as it is: for JSON, which escapes its own control characters.
fn write_line(s: &str) {
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
    write_line(&text);
    Ok(())
}

/// Prints `value` as one line of JSON (a stream of them: `--follow --json`).
pub fn print_json_line<T: Serialize>(value: &T) -> Result<(), CliError> {
    let text =
        serde_json::to_string(value).map_err(|e| CliError::new("bad_response", e.to_string()))?;
    write_line(&text);
    Ok(())
}

/// Prints rows under a header, each column as wide as its widest cell (escaped, as printed).
pub fn print_table(header: &[&str], rows: &[Vec<String>]) {
    let rows: Vec<Vec<Cow<'_, str>>> = rows
        .iter()
        .map(|row| row.iter().map(|cell| escape_control(cell)).collect())
        .collect();
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in &rows {
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
    for row in &rows {
        write_line(&line(row.iter().map(AsRef::as_ref).collect()));
    }
}

#[cfg(test)]
mod tests {
    use super::escape_control;

    #[test]
    fn control_characters_are_escaped_and_the_rest_is_kept() {
        assert_eq!(
            escape_control("ok\x1b[31mred\rX\u{9b}\u{7f}\t\n"),
            r"ok\u{1b}[31mred\rX\u{9b}\u{7f}\t\n"
        );
        assert_eq!(escape_control("a\u{202e}b\u{2066}"), r"a\u{202e}b\u{2066}");
        let plain = r"GPU é 日本 \u{1b} 100%";
        assert!(matches!(escape_control(plain), std::borrow::Cow::Borrowed(s) if s == plain));
    }
}
