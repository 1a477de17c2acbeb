//! A network namespace with a veth link to the host, for an agent whose link to the control
//! plane a test can cut and heal. Needs root and iproute2; where the machine cannot make one
//! the test says so and is skipped (`GPURENT_TEST_NETNS=1`, which `scripts/test.sh` sets where
//! it can, makes that a failure; `0` skips it).

use std::net::Ipv4Addr;
use std::process::Command;

/// A namespace `ns` linked to the host: the host side has `host_ip`, the namespace `ns_ip`.
pub struct NetNs {
    pub name: String,
    /// The link's end inside the namespace (the one a test cuts).
    inside: String,
    pub host_ip: Ipv4Addr,
}

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("ip: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

impl NetNs {
    /// A fresh namespace and link, or why this machine cannot make one.
    pub fn create() -> Result<NetNs, String> {
        // Names and a /30 of their own, so that tests in parallel never meet.
        let n = std::process::id() % 16_000;
        let name = format!("gpurent-{n}");
        let (inside, outside) = (format!("gpr{n}n"), format!("gpr{n}h"));
        let (a, b) = (
            u8::try_from(n / 64).unwrap_or(0),
            u8::try_from(n % 64).unwrap_or(0),
        );
        let host_ip = Ipv4Addr::new(10, 213, a, b * 4 + 1);
        let ns_ip = Ipv4Addr::new(10, 213, a, b * 4 + 2);
        ip(&["netns", "add", &name])?;
        let ns = NetNs {
            name,
            inside,
            host_ip,
        };
        let host_cidr = format!("{host_ip}/30");
        let ns_cidr = format!("{ns_ip}/30");
        let name = ns.name.as_str();
        ip(&[
            "link", "add", &outside, "type", "veth", "peer", "name", &ns.inside,
        ])?;
        ip(&["link", "set", &ns.inside, "netns", name])?;
        ip(&["addr", "add", &host_cidr, "dev", &outside])?;
        ip(&["link", "set", &outside, "up"])?;
        ip(&["-n", name, "addr", "add", &ns_cidr, "dev", &ns.inside])?;
        ip(&["-n", name, "link", "set", &ns.inside, "up"])?;
        ip(&["-n", name, "link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// `create`, or None with the reason printed where the machine cannot (unless required).
    pub fn create_or_skip() -> Option<NetNs> {
        if std::env::var("GPURENT_TEST_NETNS").as_deref() == Ok("0") {
            eprintln!("SKIPPED: GPURENT_TEST_NETNS=0");
            return None;
        }
        match NetNs::create() {
            Ok(ns) => Some(ns),
            Err(e) if std::env::var("GPURENT_TEST_NETNS").as_deref() == Ok("1") => {
                panic!("GPURENT_TEST_NETNS=1 but no network namespace could be made: {e}")
            }
            Err(e) => {
                eprintln!("SKIPPED: no network namespace here ({e}); needs root and iproute2");
                None
            }
        }
    }

    /// Cuts the link: nothing passes either way until `heal`.
    pub fn cut(&self) {
        ip(&["-n", &self.name, "link", "set", &self.inside, "down"]).expect("cut the link");
    }

    pub fn heal(&self) {
        ip(&["-n", &self.name, "link", "set", &self.inside, "up"]).expect("heal the link");
    }

    /// `ip netns exec NAME`: the program and arguments to run inside.
    pub fn exec_prefix(&self) -> [&str; 3] {
        ["netns", "exec", &self.name]
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        // Deleting the namespace deletes its end of the link, and so the other.
        let _ = ip(&["netns", "del", &self.name]);
    }
}
