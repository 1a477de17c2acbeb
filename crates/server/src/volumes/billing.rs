//! What volumes cost their owners, as the routes decide it: the price a new or grown volume
//! is charged at, the credit it needs, and the storage grace of an owner whose balance is
//! below zero, after which (and only after which) an admin may delete their volumes.

use chrono::{DateTime, Utc};
use gpurent_billing::storage_charge;
use gpurent_store::StoreError;
use gpurent_types::api::{format_size, Volume};
use gpurent_types::Money;

use crate::error::ApiError;
use crate::state::AppState;

/// Seconds of a volume its owner's balance must cover to make or grow it: a day.
const COVERED_S: u64 = 86_400;

/// The price per GB-month and the host's share a volume is charged at from now.
pub(crate) fn price(state: &AppState) -> (Money, u32) {
    let live = state.live();
    (live.prices.storage_per_gb_month, live.prices.host_share_bps)
}

/// Refuses (402) a volume of `size_bytes` for `user_id` whose balance does not cover a day of
/// it: one who cannot pay would only run into the storage grace.
pub(crate) async fn check_credit(
    state: &AppState,
    user_id: &str,
    size_bytes: u64,
) -> Result<(), ApiError> {
    let (per_gb_month, _) = price(state);
    let needed = storage_charge(per_gb_month, size_bytes, COVERED_S);
    let (balance, _, _) = state.store.accounts(user_id).await?;
    if balance < needed || balance <= Money::ZERO {
        tracing::debug!(user_id, size = %format_size(size_bytes), %needed, %balance, "volume refused for credit");
        return Err(StoreError::InsufficientCredit { needed, balance }.into());
    }
    Ok(())
}

/// When the storage grace of a volume whose owner is unpaid runs out.
pub(crate) fn grace_ends(state: &AppState, unpaid_since: DateTime<Utc>) -> DateTime<Utc> {
    chrono::Duration::from_std(state.config.storage_grace)
        .ok()
        .and_then(|grace| unpaid_since.checked_add_signed(grace))
        .unwrap_or(DateTime::<Utc>::MAX_UTC)
}

/// The volume with when its grace runs out, for its owner and admins to see.
pub(crate) fn with_grace(state: &AppState, mut volume: Volume) -> Volume {
    volume.deletable_after = volume.unpaid_since.map(|at| grace_ends(state, at));
    volume
}

/// An admin removes another user's volume only when its owner has been unpaid for the whole
/// storage grace, and is still: nothing is deleted under a tenant who pays.
pub(crate) async fn check_removal(
    state: &AppState,
    acting_for: Option<&str>,
    volume: &Volume,
) -> Result<(), ApiError> {
    if acting_for == Some(volume.owner_id.as_str()) {
        return Ok(());
    }
    let (balance, _, _) = state.store.accounts(&volume.owner_id).await?;
    let ends = volume.unpaid_since.map(|at| grace_ends(state, at));
    match ends {
        Some(ends) if balance < Money::ZERO && ends <= state.now() => {
            tracing::info!(volume_id = %volume.id, owner_id = %volume.owner_id, %balance, "an admin removes an unpaid volume after its grace");
            Ok(())
        }
        Some(ends) if balance < Money::ZERO => Err(StoreError::Conflict(format!(
            "volume {} is its owner's (balance {balance}); its data is kept until its storage grace ends at {}",
            volume.name,
            ends.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
        ))
        .into()),
        _ => Err(StoreError::Conflict(format!(
            "volume {} is another user's, who is paid up: an admin removes a volume only after its owner was unpaid for the storage grace",
            volume.name
        ))
        .into()),
    }
}
