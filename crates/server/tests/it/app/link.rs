//! A link between one agent and the control plane that a test can cut: a network partition.

use std::sync::Arc;

/// A TCP proxy between one agent and the control plane whose link can be cut (every
/// connection dropped, new ones refused) and healed: a network partition.
pub(super) struct Link {
    pub(super) name: String,
    cut: Arc<std::sync::atomic::AtomicBool>,
    connections: Arc<std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>>,
    _accept: tokio::task::JoinHandle<()>,
}

impl Link {
    pub(super) async fn to(name: &str, target: std::net::SocketAddr) -> (String, Link) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind proxy");
        let addr = listener.local_addr().expect("proxy addr");
        let cut = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let connections = Arc::new(std::sync::Mutex::new(Vec::new()));
        let (is_cut, open) = (cut.clone(), connections.clone());
        let accept = tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                if is_cut.load(std::sync::atomic::Ordering::SeqCst) {
                    continue;
                }
                let copy = tokio::spawn(async move {
                    if let Ok(mut outbound) = tokio::net::TcpStream::connect(target).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
                open.lock().expect("lock").push(copy);
            }
        });
        (
            format!("http://{addr}"),
            Link {
                name: name.to_owned(),
                cut,
                connections,
                _accept: accept,
            },
        )
    }

    pub(super) fn set_cut(&self, cut: bool) {
        self.cut.store(cut, std::sync::atomic::Ordering::SeqCst);
        if cut {
            for c in self.connections.lock().expect("lock").drain(..) {
                c.abort();
            }
        }
    }
}
