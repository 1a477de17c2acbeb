//! One configuration file: TOML whose keys are a command's long flags' names, checked against
//! the command's arguments (an unknown key, a value of the wrong kind or one the flag refuses
//! is an error naming the key and the file) and turned into the flags they stand for, which a
//! flag or an environment variable overrides.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use clap::error::ErrorKind;
use clap::{ArgAction, Command};

/// Options of the whole CLI a daemon's file may set too: how an agent reaches and trusts the
/// control plane.
pub const GLOBAL_KEYS: [&str; 3] = ["server", "ca-cert", "tls-fingerprint"];

/// A file's flaw, with the file and the key it is in.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error("cannot read the configuration file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is not valid TOML: {message}")]
    Syntax { path: PathBuf, message: String },
    #[error("{path}: unknown key `{key}`: not an option of `gpurent {command}`{hint} (see `gpurent {command} --help`)")]
    UnknownKey {
        path: PathBuf,
        key: String,
        command: String,
        hint: String,
    },
    #[error("{path}: `{key}`: {message}")]
    BadValue {
        path: PathBuf,
        key: String,
        message: String,
    },
}

/// A file's values, each under the long flag name it sets, as the strings a flag would take.
#[derive(Debug, Clone)]
pub struct ConfigFile {
    pub path: PathBuf,
    pub values: BTreeMap<String, Vec<String>>,
}

impl ConfigFile {
    pub fn read(path: &Path) -> Result<ConfigFile, FileError> {
        let text = std::fs::read_to_string(path).map_err(|source| FileError::Read {
            path: path.to_owned(),
            source,
        })?;
        ConfigFile::parse(path, &text)
    }

    pub fn parse(path: &Path, text: &str) -> Result<ConfigFile, FileError> {
        let table: toml::Table = text
            .parse()
            .map_err(|e: toml::de::Error| FileError::Syntax {
                path: path.to_owned(),
                message: e.to_string().trim().replace('\n', " "),
            })?;
        let bad = |key: &str, message: String| FileError::BadValue {
            path: path.to_owned(),
            key: key.to_owned(),
            message,
        };
        let mut values = BTreeMap::new();
        for (key, value) in table {
            let strings = match value {
                toml::Value::Array(items) => items
                    .into_iter()
                    .map(|v| {
                        scalar(v).map_err(|kind| {
                            bad(&key, format!("a list of {kind}s: give a list of values"))
                        })
                    })
                    .collect::<Result<Vec<_>, _>>()?,
                other => vec![scalar(other).map_err(|kind| {
                    bad(
                        &key,
                        format!("a {kind}: give a string, number or true/false"),
                    )
                })?],
            };
            values.insert(key, strings);
        }
        Ok(ConfigFile {
            path: path.to_owned(),
            values,
        })
    }

    /// Checks every key and value against `command` (a daemon's subcommand of `root`; the
    /// global options are `root`'s) and turns them into the flags they stand for, for clap to
    /// parse after the command line's own. Keys whose argument was given on the command line
    /// or in the environment (`explicit`, by id), or conflicts with one that was, are left
    /// out: those override the file. Returns the flags and the argument ids set, by key.
    pub fn flags(
        &self,
        root: &Command,
        command: &str,
        explicit: &[String],
    ) -> Result<(Vec<String>, BTreeMap<String, String>), FileError> {
        let empty = Command::new("gpurent");
        let sub = root.find_subcommand(command).unwrap_or(&empty);
        let mut flags = Vec::new();
        let mut set = BTreeMap::new();
        for (key, values) in &self.values {
            let (arg, scope) = match find_long(sub, key) {
                Some(arg) => (arg, sub),
                None if GLOBAL_KEYS.contains(&key.as_str()) => (
                    find_long(root, key).ok_or_else(|| self.unknown(key, command, sub))?,
                    root,
                ),
                None => return Err(self.unknown(key, command, sub)),
            };
            let id = arg.get_id().to_string();
            let switch = self.check_values(arg, root, command, key, values)?;
            if explicit.contains(&id)
                || conflicts(scope, arg)
                    .iter()
                    .any(|(other, _)| explicit.contains(other))
            {
                continue;
            }
            if switch {
                if values.iter().any(|v| v == "true") {
                    flags.push(format!("--{key}"));
                }
            } else {
                flags.extend(values.iter().map(|v| format!("--{key}={v}")));
            }
            set.insert(key.clone(), id);
        }
        Ok((flags, set))
    }

