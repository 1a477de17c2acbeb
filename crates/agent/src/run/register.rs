//! Joining: the node's identity from the data dir, or a registration with the join token (and,
//! over TLS, the node's own key and the certificate the control plane signs for it).

use gpurent_types::agent::RegisterNode;

use super::Agent;
use crate::tls;
use crate::{AgentError, NodeIdentity};

impl Agent {
    /// Loads the node identity from the data dir, or registers with the join token.
    pub async fn identity(&self) -> Result<NodeIdentity, AgentError> {
        if let Some(identity) = NodeIdentity::load(&self.config.data_dir)? {
            tracing::info!(node_id = %identity.node_id, name = %identity.name, "resuming node identity");
            return Ok(identity);
        }
        let join_token = self
            .config
            .join_token
            .clone()
            .ok_or_else(|| AgentError::NoJoinToken {
                dir: self.config.data_dir.clone(),
            })?;
        // Over TLS the node makes its key here and sends only a CSR: the control plane
        // signs the client certificate the node presents from then on (mutual TLS).
        let key_and_csr = if self.config.server.starts_with("https://") {
            Some(tls::new_key_and_csr(&self.config.name)?)
        } else {
            None
        };
        let registered = self
            .client
            .register(&RegisterNode {
                join_token,
                name: self.config.name.clone(),
                executor: self.executor.name().to_owned(),
                gpu_backend: self.gpus.name().to_owned(),
                gpus: self.gpus.discover()?,
                host: Some(self.host_facts()),
                csr: key_and_csr.as_ref().map(|(_, csr)| csr.clone()),
            })
            .await?;
        if let (Some((key, _)), Some(cert)) = (&key_and_csr, &registered.certificate) {
            NodeIdentity::save_certificate(
                &self.config.data_dir,
                key,
                cert,
                registered.ca_certificate.as_deref(),
            )?;
            tracing::info!("node certificate received: mutual TLS from now on");
        }
        let identity = NodeIdentity {
            node_id: registered.node_id,
            node_token: registered.node_token,
            name: self.config.name.clone(),
        };
        identity.save(&self.config.data_dir)?;
        tracing::info!(node_id = %identity.node_id, name = %identity.name, "registered as a new node");
        Ok(identity)
    }
}
