//! Local port forwarding (`ssh -L`, direct-tcpip) and published ports: a connection to
//! 127.0.0.1:PORT as the instance sees it, in its network namespace (an isolated process's
//! own, or a container's: the socket is made on a short-lived thread that joined it).

use std::net::{Ipv4Addr, SocketAddr};
use std::os::fd::AsFd;
use std::time::Duration;

use async_trait::async_trait;

use super::{Entered, EntryControl, EntryError, ExitStatus};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

fn refused(port: u16, reservation_id: &str, e: std::io::Error) -> EntryError {
    match e.kind() {
        std::io::ErrorKind::ConnectionRefused => EntryError::NothingListens { port },
        _ => EntryError::io("connect to a port", reservation_id, e),
    }
}

/// Connects to 127.0.0.1:PORT in the network namespace of process `netns_of` (None: the
/// agent's own).
pub async fn connect(
    reservation_id: &str,
    port: u16,
    netns_of: Option<i32>,
) -> Result<Entered, EntryError> {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let stream = match netns_of {
        None => tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::TcpStream::connect(addr))
            .await
            .map_err(|_| refused(port, reservation_id, std::io::ErrorKind::TimedOut.into()))?
            .map_err(|e| refused(port, reservation_id, e))?,
        Some(pid) => {
            let ns = std::fs::File::open(format!("/proc/{pid}/ns/net"))
                .map_err(|e| EntryError::io("join the instance's network", reservation_id, e))?;
            // setns(CLONE_NEWNET) changes only the calling thread's namespace: a thread of
            // its own, which ends with the connect, never a runtime worker.
            let std_stream = tokio::task::spawn_blocking(move || {
                std::thread::spawn(move || -> std::io::Result<std::net::TcpStream> {
                    nix::sched::setns(ns.as_fd(), nix::sched::CloneFlags::CLONE_NEWNET)?;
                    std::net::TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT)
                })
                .join()
                .unwrap_or_else(|_| Err(std::io::Error::other("the connecting thread panicked")))
            })
            .await
            .map_err(|e| {
                EntryError::io(
                    "connect to a port",
                    reservation_id,
                    std::io::Error::other(e),
                )
            })?
            .map_err(|e| refused(port, reservation_id, e))?;
            std_stream
                .set_nonblocking(true)
                .map_err(|e| EntryError::io("connect to a port", reservation_id, e))?;
            tokio::net::TcpStream::from_std(std_stream)
                .map_err(|e| EntryError::io("connect to a port", reservation_id, e))?
        }
    };
    let (read, write) = stream.into_split();
    Ok(Entered {
        stdin: Box::new(write),
        stdout: Box::new(read),
        stderr: None,
        control: Box::new(TcpControl),
    })
}

struct TcpControl;

#[async_trait]
impl EntryControl for TcpControl {
    async fn resize(&self, _cols: u16, _rows: u16) -> Result<(), EntryError> {
        Ok(())
    }

    async fn signal(&self, _name: &str) -> Result<(), EntryError> {
        Ok(())
    }

    async fn wait(&mut self) -> Result<ExitStatus, EntryError> {
        Ok(ExitStatus::Code(0))
    }
}
