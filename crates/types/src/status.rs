//! The small closed vocabularies of the API: roles, tiers and reservation statuses.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {what} {value:?}; expected one of: {}", .expected.join(", "))]
pub struct UnknownValue {
    pub what: &'static str,
    pub value: String,
    pub expected: &'static [&'static str],
}

macro_rules! string_enum {
    ($(#[doc = $doc:literal])* $name:ident, $what:literal { $($variant:ident => $text:literal),+ $(,)? }) => {
        $(#[doc = $doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
        pub enum $name {
            $(#[serde(rename = $text)] $variant),+
        }

        // By hand: the derive does not see the `rename`s this macro writes, and would document
        // the variants' Rust names instead of the strings on the wire.
        impl utoipa::PartialSchema for $name {
            fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
                let doc: &[&str] = &[$($doc),*];
                let description = doc.iter().map(|l| l.trim()).collect::<Vec<_>>().join("\n");
                utoipa::openapi::schema::ObjectBuilder::new()
                    .schema_type(utoipa::openapi::schema::Type::String)
                    .description((!description.is_empty()).then_some(description))
                    .enum_values(Some([$($text),+]))
                    .into()
            }
        }

        impl ToSchema for $name {}

        impl $name {
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            pub fn as_str(self) -> &'static str {
                match self { $($name::$variant => $text),+ }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl FromStr for $name {
            type Err = UnknownValue;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                match s {
                    $($text => Ok($name::$variant),)+
                    _ => Err(UnknownValue {
                        what: $what,
                        value: s.to_owned(),
                        expected: &[$($text),+],
                    }),
                }
            }
        }
    };
}

string_enum!(
    /// What a user may do: tenants rent, hosts own nodes, admins run the platform.
    Role, "role" { Tenant => "tenant", Host => "host", Admin => "admin" }
);

string_enum!(
    /// What a member may do in a team: an owner everything, its credit included; an admin
    /// manage its members; a member reserve, stop and enter; a viewer only look.
    TeamRole, "team role" {
        Owner => "owner",
        Admin => "admin",
        Member => "member",
        Viewer => "viewer"
    }
);

string_enum!(
    /// What a scoped token may do: `read` everything its user sees; `reserve` make and stop
    /// reservations; `ssh` enter instances; `volumes` manage volumes and their files;
    /// `billing` read balances, usage and invoices; `admin` manage a team's members.
    TokenScope, "token scope" {
        Read => "read",
        Reserve => "reserve",
        Ssh => "ssh",
        Volumes => "volumes",
        Billing => "billing",
        Admin => "admin"
    }
);

impl TeamRole {
    /// How much the role may do: owner 3, admin 2, member 1, viewer 0.
    pub fn rank(self) -> u8 {
        match self {
            TeamRole::Owner => 3,
            TeamRole::Admin => 2,
            TeamRole::Member => 1,
            TeamRole::Viewer => 0,
        }
    }

    /// Whether the role is at least `other`.
    pub fn at_least(self, other: TeamRole) -> bool {
        self.rank() >= other.rank()
    }
}

string_enum!(
    /// How a reservation is priced and whether it may be preempted.
    Tier, "tier" {
        OnDemand => "on-demand",
        Stepped => "stepped",
        Spot => "spot",
        Reserved => "reserved"
    }
);

string_enum!(
    /// The lifecycle of a reservation (see the CLI contract).
    ReservationStatus, "status" {
        Pending => "pending",
        Starting => "starting",
        Running => "running",
        Stopping => "stopping",
        Stopped => "stopped",
        Failed => "failed",
        Preempted => "preempted",
        Lost => "lost",
        Expired => "expired",
    }
);

string_enum!(
    /// What happens to a reservation whose node is lost (not heard from for the node TTL):
    /// run it again elsewhere from its image with a new epoch, or end it as `lost`.
    OnNodeLoss, "on_node_loss" { Reschedule => "reschedule", Stop => "stop" }
);

// The enum comes from `string_enum!`, which cannot take a `#[default]` variant.
#[allow(clippy::derivable_impls)]
impl Default for OnNodeLoss {
    fn default() -> Self {
        OnNodeLoss::Reschedule
    }
}

string_enum!(
    /// When a reservation's run is started again (a managed job, `--restart`): `never` (the
    /// default: a run's end is the reservation's); `on-interruption` (preempted, its node lost
    /// or drained); `on-failure` (those, and a run that exits non-zero or cannot start); `always`
    /// (those, and a run that exits 0). Failures and successful exits count against
    /// `max_restarts`; interruptions, which are not the job's doing, do not.
    RestartPolicy, "restart" {
        Never => "never",
        OnFailure => "on-failure",
        OnInterruption => "on-interruption",
        Always => "always"
    }
);

// The enum comes from `string_enum!`, which cannot take a `#[default]` variant.
#[allow(clippy::derivable_impls)]
impl Default for RestartPolicy {
    fn default() -> Self {
        RestartPolicy::Never
    }
}

string_enum!(
    /// A node's state as the control plane sees it. `lost`: not heard from for the node TTL
    /// (heartbeat interval x missed beats), its work fenced off; `unhealthy` and `draining`
    /// are states of health rules and drains (not set by anything yet).
    NodeStatus, "node_status" {
        Ready => "ready",
        Unhealthy => "unhealthy",
        Draining => "draining",
        Lost => "lost",
    }
);

impl ReservationStatus {
    /// A terminal reservation holds no GPU and never changes again.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            Self::Stopped | Self::Failed | Self::Preempted | Self::Lost | Self::Expired
        )
    }
}

// The enum comes from `string_enum!`, which cannot take a `#[default]` variant.
#[allow(clippy::derivable_impls)]
impl Default for Tier {
    fn default() -> Self {
        Tier::OnDemand
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_through_text() {
        for s in ReservationStatus::ALL {
            assert_eq!(s.as_str().parse::<ReservationStatus>(), Ok(*s));
        }
        assert_eq!("on-demand".parse::<Tier>(), Ok(Tier::OnDemand));
        let err = "boss".parse::<Role>().unwrap_err();
        assert_eq!(
            err.to_string(),
            "unknown role \"boss\"; expected one of: tenant, host, admin"
        );
    }
}
