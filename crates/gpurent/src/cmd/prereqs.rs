//! What `up` installs on a fresh machine before its node starts: bubblewrap (which the process
//! executor isolates instances with) and passt (their own network), with the system's package
//! manager, as root, saying so. Nothing is installed for an ordinary user, with `--no-install`,
//! for `--executor sim` or `docker`, or where the tools are there already.

use std::process::{Command, Stdio};

use gpurent_agent::executor::{running_as_root, system_tool};

use crate::cli::{ExecutorKind, NodeArgs};

/// A tool the process executor needs, and the Debian package that has it.
struct Tool {
    program: &'static str,
    package: &'static str,
    /// What instances lose without it.
    without: &'static str,
}

const TOOLS: [Tool; 2] = [
    Tool {
        program: "bwrap",
        package: "bubblewrap",
        without: "instances cannot be isolated",
    },
    Tool {
        program: "pasta",
        package: "passt",
        without: "instances share the node's network",
    },
];

/// Installs the process executor's missing tools when `up` can and may: as root, with
/// apt-get, unless `no_install`. Prints on stderr what it does and why; a failed install is
/// a warning (the executor then says at start what it cannot do, and what to do).
pub fn install_missing(node: &NodeArgs, no_install: bool) {
    if matches!(node.executor, ExecutorKind::Sim | ExecutorKind::Docker) {
        return;
    }
    let missing: Vec<&Tool> = TOOLS
        .iter()
        .filter(|t| system_tool(t.program).is_none())
        .collect();
    if missing.is_empty() || !running_as_root() {
        // An ordinary user gets the executor's own refusal, which says what to do.
        return;
    }
    let packages = missing.iter().map(|t| t.package).collect::<Vec<_>>();
    if no_install {
        eprintln!(
            "gpurent: not installing {} (--no-install): {}",
            packages.join(" and "),
            missing
                .iter()
                .map(|t| t.without)
                .collect::<Vec<_>>()
                .join(", ")
        );
        return;
    }
    let Some(apt) = system_tool("apt-get") else {
        eprintln!(
            "gpurent: {} missing and this system has no apt-get: install {} with its package \
             manager ({})",
            missing
                .iter()
                .map(|t| t.program)
                .collect::<Vec<_>>()
                .join(" and "),
            packages.join(" and "),
            missing
                .iter()
                .map(|t| t.without)
                .collect::<Vec<_>>()
                .join(", ")
        );
        return;
    };
    for tool in missing {
        eprintln!(
            "gpurent: installing {} with apt-get (it has `{}`; without it {}); --no-install \
             skips this",
            tool.package, tool.program, tool.without
        );
        match apt_install(&apt, tool.package) {
            Ok(()) if system_tool(tool.program).is_some() => {
                eprintln!("gpurent: installed {}", tool.package);
            }
            Ok(()) => eprintln!(
                "gpurent: apt-get installed {} but `{}` is still not in /usr/bin: {}",
                tool.package, tool.program, tool.without
            ),
            Err(why) => eprintln!(
                "gpurent: could not install {}: {why}; {}",
                tool.package, tool.without
            ),
        }
    }
}

/// `apt-get install -y PACKAGE`, and once more after `apt-get update` when the first try
/// fails (a fresh machine often has no package lists yet). apt's own progress goes to stderr.
fn apt_install(apt: &std::path::Path, package: &str) -> Result<(), String> {
    let install = || {
        run_apt(
            apt,
            &["install", "-y", "-q", "--no-install-recommends", package],
        )
    };
    if install().is_ok() {
        return Ok(());
    }
    eprintln!("gpurent: apt-get could not install {package} yet; updating the package lists");
    run_apt(apt, &["update", "-q"])?;
    install()
}

fn run_apt(apt: &std::path::Path, args: &[&str]) -> Result<(), String> {
    // stdout (apt's progress) to our stderr: `up`'s stdout is for its result lines.
    let status = Command::new(apt)
        .args(args)
        .env("DEBIAN_FRONTEND", "noninteractive")
        .stdin(Stdio::null())
        .stdout(std::io::stderr())
        .status()
        .map_err(|e| format!("cannot run {}: {e}", apt.display()))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("`apt-get {}` failed ({status})", args.join(" ")))
    }
}
