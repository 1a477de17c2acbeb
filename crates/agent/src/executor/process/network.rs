//! An isolated instance's own network: a namespace from bwrap (`--unshare-net`) that pasta
//! attaches to the node for egress, with no way to its loopback and no port forwarded.

use std::ffi::OsString;
use std::path::{Component, Path, PathBuf};

use crate::executor::sandbox::system_tool;

/// The instance's address, netmask bits and gateway inside its namespace (slirp4netns' and
/// QEMU's user network): not the node's, so the node's own address is reachable through pasta
/// like any other host's, while `127.0.0.1` stays the instance's own loopback.
pub const ADDRESS: &str = "10.0.2.100";
pub const PREFIX: &str = "24";
pub const GATEWAY: &str = "10.0.2.2";
/// What pasta is told, besides where the namespace is and its pid file: no port forwarded
/// into the namespace or out of it (`-t/-u/-T/-U none`: pasta's defaults forward them
/// all), and the gateway not mapped to the node's loopback (`--no-map-gw`, whose default
/// would hand the instance every service that listens on `127.0.0.1` of the node). It keeps
/// uid 0 (`--runas 0:0`: dropped to `nobody`, pasta can no longer join a namespace that root
/// owns nor open a `/dev/net/tun` that only root may), but `setpriv` leaves it only
/// `CAP_SYS_ADMIN` and `CAP_NET_ADMIN` with `no_new_privs`; once set up, it confines itself to
/// an empty root and a seccomp filter.
pub const PASTA_FLAGS: &str = "--runas 0:0 --quiet --config-net --no-map-gw \
     -t none -u none -T none -U none -a 10.0.2.100 -n 24 -g 10.0.2.2";
/// How `setpriv` starts pasta.
pub const SETPRIV_FLAGS: &str =
    "--inh-caps=-all --bounding-set=-all,+sys_admin,+net_admin --no-new-privs";

/// systemd-resolved's list of the name servers it asks, where the node's own
/// `/etc/resolv.conf` names only its stub on the loopback.
const UPSTREAM_RESOLV_CONF: &str = "/run/systemd/resolve/resolv.conf";

/// Whether a `resolv.conf` names a name server off the loopback: one an instance's own
/// network reaches, as any host's.
fn names_a_reachable_server(text: &str) -> bool {
    text.lines().any(|line| {
        let mut words = line.split_whitespace();
        words.next() == Some("nameserver")
            && words
                .next()
                .and_then(|a| a.parse::<std::net::IpAddr>().ok())
                .is_some_and(|a| !a.is_loopback())
    })
}

/// The instance's `/etc/resolv.conf`: the node's; or, where the node's names only name
/// servers on its loopback (systemd-resolved's `127.0.0.53`, which the namespace cannot
/// reach), the ones that resolver asks (`upstream`), as Docker does. Err: the node's text,
/// and why instances will resolve no names.
pub fn resolv_conf(node: &str, upstream: Option<&str>) -> Result<String, (String, String)> {
    if names_a_reachable_server(node) {
        return Ok(node.to_owned());
    }
    match upstream.filter(|u| names_a_reachable_server(u)) {
        Some(upstream) => Ok(upstream.to_owned()),
        None => Err((
            node.to_owned(),
            format!(
                "the node's /etc/resolv.conf names no name server off its loopback, and \
                 {UPSTREAM_RESOLV_CONF} names none either: instances in their own network \
                 resolve no names (give the node a resolver they can reach)"
            ),
        )),
    }
}

/// Where `/etc/resolv.conf` leads through its symlinks (`/run/systemd/resolve/stub-resolv.conf`
/// on systemd-resolved hosts), followed by name whether or not the target exists: the
/// instance's file is bound there, since bwrap cannot bind over a symlink that leads nowhere
/// in the sandbox (which has no `/run`).
pub fn resolv_conf_target(start: &Path) -> PathBuf {
    let mut path = start.to_path_buf();
    for _ in 0..8 {
        let Ok(target) = std::fs::read_link(&path) else {
            break;
        };
        let joined = match path.parent() {
            Some(parent) if target.is_relative() => parent.join(target),
            _ => target,
        };
        path = lexically_normal(&joined);
    }
    path
}

