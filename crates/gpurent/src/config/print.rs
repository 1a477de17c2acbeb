//! `gpurent config check FILE` and `gpurent config print COMMAND [ARGS]`: a file checked as
//! its daemon would read it, and the options a daemon would run with, each with its source.

use std::ffi::OsString;
use std::path::Path;

use anyhow::{bail, Context};
use clap::parser::ValueSource;
use clap::CommandFactory;
use serde_json::json;

use super::file::GLOBAL_KEYS;
use super::{ConfigFile, Loaded};
use crate::cli::{Cli, ConfigCommand, Daemon};
use crate::output::{print_json_line, print_line};

pub fn run(command: ConfigCommand, json: bool) -> anyhow::Result<()> {
    match command {
        ConfigCommand::Check { file, command } => check(&file, command, json),
        ConfigCommand::Print { command, args } => print(command, args, json),
    }
}

fn check(path: &Path, command: Option<Daemon>, json: bool) -> anyhow::Result<()> {
    let daemon = match command {
        Some(daemon) => daemon,
        None => path
            .file_stem()
            .and_then(|s| s.to_str())
            .and_then(Daemon::from_name)
            .with_context(|| {
                format!(
                    "say which command {} configures: --for server, agent or up",
                    path.display()
                )
            })?,
    };
    let file = ConfigFile::read(path)?;
    let root = Cli::command();
    let (flags, set) = file.flags(&root, daemon.name(), &[])?;
    // clap checks what only the options together can break (an option another requires).
    let mut args = vec![OsString::from("gpurent"), OsString::from(daemon.name())];
    args.extend(flags.into_iter().map(OsString::from));
    if let Err(e) = root.try_get_matches_from(args) {
        bail!("{}", super::with_file_error(path, &e));
    }
    let keys: Vec<&String> = set.keys().collect();
    if json {
        print_json_line(&json!({
            "file": path.display().to_string(),
            "command": daemon.name(),
            "keys": keys,
        }))?;
    } else {
        print_line(&format!(
            "{}: valid for `gpurent {}`: {} option{} ({})",
            path.display(),
            daemon.name(),
            keys.len(),
            if keys.len() == 1 { "" } else { "s" },
            keys.iter()
                .map(|k| k.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    Ok(())
}

/// One option's effective value and where it came from.
struct Row {
    option: String,
    value: Option<String>,
    source: String,
}

fn print(daemon: Daemon, args: Vec<OsString>, json: bool) -> anyhow::Result<()> {
    let mut argv = vec![OsString::from("gpurent"), OsString::from(daemon.name())];
    argv.extend(args);
    let parsed = super::parse(argv).map_err(|e| match e {
        super::ParseError::Usage(e) => anyhow::anyhow!(
            "{}",
            e.to_string()
                .lines()
                .next()
                .unwrap_or_default()
                .trim_start_matches("error: ")
        ),
        other => anyhow::Error::new(other),
    })?;
    let root = Cli::command();
    let sub = root
        .find_subcommand(daemon.name())
        .context("no such command")?;
    let matches = parsed
        .matches
        .subcommand_matches(daemon.name())
        .context("no such command")?;
    let options = sub.get_arguments().chain(
        root.get_arguments()
            .filter(|a| a.get_long().is_some_and(|l| GLOBAL_KEYS.contains(&l))),
    );
    let mut rows = Vec::new();
    for arg in options {
        let Some(long) = arg.get_long() else { continue };
        if matches!(long, "help" | "version" | "config") || arg.is_hide_set() {
            continue;
        }
        let id = arg.get_id().as_str();
        let value = matches.get_raw(id).map(|values| {
            values
                .map(|v| v.to_string_lossy().into_owned())
                .collect::<Vec<_>>()
                .join(",")
        });
        let secret = arg.is_hide_env_values_set();
        rows.push(Row {
            option: long.to_owned(),
            value: value.map(|v| if secret { "(redacted)".to_owned() } else { v }),
            source: source(parsed.file.as_ref(), long, matches.value_source(id), arg),
        });
    }
    let file = parsed.file.as_ref().map(|f| f.path.display().to_string());
    if json {
        print_json_line(&json!({
            "command": daemon.name(),
            "config_file": file,
            "options": rows.iter().map(|r| json!({
                "option": r.option, "value": r.value, "source": r.source,
            })).collect::<Vec<_>>(),
        }))?;
        return Ok(());
    }
    print_line(&format!(
        "# gpurent {}: configuration file {}",
        daemon.name(),
        file.as_deref().unwrap_or("none")
    ));
    let width = rows.iter().map(|r| r.option.len()).max().unwrap_or(0);
    let value_width = rows
        .iter()
        .map(|r| r.value.as_deref().map_or(1, str::len))
        .max()
        .unwrap_or(0)
        .min(48);
    for row in &rows {
        print_line(&format!(
            "{:width$}  {:value_width$}  {}",
            row.option,
            row.value.as_deref().unwrap_or("-"),
            row.source
        ));
    }
    Ok(())
}

fn source(file: Option<&Loaded>, long: &str, from: Option<ValueSource>, arg: &clap::Arg) -> String {
    if let Some(file) = file.filter(|f| f.set.contains_key(long)) {
        return format!("file {}", file.path.display());
    }
    match from {
        Some(ValueSource::CommandLine) => "flag".to_owned(),
        Some(ValueSource::EnvVariable) => format!(
            "env {}",
            arg.get_env()
                .map(|e| e.to_string_lossy().into_owned())
                .unwrap_or_default()
        ),
        Some(ValueSource::DefaultValue) => "default".to_owned(),
        _ => "unset".to_owned(),
    }
}
