//! What `SIGHUP` changes while the control plane runs: prices, tenants' limits and request
//! rates, GPU health and host rules, idle reclaim and the alert webhook, swapped whole so a
//! request sees either the old settings or the new. Everything else needs a restart.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use gpurent_billing::PriceList;

use crate::{HealthRules, HostPolicy, RateLimits, ServerConfig, TenantLimits};

/// The settings a reload may change.
#[derive(Debug, Clone, PartialEq)]
pub struct Live {
    pub prices: PriceList,
    pub health_rules: HealthRules,
    pub host_policy: HostPolicy,
    pub tenant_limits: TenantLimits,
    pub rate_limits: RateLimits,
    pub idle_reclaim: Option<Duration>,
    pub alert_webhook: Option<String>,
}

impl Live {
    /// The settings a control plane starts with.
    pub fn of(config: &ServerConfig) -> Live {
        Live {
            prices: config.prices.clone(),
            health_rules: config.health_rules.clone(),
            host_policy: config.host_policy.clone(),
            tenant_limits: config.tenant_limits,
            rate_limits: config.rate_limits,
            idle_reclaim: config.idle_reclaim,
            alert_webhook: config.alert_webhook.clone(),
        }
    }

    /// The names of the settings that differ from `other`'s (the flags' names).
    pub fn changes(&self, other: &Live) -> Vec<&'static str> {
        let mut changed = Vec::new();
        if self.prices != other.prices {
            changed.push("prices");
        }
        if self.health_rules != other.health_rules {
            changed.push("health rules");
        }
        if self.host_policy != other.host_policy {
            changed.push("host rules");
        }
        if self.tenant_limits != other.tenant_limits {
            changed.push("tenant limits");
        }
        if self.rate_limits != other.rate_limits {
            changed.push("rate limits");
        }
        if self.idle_reclaim != other.idle_reclaim {
            changed.push("idle-reclaim-minutes");
        }
        if self.alert_webhook != other.alert_webhook {
            changed.push("alert-webhook");
        }
        changed
    }
}

/// Why a reload was refused (the settings in force stay).
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    #[error(
        "the new prices are in {new}, the books in {old}: the currency changes only with a restart"
    )]
    Currency { old: String, new: String },
}

/// The settings in force, replaced whole by a reload.
#[derive(Debug)]
pub struct LiveConfig(RwLock<Arc<Live>>);

impl LiveConfig {
    pub fn new(live: Live) -> LiveConfig {
        LiveConfig(RwLock::new(Arc::new(live)))
    }

    pub fn get(&self) -> Arc<Live> {
        match self.0.read() {
            Ok(guard) => Arc::clone(&guard),
            Err(poisoned) => Arc::clone(&poisoned.into_inner()),
        }
    }

    /// Puts `new` in force, and says what changed; a new currency is refused.
    pub fn replace(&self, new: Live) -> Result<Vec<&'static str>, ReloadError> {
        let old = self.get();
        if old.prices.currency() != new.prices.currency() {
            return Err(ReloadError::Currency {
                old: old.prices.currency().to_owned(),
                new: new.prices.currency().to_owned(),
            });
        }
        let changed = new.changes(&old);
        match self.0.write() {
            Ok(mut guard) => *guard = Arc::new(new),
            Err(poisoned) => *poisoned.into_inner() = Arc::new(new),
        }
        Ok(changed)
    }
}