    /// A switch takes true or false; a single-valued option one value; each value must be
    /// one the flag accepts (its own parser says why not).
    fn check_values(
        &self,
        arg: &clap::Arg,
        root: &Command,
        command: &str,
        key: &str,
        values: &[String],
    ) -> Result<bool, FileError> {
        let bad = |message: String| FileError::BadValue {
            path: self.path.clone(),
            key: key.to_owned(),
            message,
        };
        let switch = matches!(arg.get_action(), ArgAction::SetTrue | ArgAction::SetFalse);
        if switch {
            return match values {
                [v] if v == "true" || v == "false" => Ok(true),
                _ => Err(bad("a switch: give true or false".into())),
            };
        }
        let many = matches!(arg.get_action(), ArgAction::Append)
            || arg.get_num_args().is_some_and(|n| n.max_values() > 1);
        if values.len() != 1 && !many {
            return Err(bad(format!("takes one value, not {}", values.len())));
        }
        // Each value as clap would take it from the command line: its parser says why not.
        for value in values {
            let args = [
                "gpurent".to_owned(),
                command.to_owned(),
                format!("--{key}={value}"),
            ];
            // Only the value's own flaws here: what the options together break (one that
            // requires another) is for the parse of the whole file and command line.
            match root.clone().try_get_matches_from(args) {
                Err(e)
                    if matches!(
                        e.kind(),
                        ErrorKind::InvalidValue
                            | ErrorKind::ValueValidation
                            | ErrorKind::InvalidUtf8
                    ) =>
                {
                    let detail = e.to_string();
                    let first = detail.lines().next().unwrap_or_default();
                    return Err(bad(first.trim_start_matches("error: ").to_owned()));
                }
                _ => {}
            }
        }
        Ok(false)
    }

    fn unknown(&self, key: &str, command: &str, sub: &Command) -> FileError {
        let wanted = key.replace('_', "-").to_ascii_lowercase();
        let hint = sub
            .get_arguments()
            .filter_map(|a| a.get_long())
            .find(|long| *long == wanted || wanted.trim_start_matches("--") == *long)
            .map(|long| format!("; did you mean `{long}`?"))
            .unwrap_or_default();
        FileError::UnknownKey {
            path: self.path.clone(),
            key: key.to_owned(),
            command: command.to_owned(),
            hint,
        }
    }
}

/// A key's argument: the one whose long flag it names (not `--help`, `--version` nor
/// `--config` itself).
fn find_long<'c>(command: &'c Command, key: &str) -> Option<&'c clap::Arg> {
    if matches!(key, "help" | "version" | "config") {
        return None;
    }
    command.get_arguments().find(|a| a.get_long() == Some(key))
}

/// The arguments `arg` cannot be given with, either way round, as (id, long flag).
fn conflicts(scope: &Command, arg: &clap::Arg) -> Vec<(String, String)> {
    let named = |a: &clap::Arg| Some((a.get_id().to_string(), a.get_long()?.to_owned()));
    let mut found: Vec<(String, String)> = scope
        .get_arg_conflicts_with(arg)
        .into_iter()
        .filter_map(named)
        .collect();
    for other in scope.get_arguments() {
        if other.get_id() != arg.get_id()
            && scope
                .get_arg_conflicts_with(other)
                .iter()
                .any(|c| c.get_id() == arg.get_id())
        {
            found.extend(named(other));
        }
    }
    found
}

/// A TOML scalar as a flag's text; Err names the kind it is not.
fn scalar(value: toml::Value) -> Result<String, &'static str> {
    match value {
        toml::Value::String(s) => Ok(s),
        toml::Value::Integer(i) => Ok(i.to_string()),
        toml::Value::Float(f) => Ok(f.to_string()),
        toml::Value::Boolean(b) => Ok(b.to_string()),
        toml::Value::Datetime(d) => Ok(d.to_string()),
        toml::Value::Array(_) => Err("list"),
        toml::Value::Table(_) => Err("table"),
    }
}
