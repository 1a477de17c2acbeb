//! Who may connect as which SSH user: the user name is a reservation id, and a key gets in
//! only if it is one of the reservation owner's keys (for a team's, of a member who may enter
//! its instances) and the reservation runs.

use gpurent_store::{Scope, Store, StoreError};
use gpurent_types::ReservationStatus;
use russh::keys::ssh_key::{HashAlg, PublicKey};

/// What the endpoint does with a key offered for a user name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// The owner's key (or, for a team's, a member's) and a running reservation: in.
    Enter {
        reservation_id: String,
        /// Whose key it is: who enters.
        tenant_id: String,
    },
    /// The owner's key, but the reservation does not run: the owner is told why (only the
    /// owner, after proving the key, so nobody else learns that the reservation exists).
    NotRunning { message: String },
    /// Anything else (unknown reservation, someone else's key, a store failure): refused,
    /// all the same way, so a refusal says nothing about what exists.
    Refuse,
}

/// Whose key `fingerprint` is among those that may enter the reservation: its owner's, or,
/// for a team's, those of its members who may enter its instances (not its viewers).
async fn key_holder(
    store: &dyn Store,
    reservation: &gpurent_types::api::Reservation,
    fingerprint: &str,
) -> Result<Option<String>, StoreError> {
    let owner = &reservation.tenant_id;
    if store
        .ssh_key_by_fingerprint(owner, fingerprint)
        .await?
        .is_some()
    {
        return Ok(Some(owner.clone()));
    }
    if reservation.team.is_none() {
        return Ok(None);
    }
    for member in store.team_members(owner).await? {
        if crate::teams::roles::may(member.role, crate::teams::roles::TeamAction::Enter)
            && store
                .ssh_key_by_fingerprint(&member.user_id, fingerprint)
                .await?
                .is_some()
        {
            return Ok(Some(member.user_id));
        }
    }
    Ok(None)
}

/// Decides for `user` (a reservation id) and the offered `key`.
pub async fn decide(store: &dyn Store, user: &str, key: &PublicKey) -> Decision {
    // Ids are short words; anything else is refused without asking the store.
    if user.is_empty()
        || user.len() > 128
        || !user
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    {
        return Decision::Refuse;
    }
    let reservation = match store.get_reservation(user, &Scope::All).await {
        Ok(r) => r,
        Err(StoreError::NotFound { .. }) => return Decision::Refuse,
        Err(e) => {
            tracing::warn!(error = %e, "ssh: cannot look up the reservation");
            return Decision::Refuse;
        }
    };
    let fingerprint = key.fingerprint(HashAlg::Sha256).to_string();
    let who = match key_holder(store, &reservation, &fingerprint).await {
        Ok(Some(who)) => who,
        Ok(None) => return Decision::Refuse,
        Err(e) => {
            tracing::warn!(error = %e, "ssh: cannot look up the key");
            return Decision::Refuse;
        }
    };
    match reservation.status {
        ReservationStatus::Running => Decision::Enter {
            reservation_id: reservation.id,
            tenant_id: who,
        },
        status => Decision::NotRunning {
            message: not_running(&reservation.id, status, reservation.ended_at),
        },
    }
}

/// "reservation R is queued" / "reservation R is stopped (ended at ...)": why an owner cannot
/// enter (the SSH endpoint's disconnect message, the web terminal's refusal).
pub(crate) fn not_running(
    id: &str,
    status: ReservationStatus,
    ended_at: Option<chrono::DateTime<chrono::Utc>>,
) -> String {
    let word = match status {
        ReservationStatus::Pending => "queued",
        other => other.as_str(),
    };
    match (ended_at, status) {
        (Some(at), _) => format!(
            "reservation {id} is {word} (ended at {}); connect while it runs",
            at.format("%Y-%m-%d %H:%M:%S UTC")
        ),
        (None, ReservationStatus::Pending | ReservationStatus::Starting) => {
            format!("reservation {id} is {word}, not running yet; connect once it runs")
        }
        (None, _) => format!("reservation {id} is {word}; connect while it runs"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_the_state() {
        assert_eq!(
            not_running("r1", ReservationStatus::Pending, None),
            "reservation r1 is queued, not running yet; connect once it runs"
        );
        let at = chrono::DateTime::parse_from_rfc3339("2026-01-02T03:04:05Z")
            .unwrap()
            .with_timezone(&chrono::Utc);
        assert_eq!(
            not_running("r1", ReservationStatus::Stopped, Some(at)),
            "reservation r1 is stopped (ended at 2026-01-02 03:04:05 UTC); connect while it runs"
        );
        assert_eq!(
            not_running("r1", ReservationStatus::Stopping, None),
            "reservation r1 is stopping; connect while it runs"
        );
    }
}
