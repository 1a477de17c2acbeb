//! An isolated instance's own network: a namespace from bwrap (`--unshare-net`) that pasta
//! attaches to the node for egress, with no way to its loopback and no port forwarded.

use std::ffi::OsString;
use std::path::PathBuf;

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

/// The tools that attach an instance's namespace to the node's network.
#[derive(Debug, Clone)]
pub struct InstanceNetwork {
    setpriv: PathBuf,
    pasta: PathBuf,
}

impl InstanceNetwork {
    /// pasta and setpriv, or why not (then instances share the node's network).
    pub fn find() -> Result<Self, String> {
        let pasta = system_tool("pasta").ok_or(
            "pasta is not installed (no pasta in /usr/bin or /bin; Debian: apt-get install passt)",
        )?;
        let setpriv = system_tool("setpriv")
            .ok_or("setpriv (util-linux) is not installed (no setpriv in /usr/bin or /bin)")?;
        Ok(InstanceNetwork { setpriv, pasta })
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
}
