//! The commands' `--help` point to the guides by reader; every page they name exists.

use std::path::Path;
use std::process::Command;

use crate::support::BIN;

#[test]
fn every_guide_help_names_exists() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let commands: [&[&str]; 7] = [
        &[],
        &["up"],
        &["server"],
        &["agent"],
        &["config"],
        &["reserve"],
        &["admin"],
    ];
    for command in commands {
        let out = Command::new(BIN)
            .args(command)
            .arg("--help")
            .output()
            .unwrap();
        let help = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "{command:?}: {help}");
        let named: Vec<&str> = help
            .split(|c: char| c.is_whitespace() || matches!(c, ',' | ';' | '(' | ')'))
            .map(|w| w.trim_end_matches('.'))
            .filter(|w| w.ends_with(".md"))
            .collect();
        assert!(
            !named.is_empty(),
            "{command:?} --help names no guide:\n{help}"
        );
        for page in named {
            assert!(
                root.join(page).is_file(),
                "{command:?} --help names {page}, which does not exist"
            );
        }
    }
}
