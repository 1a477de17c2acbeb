//! The TCP proxies between each replica and the PostgreSQL nodes: cutting one replica from the
//! database (its connections dropped, new ones refused) while the others keep theirs.

use std::sync::Arc;

use anyhow::Context;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// One replica's way to the database: a listener per PostgreSQL node, all cut together.
#[derive(Debug)]
pub struct ReplicaProxy {
    /// The listeners' ports, in the order of the nodes.
    pub ports: Vec<u16>,
    cut: Arc<watch::Sender<bool>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl ReplicaProxy {
    /// Listens on a free loopback port for each of `targets` (PostgreSQL's ports).
    pub async fn start(targets: &[u16]) -> anyhow::Result<Self> {
        let cut = Arc::new(watch::Sender::new(false));
        let mut ports = Vec::new();
        let mut tasks = Vec::new();
        for &target in targets {
            let listener = TcpListener::bind(("127.0.0.1", 0))
                .await
                .context("listen for a database proxy")?;
            ports.push(listener.local_addr()?.port());
            tasks.push(tokio::spawn(accept(listener, target, cut.clone())));
        }
        Ok(ReplicaProxy { ports, cut, tasks })
    }

    /// The replica's database URL: every node through this proxy, read-write.
    pub fn database_url(&self) -> String {
        let hosts: Vec<String> = self
            .ports
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        format!(
            "postgres://postgres@{}/gpurent?sslmode=disable&target_session_attrs=read-write",
            hosts.join(",")
        )
    }

    /// Cuts the replica from the database (every connection dropped, new ones closed at
    /// once), or lets it through again.
    pub fn set_cut(&self, cut: bool) {
        self.cut.send_replace(cut);
    }
}

impl Drop for ReplicaProxy {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

async fn accept(listener: TcpListener, target: u16, cut: Arc<watch::Sender<bool>>) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            continue;
        };
        if *cut.borrow() {
            drop(client);
            continue;
        }
        let mut cut = cut.subscribe();
        tokio::spawn(async move {
            let Ok(mut server) = TcpStream::connect(("127.0.0.1", target)).await else {
                return;
            };
            let mut client = client;
            let _ = client.set_nodelay(true);
            let _ = server.set_nodelay(true);
            tokio::select! {
                _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                _ = cut.wait_for(|c| *c) => {}
            }
        });
    }
}
