//! Where a webhook may point: an http(s) URL whose host resolves only to public addresses
//! (never the control plane's own network: loopback, private ranges, link-local and cloud
//! metadata), unless the operator allows private ones (`--notifications-allow-private`).

use std::net::{IpAddr, SocketAddr};

use reqwest::Url;

/// The longest URL kept.
pub(crate) const MAX_URL: usize = 2048;
/// How long a webhook's host name may take to resolve.
const LOOKUP_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// Why a webhook's URL is refused.
#[derive(Debug, thiserror::Error)]
pub(crate) enum TargetError {
    #[error("the URL is longer than {MAX_URL} characters")]
    TooLong,
    #[error("{0:?} is not a URL: {1}")]
    Parse(String, String),
    #[error("a webhook is http:// or https://, not {0}://")]
    Scheme(String),
    #[error("a webhook URL carries no user name or password: sign with the secret instead")]
    Credentials,
    #[error("the URL has no host")]
    NoHost,
    /// What the resolver said is logged, not answered: it would map the control plane's
    /// network.
    #[error("{host} does not resolve to an address")]
    Resolve { host: String },
    #[error(
        "{host} is not a public address; webhooks go to public addresses only (an operator \
         allows private ones with --notifications-allow-private)"
    )]
    Private { host: String },
}

/// Whether `ip` is reachable on the public internet: not loopback, unspecified, private
/// (RFC 1918, fc00::/7), shared (100.64/10), link-local (169.254/16, fe80::/10, the clouds'
/// metadata), multicast, broadcast or reserved. An IPv4-mapped IPv6 address is its IPv4's.
pub(crate) fn is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            let [a, b, ..] = v4.octets();
            !(v4.is_loopback()
                || v4.is_unspecified()
                || v4.is_private()
                || v4.is_link_local()
                || v4.is_multicast()
                || v4.is_broadcast()
                || v4.is_documentation()
                || a == 0
                || a >= 240
                || (a == 100 && (64..128).contains(&b))
                || (a == 192 && b == 0 && v4.octets()[2] == 0)
                || (a == 198 && (b == 18 || b == 19))
                || (a == 192 && b == 88 && v4.octets()[2] == 99))
        }
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return is_public(IpAddr::V4(v4));
            }
            let s = v6.segments();
            // IPv4-compatible (::a.b.c.d), NAT64 (64:ff9b::/96, 64:ff9b:1::/48), 6to4
            // (2002::/16) and Teredo (2001::/32) carry an IPv4 address that may be private:
            // refused whole, as are site-local (fec0::/10) and discard (100::/64).
            let embeds_v4 = s[..6] == [0; 6]
                || (s[0] == 0x64 && s[1] == 0xff9b)
                || s[0] == 0x2002
                || (s[0] == 0x2001 && s[1] == 0);
            !(v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                || embeds_v4
                || (s[0] & 0xfe00) == 0xfc00
                || (s[0] & 0xffc0) == 0xfe80
                || (s[0] & 0xffc0) == 0xfec0
                || (s[0] == 0x100 && s[1..4] == [0; 3])
                || (s[0] == 0x2001 && s[1] == 0x0db8))
        }
    }
}

/// The URL, checked for its form (not yet where it leads).
pub(crate) fn parse(url: &str) -> Result<Url, TargetError> {
    if url.len() > MAX_URL {
        return Err(TargetError::TooLong);
    }
    let parsed = Url::parse(url).map_err(|e| TargetError::Parse(url.to_owned(), e.to_string()))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(TargetError::Scheme(parsed.scheme().to_owned()));
    }
    if !parsed.username().is_empty() || parsed.password().is_some() {
        return Err(TargetError::Credentials);
    }
    if parsed.host_str().is_none_or(str::is_empty) {
        return Err(TargetError::NoHost);
    }
    Ok(parsed)
}

/// Where `url` leads now: its host's addresses, each public unless `allow_private`. The
/// caller connects to one of these, so that a name that resolves elsewhere a moment later
/// (DNS rebinding) changes nothing.
pub(crate) async fn resolve(
    url: &Url,
    allow_private: bool,
) -> Result<Vec<SocketAddr>, TargetError> {
    let host = url.host_str().ok_or(TargetError::NoHost)?;
    let port = url.port_or_known_default().unwrap_or(80);
    // An IPv6 literal is written in brackets in a URL.
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    let unresolved = || TargetError::Resolve {
        host: host.to_owned(),
    };
    let found = tokio::time::timeout(LOOKUP_TIMEOUT, tokio::net::lookup_host((bare, port)))
        .await
        .map_err(|_| {
            tracing::info!(%host, "webhook host: no answer from the resolver");
            unresolved()
        })?
        .map_err(|e| {
            tracing::info!(%host, error = %e, "webhook host does not resolve");
            unresolved()
        })?;
    let addrs: Vec<SocketAddr> = found.collect();
    if addrs.is_empty() {
        return Err(unresolved());
    }
    if !allow_private {
        if let Some(bad) = addrs.iter().find(|a| !is_public(a.ip())) {
            tracing::info!(%host, ip = %bad.ip(), "webhook host refused: a private address");
            return Err(TargetError::Private {
                host: host.to_owned(),
            });
        }
    }
    Ok(addrs)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn private_and_special_addresses_are_not_public() {
        for ip in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "255.255.255.255",
            "224.0.0.1",
            "::1",
            "::",
            "fd00::1",
            "fe80::1",
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
            "::7f00:1",
            "64:ff9b::a00:1",
            "2002:a00:1::1",
            "2001:0:1::1",
            "fec0::1",
            "198.18.0.1",
        ] {
            assert!(!is_public(ip.parse().unwrap()), "{ip}");
        }
        for ip in ["1.1.1.1", "8.8.8.8", "2606:4700::1111", "::ffff:8.8.8.8"] {
            assert!(is_public(ip.parse().unwrap()), "{ip}");
        }
    }

    #[test]
    fn urls_are_http_without_credentials() {
        assert!(parse("https://hooks.example.com/x").is_ok());
        assert!(matches!(
            parse("ftp://example.com"),
            Err(TargetError::Scheme(_))
        ));
        assert!(matches!(
            parse("https://u:p@example.com/"),
            Err(TargetError::Credentials)
        ));
        assert!(matches!(parse("not a url"), Err(TargetError::Parse(..))));
        let long = format!("https://example.com/{}", "a".repeat(MAX_URL));
        assert!(matches!(parse(&long), Err(TargetError::TooLong)));
    }

    #[tokio::test]
    async fn a_loopback_url_is_refused_unless_allowed() {
        let url = parse("http://127.0.0.1:9/hook").unwrap();
        assert!(matches!(
            resolve(&url, false).await,
            Err(TargetError::Private { .. })
        ));
        assert_eq!(resolve(&url, true).await.unwrap().len(), 1);
        let url = parse("http://localhost:9/hook").unwrap();
        assert!(resolve(&url, false).await.is_err());
    }
}
