//! What one client may take of the HTTP server: how long it may be slow to send, and how many
//! connections it (and everyone together) may hold open.

use std::time::Duration;

/// Open files kept back from the connection cap for the database, log files, certificates
/// and outbound calls (webhooks, scale hooks).
const RESERVED_FILES: u64 = 256;
/// The most connections the automatic cap allows, whatever the open-files limit: each costs
/// buffers (some KiB) even when idle.
const AUTO_MAX_CONNECTIONS: u64 = 50_000;
/// The longest any timeout may be (longer ones are taken as this): deadlines stay far from
/// the end of the clock.
const LONGEST_TIMEOUT: Duration = Duration::from_secs(24 * 3600);

/// Timeouts and connection caps of the HTTP listener; the defaults suit production.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HttpLimits {
    /// A new connection's TLS handshake and first request header, and a request header from
    /// its first byte, must arrive within this (`--header-timeout-secs`, 10).
    pub header_timeout: Duration,
    /// A request's body must arrive within this from its header, plus a second for each KiB
    /// received, or it is answered 408; a handler still working after that (an agent's long
    /// poll) is never cut (`--body-timeout-secs`, 30).
    pub body_timeout: Duration,
    /// A kept-alive connection that sends no new request for this long is closed
    /// (`--idle-timeout-secs`, 30).
    pub idle_timeout: Duration,
    /// Open connections in all; `None`: what the process's open-files limit allows, less
    /// what the server needs for itself, at most 50,000 (`--max-connections`).
    pub max_connections: Option<usize>,
    /// Open connections from one client address (an IPv6 /64 counts as one address);
    /// `None`: no cap, behind a proxy (`--max-connections-per-ip`, 256; 0 turns it off).
    pub max_connections_per_ip: Option<usize>,
}

impl Default for HttpLimits {
    fn default() -> Self {
        HttpLimits {
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(30),
            max_connections: None,
            max_connections_per_ip: Some(256),
        }
    }
}

impl HttpLimits {
    /// These limits with each timeout at most a day.
    pub(super) fn bounded(self) -> Self {
        HttpLimits {
            header_timeout: self.header_timeout.min(LONGEST_TIMEOUT),
            body_timeout: self.body_timeout.min(LONGEST_TIMEOUT),
            idle_timeout: self.idle_timeout.min(LONGEST_TIMEOUT),
            ..self
        }
    }

    /// The cap on open connections: the configured one, or one below the open-files limit
    /// so that accepting never fails with "too many open files".
    pub fn connection_cap(&self) -> usize {
        if let Some(cap) = self.max_connections {
            return cap;
        }
        let files = super::nofile::open_files_limit().unwrap_or(1024);
        let cap = files
            .saturating_sub(RESERVED_FILES)
            .clamp(1, AUTO_MAX_CONNECTIONS);
        usize::try_from(cap).unwrap_or(usize::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_automatic_cap_stays_below_the_open_files_limit() {
        let limits = HttpLimits::default();
        let cap = limits.connection_cap() as u64;
        if let Some(files) = crate::serve::nofile::open_files_limit() {
            assert!(cap < files, "cap {cap}, open files {files}");
        }
        assert!(cap <= AUTO_MAX_CONNECTIONS);
        let set = HttpLimits {
            max_connections: Some(7),
            ..limits
        };
        assert_eq!(set.connection_cap(), 7);
    }
}