/// `path` with `.` and `..` taken away by name (no symlink is read).
fn lexically_normal(path: &Path) -> PathBuf {
    let mut out = PathBuf::from("/");
    for part in path.components() {
        match part {
            Component::Normal(name) => out.push(name),
            Component::ParentDir => {
                out.pop();
            }
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    out
}

/// The tools that attach an instance's namespace to the node's network, and the
/// `resolv.conf` its sandbox is given.
#[derive(Debug, Clone)]
pub struct InstanceNetwork {
    setpriv: PathBuf,
    pasta: PathBuf,
    /// (the instance's file, where it is bound in the sandbox)
    resolv_conf: Option<(PathBuf, PathBuf)>,
}

impl InstanceNetwork {
    /// pasta and setpriv, or why not (then instances share the node's network).
    pub fn find() -> Result<Self, String> {
        let pasta = system_tool("pasta").ok_or(
            "pasta is not installed (no pasta in /usr/bin or /bin; Debian: apt-get install passt)",
        )?;
        let setpriv = system_tool("setpriv")
            .ok_or("setpriv (util-linux) is not installed (no setpriv in /usr/bin or /bin)")?;
        Ok(InstanceNetwork {
            setpriv,
            pasta,
            resolv_conf: None,
        })
    }

    /// Writes the instances' `resolv.conf` into the agent's directory `dir` (from the node's
    /// `/etc/resolv.conf`); Err says why it could not.
    pub fn write_resolv_conf(&mut self, dir: &Path) -> Result<(), String> {
        let node = Path::new("/etc/resolv.conf");
        let text = std::fs::read_to_string(node).unwrap_or_default();
        let upstream = std::fs::read_to_string(UPSTREAM_RESOLV_CONF).ok();
        let text = resolv_conf(&text, upstream.as_deref()).unwrap_or_else(|(text, why)| {
            tracing::warn!(%why, "instances may have no DNS");
            text
        });
        let path = dir.join("instance-resolv.conf");
        std::fs::write(&path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        self.resolv_conf = Some((path, resolv_conf_target(node)));
        Ok(())
    }

    /// The instance's `resolv.conf` and where the sandbox binds it.
    pub fn resolv_conf(&self) -> Option<(&Path, &Path)> {
        self.resolv_conf
            .as_ref()
            .map(|(file, at)| (file.as_path(), at.as_path()))
    }

    /// The wrapper's arguments that say how to attach the namespace: setpriv and pasta.
    pub fn wrapper_args(&self) -> [OsString; 2] {
        [self.setpriv.clone().into(), self.pasta.clone().into()]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pasta_forwards_nothing_and_maps_no_gateway() {
        let words: Vec<&str> = PASTA_FLAGS.split_whitespace().collect();
        assert!(words.contains(&"--no-map-gw"));
        for flag in ["-t", "-u", "-T", "-U"] {
            let at = words.iter().position(|w| *w == flag).unwrap();
            assert_eq!(words[at + 1], "none", "{flag}");
        }
        assert!(PASTA_FLAGS.contains(ADDRESS) && PASTA_FLAGS.contains(GATEWAY));
        assert!(PASTA_FLAGS.contains(&format!("-n {PREFIX}")));
    }

    #[test]
    fn a_stub_resolver_on_the_loopback_gives_way_to_the_ones_it_asks() {
        let lan = "nameserver 10.1.2.3\nsearch lab.example\n";
        assert_eq!(resolv_conf(lan, None).unwrap(), lan);
        let stub = "nameserver 127.0.0.53\noptions edns0 trust-ad\nsearch lab.example\n";
        let upstream = "nameserver 192.0.2.53\nnameserver 2001:db8::53\nsearch lab.example\n";
        assert_eq!(resolv_conf(stub, Some(upstream)).unwrap(), upstream);
        let (kept, why) = resolv_conf(stub, None).unwrap_err();
        assert_eq!(kept, stub);
        assert!(why.contains("no name server off its loopback"), "{why}");
        assert!(resolv_conf("nameserver ::1\n", Some("nameserver 127.0.0.1\n")).is_err());
    }

    #[test]
    fn the_file_is_bound_where_the_nodes_symlinks_lead() {
        let dir = tempfile::tempdir().unwrap();
        let etc = dir.path().join("etc");
        std::fs::create_dir(&etc).unwrap();
        let link = etc.join("resolv.conf");
        std::os::unix::fs::symlink("../run/systemd/resolve/stub-resolv.conf", &link).unwrap();
        assert_eq!(
            resolv_conf_target(&link),
            dir.path().join("run/systemd/resolve/stub-resolv.conf")
        );
        let plain = etc.join("hosts");
        std::fs::write(&plain, "").unwrap();
        assert_eq!(resolv_conf_target(&plain), plain);
        assert_eq!(
            lexically_normal(Path::new("/etc/../run/./x")),
            PathBuf::from("/run/x")
        );
    }
}
