//! The control plane's background jobs, run by the maintenance loop rather than by a request:
//! the loop itself (`maintenance`), elastic capacity (`elastic`) and the alert webhook (`alerts`).

pub(crate) mod alerts;
pub(crate) mod elastic;
pub(crate) mod maintenance;
