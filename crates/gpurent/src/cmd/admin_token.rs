//! Which token the CLI sends when it is given none: the admin token of the data dir, and only
//! to the server that data dir belongs to.

/// Without --token, the admin token of the data dir (`GPURENT_DATA_DIR`, else
/// `./gpurent-data`), but only for the server that data dir belongs to: the URL its `up` or
/// `server` wrote to `server.url`. Any other `--server` gets no token (a server, or whoever
/// listens at a mistyped address, must never receive the admin's), and a refusal says why.
pub fn default_token(server: &str) -> DefaultToken {
    let dir = std::env::var("GPURENT_DATA_DIR").unwrap_or_else(|_| "./gpurent-data".to_owned());
    let dir = std::path::Path::new(&dir);
    let path = dir.join("admin.token");
    let Ok(token) = std::fs::read_to_string(&path) else {
        return DefaultToken::None;
    };
    let url_path = dir.join(super::lock::SERVER_URL_FILE);
    // A server killed with kill -9 leaves its URL behind; whoever listens there later must not
    // get the token. Its lock, which the kernel released, tells.
    let stale = super::lock::is_held(dir) == Some(false);
    let owner = std::fs::read_to_string(&url_path)
        .ok()
        .filter(|_| !stale)
        .map(|u| u.trim().to_owned());
    match owner {
        Some(owner) if same_server(server, &owner) => {
            eprintln!(
                "gpurent: no --token given; using the admin token in {}",
                path.display()
            );
            DefaultToken::Admin(token.trim().to_owned())
        }
        owner => {
            let whose = match owner {
                Some(owner) => format!("is only sent to {owner}, the server of that data dir"),
                None if stale => format!(
                    "is only sent to the server of that data dir, which is not running (its lock {} is free)",
                    dir.join(super::lock::LOCK_FILE).display()
                ),
                None => format!(
                    "is only sent to the server named in {}, and there is none (is it running?)",
                    url_path.display()
                ),
            };
            let hint = format!(
                "no --token given, and the admin token in {} {whose}, not to {server}: pass \
                 --token (or set GPURENT_TOKEN)",
                path.display()
            );
            DefaultToken::Withheld(hint)
        }
    }
}

pub enum DefaultToken {
    Admin(String),
    /// Not sent: why, for the error when the server asks for a token.
    Withheld(String),
    None,
}

/// Whether two URLs name one server: scheme, host and port (the default one when not given)
/// and path, as the `url` crate normalises them (case, trailing slash). Names are not
/// resolved: `localhost` and `127.0.0.1` are different servers to this test.
fn same_server(a: &str, b: &str) -> bool {
    let key = |s: &str| {
        reqwest::Url::parse(s).ok().map(|u| {
            (
                u.scheme().to_owned(),
                u.host_str().map(str::to_owned),
                u.port_or_known_default(),
                u.path().trim_end_matches('/').to_owned(),
                u.username().to_owned(),
                u.password().map(str::to_owned),
            )
        })
    };
    matches!((key(a), key(b)), (Some(a), Some(b)) if a == b)
}

#[cfg(test)]
mod tests {
    use super::same_server;

    #[test]
    fn one_server_is_one_scheme_host_port_and_path() {
        let own = "http://127.0.0.1:8080";
        for same in [
            "http://127.0.0.1:8080/",
            "HTTP://127.0.0.1:8080",
            "http://127.0.0.1:8080//",
        ] {
            assert!(same_server(same, own), "{same}");
        }
        assert!(same_server(
            "https://Example.com/",
            "https://example.com:443"
        ));
        for other in [
            "http://127.0.0.1:8081",
            "https://127.0.0.1:8080",
            "http://localhost:8080",
            "http://127.0.0.1:8080/other",
            "http://evil@127.0.0.1:8080",
            "127.0.0.1:8080",
            "",
        ] {
            assert!(!same_server(other, own), "{other}");
        }
    }
}
