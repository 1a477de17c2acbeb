//! The caps on open connections, per client address and in all: a connection over either is
//! refused when accepted, and a held one frees its place when it closes.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::{Arc, Mutex, PoisonError};

use crate::metrics::{ConnectionEvent, Metrics};

#[derive(Debug)]
pub(crate) struct Caps {
    total_max: usize,
    per_address_max: Option<usize>,
    open: Mutex<Open>,
    metrics: Arc<Metrics>,
}

#[derive(Debug, Default)]
struct Open {
    total: usize,
    by_address: HashMap<IpAddr, usize>,
}

/// Why a connection was refused, with the cap it hit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    Total(usize),
    PerAddress(usize),
}

impl Refusal {
    pub(crate) fn message(self) -> String {
        match self {
            Refusal::Total(cap) => {
                format!("the server has {cap} connections open, the most it takes; retry later")
            }
            Refusal::PerAddress(cap) => format!(
                "your address has {cap} connections open, the most one address may; \
                 close some or retry later"
            ),
        }
    }
}

/// A held place under the caps, given back when dropped.
#[derive(Debug)]
pub(crate) struct Permit {
    caps: Arc<Caps>,
    address: IpAddr,
}

impl Caps {
    pub(crate) fn new(
        total_max: usize,
        per_address_max: Option<usize>,
        metrics: Arc<Metrics>,
    ) -> Arc<Caps> {
        Arc::new(Caps {
            total_max,
            per_address_max,
            open: Mutex::new(Open::default()),
            metrics,
        })
    }

    pub(crate) fn admit(self: &Arc<Self>, ip: IpAddr) -> Result<Permit, Refusal> {
        let address = client_address(ip);
        let mut guard = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        let open = &mut *guard;
        if open.total >= self.total_max {
            self.metrics
                .observe_connection(ConnectionEvent::RefusedTotal);
            return Err(Refusal::Total(self.total_max));
        }
        let held = open.by_address.entry(address).or_insert(0);
        if let Some(cap) = self.per_address_max {
            if *held >= cap {
                self.metrics
                    .observe_connection(ConnectionEvent::RefusedPerIp);
                return Err(Refusal::PerAddress(cap));
            }
        }
        *held += 1;
        open.total += 1;
        self.metrics.observe_connection(ConnectionEvent::Opened);
        Ok(Permit {
            caps: self.clone(),
            address,
        })
    }

    /// Connections open now.
    #[cfg(test)]
    pub(crate) fn open(&self) -> usize {
        self.open
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .total
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        let mut guard = self
            .caps
            .open
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let open = &mut *guard;
        open.total = open.total.saturating_sub(1);
        if let Some(held) = open.by_address.get_mut(&self.address) {
            *held = held.saturating_sub(1);
            if *held == 0 {
                open.by_address.remove(&self.address);
            }
        }
        self.caps
            .metrics
            .observe_connection(ConnectionEvent::Closed);
    }
}

/// What counts as one client: an IPv4 address (also when mapped into IPv6), or an IPv6 /64
/// (one host is given a whole /64, and can pick any address in it).
fn client_address(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(v4) => IpAddr::V4(v4),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let prefix = u128::from(v6) & !((1u128 << 64) - 1);
                IpAddr::V6(Ipv6Addr::from(prefix))
            }
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn each_address_and_all_together_are_capped() {
        let caps = Caps::new(3, Some(2), Arc::default());
        let a1 = caps.admit(ip("10.0.0.1"));
        let a2 = caps.admit(ip("10.0.0.1"));
        assert!(a1.is_ok() && a2.is_ok());
        assert_eq!(
            caps.admit(ip("10.0.0.1")).err(),
            Some(Refusal::PerAddress(2))
        );
        let b = caps.admit(ip("10.0.0.2"));
        assert!(b.is_ok());
        assert_eq!(caps.admit(ip("10.0.0.3")).err(), Some(Refusal::Total(3)));
        drop(a1);
        assert_eq!(caps.open(), 2);
        assert!(caps.admit(ip("10.0.0.1")).is_ok());
    }

    #[test]
    fn an_ipv6_slash_64_is_one_client() {
        let caps = Caps::new(10, Some(1), Arc::default());
        let _held = caps.admit(ip("2001:db8:1:2::1"));
        assert_eq!(
            caps.admit(ip("2001:db8:1:2:ffff::9")).err(),
            Some(Refusal::PerAddress(1))
        );
        assert!(caps.admit(ip("2001:db8:1:3::1")).is_ok());
        let _v4 = caps.admit(ip("10.0.0.1"));
        assert_eq!(
            caps.admit(ip("::ffff:10.0.0.1")).err(),
            Some(Refusal::PerAddress(1))
        );
    }
}
