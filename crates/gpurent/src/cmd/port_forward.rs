//! `gpurent port-forward ID [LOCAL:]REMOTE`: 127.0.0.1:LOCAL forwarded to port REMOTE inside
//! a running reservation, each connection a direct-tcpip channel of one SSH connection.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::{TcpListener, TcpStream};

use super::ssh_client::{self, Connection};
use crate::api_client::{ApiClient, CliError};
use crate::cli::PortForwardArgs;
use crate::output::print_json_line;

/// `[LOCAL:]REMOTE`: (local, remote); LOCAL defaults to REMOTE, and may be 0 (any free one).
pub fn parse_ports(text: &str) -> Result<(u16, u16), CliError> {
    let bad = || {
        CliError::new(
            "invalid_value",
            format!("{text:?}: give [LOCAL:]REMOTE, ports 1 to 65535 (LOCAL 0: any free one)"),
        )
    };
    let port = |s: &str| s.parse::<u16>().map_err(|_| bad());
    let (local, remote) = match text.split_once(':') {
        Some((local, remote)) => (port(local)?, port(remote)?),
        None => {
            let remote = port(text)?;
            (remote, remote)
        }
    };
    if remote == 0 {
        return Err(bad());
    }
    Ok((local, remote))
}

/// Listens on 127.0.0.1:`local` and forwards every connection through `connection` to
/// `remote` in the instance until `stop` resolves or the SSH connection ends. `ready` gets
/// the bound address once it listens.
pub async fn forward(
    connection: Connection,
    local: u16,
    remote: u16,
    ready: impl FnOnce(SocketAddr),
    stop: impl std::future::Future<Output = ()>,
) -> Result<(), CliError> {
    let listener = TcpListener::bind(("127.0.0.1", local)).await.map_err(|e| {
        CliError::new(
            "local_port",
            format!("cannot listen on 127.0.0.1:{local}: {e} (give another LOCAL port, or 0)"),
        )
    })?;
    let bound = listener
        .local_addr()
        .map_err(|e| CliError::new("local_port", e.to_string()))?;
    ready(bound);
    let connection = Arc::new(connection);
    tokio::pin!(stop);
    let mut watchdog = tokio::time::interval(std::time::Duration::from_secs(1));
    loop {
        tokio::select! {
            () = &mut stop => return Ok(()),
            _ = watchdog.tick() => {
                if connection.is_closed() {
                    return Err(CliError::new(
                        "ssh_failed",
                        "the SSH connection to the reservation ended",
                    ));
                }
            }
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    Ok(pair) => pair,
                    Err(e) => {
                        // Out of file descriptors: wait instead of spinning.
                        eprintln!("cannot accept a connection: {e}");
                        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                        continue;
                    }
                };
                tokio::spawn(pipe(connection.clone(), stream, peer, remote));
            }
        }
    }
}

/// One forwarded connection, both ways, until both sides are done.
async fn pipe(connection: Arc<Connection>, mut stream: TcpStream, peer: SocketAddr, remote: u16) {
    let _ = stream.set_nodelay(true);
    let channel = match connection.direct_tcpip(remote, peer).await {
        Ok(channel) => channel,
        Err(e) => {
            eprintln!("cannot reach port {remote} in the instance for {peer}: {e}");
            return;
        }
    };
    let mut channel = channel.into_stream();
    if let Err(e) = tokio::io::copy_bidirectional(&mut stream, &mut channel).await {
        tracing::debug!(%peer, error = %e, "forwarded connection ended");
    }
}

pub async fn run(api: &ApiClient, args: PortForwardArgs, json: bool) -> Result<(), CliError> {
    let (local, remote) = parse_ports(&args.ports)?;
    let target = super::ssh::target(api, &args.id, &args.ssh).await?;
    let connection = ssh_client::connect(&target, args.ssh.identity.as_deref()).await?;
    let id = args.id.clone();
    let mut printed = Ok(());
    let ready = |bound: SocketAddr| {
        // The contract's line, on stderr; with --json also one document on stdout.
        eprintln!(
            "forwarding 127.0.0.1:{} -> {}:{remote}",
            bound.port(),
            crate::output::escape_control(&id)
        );
        if json {
            printed = print_json_line(&serde_json::json!({
                "local": format!("127.0.0.1:{}", bound.port()),
                "local_port": bound.port(),
                "reservation": id,
                "remote_port": remote,
            }));
        }
    };
    let stop = async {
        if let Err(e) = super::shutdown_signal().await {
            eprintln!("{e:#}");
        }
    };
    forward(connection, local, remote, ready, stop).await?;
    printed
}

#[cfg(test)]
mod tests {
    use super::parse_ports;

    #[test]
    fn ports_are_local_and_remote() {
        assert_eq!(parse_ports("8888").unwrap(), (8888, 8888));
        assert_eq!(parse_ports("0:8888").unwrap(), (0, 8888));
        assert_eq!(parse_ports("9000:80").unwrap(), (9000, 80));
        for bad in ["", "0", "x", "1:2:3", "70000", "80:0"] {
            assert!(parse_ports(bad).is_err(), "{bad:?}");
        }
    }
}
