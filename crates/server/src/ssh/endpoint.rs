//! Where tenants reach the SSH endpoint and which host key they pin: what `GET /api/v1/ssh`
//! and a running reservation's `"ssh"` tell clients.

use std::net::SocketAddr;

use russh::keys::ssh_key::{HashAlg, PublicKey};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// A host (and maybe a port) that clients are told to connect to instead of the listen
/// address (`--ssh-advertise HOST[:PORT]`, behind NAT or a load balancer).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Advertise {
    pub host: String,
    pub port: Option<u16>,
}

impl std::str::FromStr for Advertise {
    type Err = String;

    /// `HOST`, `HOST:PORT`, `[V6]` or `[V6]:PORT`; a bare IPv6 address without a port too.
    fn from_str(text: &str) -> Result<Self, String> {
        let bad = |why: &str| format!("{text:?} is not HOST[:PORT]: {why}");
        let (host, port) = if let Some(rest) = text.strip_prefix('[') {
            let (host, after) = rest.split_once(']').ok_or_else(|| bad("no closing ]"))?;
            match after {
                "" => (host, None),
                _ => (
                    host,
                    Some(after.strip_prefix(':').ok_or_else(|| bad("junk after ]"))?),
                ),
            }
        } else if text.matches(':').count() > 1 {
            (text, None)
        } else {
            match text.split_once(':') {
                Some((host, port)) => (host, Some(port)),
                None => (text, None),
            }
        };
        if !valid_host(host) {
            return Err(bad("a host name or IP address"));
        }
        let port = port
            .map(|p| p.parse::<u16>().ok().filter(|p| *p > 0))
            .map(|p| p.ok_or_else(|| bad("the port is 1 to 65535")))
            .transpose()?;
        Ok(Advertise {
            host: host.to_owned(),
            port,
        })
    }
}

/// A host name or IP literal that is safe to put into a command line and an ssh_config:
/// letters, digits, `.`, `-`, `_` and `:` (IPv6), at most 253 characters.
pub fn valid_host(host: &str) -> bool {
    !host.is_empty()
        && host.len() <= 253
        && !host.starts_with('-')
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_' | b':'))
}

/// The SSH endpoint as this process serves it; set once it listens.
#[derive(Debug, Clone)]
pub struct SshEndpoint {
    /// The bound address.
    pub addr: SocketAddr,
    pub host_key: PublicKey,
    pub advertise: Option<Advertise>,
}

/// How to reach the control plane's SSH endpoint, and the host key to trust there.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema, PartialEq, Eq)]
pub struct SshEndpointInfo {
    pub host: String,
    pub port: u16,
    /// The host key's public half as an OpenSSH line (`ssh-ed25519 AAAA...`), for a
    /// known_hosts file.
    pub host_key: String,
    /// Its SHA-256 fingerprint as `ssh-keygen -lf` prints it (`SHA256:...`).
    pub fingerprint: String,
}

impl SshEndpoint {
    /// What a client that reached the API as `request_host` (its Host header, without the
    /// port) is told: the advertised host and port where given, else that host with the port
    /// SSH listens on (an unusable Host header: the listen address).
    pub fn info(&self, request_host: Option<&str>) -> SshEndpointInfo {
        let listen_host = || {
            if self.addr.ip().is_unspecified() {
                "127.0.0.1".to_owned()
            } else {
                self.addr.ip().to_string()
            }
        };
        let host = match &self.advertise {
            Some(a) => a.host.clone(),
            None => request_host
                .filter(|h| valid_host(h))
                .map_or_else(listen_host, str::to_owned),
        };
        let port = self
            .advertise
            .as_ref()
            .and_then(|a| a.port)
            .unwrap_or(self.addr.port());
        let host_key = self
            .host_key
            .to_openssh()
            .map(|line| {
                // Without the comment: the key is what is pinned.
                line.split_whitespace()
                    .take(2)
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .unwrap_or_default();
        SshEndpointInfo {
            host,
            port,
            host_key,
            fingerprint: self.host_key.fingerprint(HashAlg::Sha256).to_string(),
        }
    }
}

/// The host of a Host header value (`name`, `name:port`, `[v6]:port`), without the port.
pub fn host_of(header: &str) -> Option<&str> {
    let header = header.trim();
    if let Some(rest) = header.strip_prefix('[') {
        return rest.split_once(']').map(|(h, _)| h);
    }
    let host = header.rsplit_once(':').map_or(header, |(h, _)| h);
    (!host.is_empty()).then_some(host)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn advertise_takes_hosts_ports_and_v6_and_refuses_junk() {
        let a: Advertise = "gpu.example.com:2200".parse().unwrap();
        assert_eq!(a.host, "gpu.example.com");
        assert_eq!(a.port, Some(2200));
        let a: Advertise = "gpu.example.com".parse().unwrap();
        assert_eq!(a.port, None);
        let a: Advertise = "[2001:db8::1]:22".parse().unwrap();
        assert_eq!((a.host.as_str(), a.port), ("2001:db8::1", Some(22)));
        let a: Advertise = "2001:db8::1".parse().unwrap();
        assert_eq!((a.host.as_str(), a.port), ("2001:db8::1", None));
        for bad in [
            "",
            "a b",
            "host:0",
            "host:x",
            "-oProxyCommand=x",
            "[::1",
            "h;ls",
        ] {
            assert!(bad.parse::<Advertise>().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn host_headers_lose_their_port() {
        assert_eq!(host_of("127.0.0.1:8080"), Some("127.0.0.1"));
        assert_eq!(host_of("example.com"), Some("example.com"));
        assert_eq!(host_of("[::1]:8080"), Some("::1"));
        assert_eq!(host_of(""), None);
    }
}
