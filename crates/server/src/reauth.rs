//! Passwords checked under the account's login throttle (`gpurent_types::login_throttle`):
//! logins, and the re-authentication that sensitive account changes need (SECURITY.md).

use gpurent_store::{AuthUser, LoginFacts};
use gpurent_types::login_throttle::Verdict;
use sha2::{Digest, Sha256};

use crate::auth::Caller;
use crate::error::ApiError;
use crate::state::AppState;

/// A login this recent lets a session add an SSH key without the password again.
pub(crate) const FRESH_LOGIN: chrono::Duration = chrono::Duration::minutes(5);
/// The most characters a password has.
pub(crate) const MAX_PASSWORD: usize = 1024;
/// Longer passwords (in bytes) are never checked: argon2 of megabytes is a denial of service.
const MAX_PASSWORD_BYTES: usize = 4 * MAX_PASSWORD;
/// Names that are no user's whose failures are kept at most.
pub(crate) const KEEP_UNKNOWN_NAMES: u32 = 10_000;

/// The throttle's key for a login name: the user's id, or for a name that is no user's a
/// digest of it (so a made-up name is throttled exactly like a real one).
fn account_of(name: &str, facts: Option<&LoginFacts>) -> String {
    match facts {
        Some(f) => f.user_id.clone(),
        None => format!("name:{}", hex::encode(Sha256::digest(name.as_bytes()))),
    }
}

/// Checks `password` against `stored` under the throttle of `account`: during the account's
/// wait nothing is checked (`LoginThrottled`); a right password forgets its failures.
async fn throttled(
    state: &AppState,
    account: &str,
    user_id: Option<&str>,
    password: String,
    stored: Option<String>,
) -> Result<bool, ApiError> {
    let now = state.now();
    if let Verdict::Wait { until } = state.store.login_attempt(account, user_id, now).await? {
        return Err(ApiError::LoginThrottled {
            until,
            retry_after: (until - now).to_std().unwrap_or_default(),
        });
    }
    // A password too long is never right, and costs the same time as a wrong one.
    let (password, stored) = if password.len() > MAX_PASSWORD_BYTES {
        (String::new(), None)
    } else {
        (password, stored)
    };
    // argon2 runs whether or not the user exists (against a dummy hash when not), off the
    // async workers and a few at a time: it takes tens of milliseconds of CPU by design.
    let matches = crate::password::verify_blocking(password, stored).await;
    if matches {
        state.store.login_succeeded(account).await?;
    }
    Ok(matches)
}

/// A login by name and password: the user's facts when the password is right, else the same
/// 401 for a wrong password and a name that is no user's, in the same time, through the same
/// statements. The audit record names the user a known name belongs to.
pub(crate) async fn login(
    state: &AppState,
    note: &crate::audit::AuditNote,
    name: &str,
    password: String,
) -> Result<LoginFacts, ApiError> {
    let facts = state.store.login_facts(name).await?;
    let account = account_of(name, facts.as_ref());
    let user_id = facts.as_ref().map(|f| f.user_id.clone());
    if let Some(id) = &user_id {
        note.caller(id);
    }
    let stored = facts.as_ref().and_then(|f| f.password_hash.clone());
    if throttled(state, &account, user_id.as_deref(), password, stored).await? {
        if let Some(facts) = facts {
            return Ok(facts);
        }
    }
    Err(ApiError::Unauthorized("wrong name or password".into()))
}

/// The user's stored password hash, if it has a password.
async fn stored_hash(state: &AppState, user: &AuthUser) -> Result<Option<String>, ApiError> {
    Ok(state
        .store
        .login_facts(&user.name)
        .await?
        .filter(|f| f.user_id == user.id)
        .and_then(|f| f.password_hash))
}

/// Whether the user has a password at all (one made by an admin with a token has none).
pub(crate) async fn has_password(state: &AppState, user: &AuthUser) -> Result<bool, ApiError> {
    Ok(stored_hash(state, user).await?.is_some())
}

/// The user's own password, under the user's login throttle: `WrongPassword` when it is not.
pub(crate) async fn check_own(
    state: &AppState,
    user: &AuthUser,
    password: String,
) -> Result<(), ApiError> {
    let stored = stored_hash(state, user).await?;
    if throttled(state, &user.id, Some(&user.id), password, stored).await? {
        Ok(())
    } else {
        Err(ApiError::WrongPassword)
    }
}

/// Whether the caller's token is a login session older than [`FRESH_LOGIN`]: such a
/// session (a console cookie, or `gpurent login`) needs the password for a sensitive change.
/// An API token made deliberately is not an ambient credential a page's script could use.
pub(crate) fn stale_session(caller: &Caller, now: chrono::DateTime<chrono::Utc>) -> bool {
    caller.1.login_at.is_some_and(|at| now - at >= FRESH_LOGIN)
}

/// What a sensitive change (adding an SSH key, an admin setting another's password) needs of
/// the caller: the password when given (checked, throttled), else a fresh enough login.
pub(crate) async fn recent(
    state: &AppState,
    caller: &Caller,
    password: Option<String>,
    what: &str,
) -> Result<(), ApiError> {
    match password {
        Some(password) => check_own(state, &caller.0, password).await,
        None if stale_session(caller, state.now()) => Err(ApiError::PasswordRequired(format!(
            "{what} needs your password (`password`): you logged in more than {} minutes ago",
            FRESH_LOGIN.num_minutes()
        ))),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpurent_store::TokenFacts;
    use gpurent_types::Role;

    fn caller(login_at: Option<chrono::DateTime<chrono::Utc>>) -> Caller {
        Caller(
            AuthUser {
                id: "u1".into(),
                name: "tina".into(),
                role: Role::Tenant,
            },
            TokenFacts {
                id: "t1".into(),
                expires_at: None,
                login_at,
                scopes: None,
                team_id: None,
            },
        )
    }

    #[test]
    fn only_an_old_login_session_is_stale() {
        let now = chrono::DateTime::from_timestamp(1_800_000_000, 0).unwrap();
        assert!(!stale_session(&caller(None), now), "an API token");
        assert!(!stale_session(
            &caller(Some(now - chrono::Duration::minutes(4))),
            now
        ));
        assert!(stale_session(&caller(Some(now - FRESH_LOGIN)), now));
    }

    #[test]
    fn unknown_names_get_a_key_of_their_own() {
        let facts = LoginFacts {
            user_id: "u1".into(),
            password_hash: None,
        };
        assert_eq!(account_of("tina", Some(&facts)), "u1");
        let a = account_of("nobody", None);
        assert!(a.starts_with("name:") && a.len() == 5 + 64);
        assert_ne!(a, account_of("nobody2", None));
    }
}
