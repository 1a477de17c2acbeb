//! What can go wrong in the store, with the context a caller needs to answer the user.

use gpurent_types::Money;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{what} {id:?} not found")]
    NotFound { what: &'static str, id: String },
    #[error("{0}")]
    Conflict(String),
    /// The same thing again where only one may be (a 422, not a 409: nothing to retry).
    #[error("{0}")]
    Duplicate(String),
    #[error("limit exceeded: {0}")]
    LimitExceeded(String),
    #[error("no capacity: {0}")]
    NoCapacity(String),
    #[error("no GPU of type {wanted:?} in this cluster; known types: {known}")]
    UnknownGpuType { wanted: String, known: String },
    /// The tenant's spend reached its monthly budget (a 402, as a want of credit).
    #[error("budget exceeded: {0}")]
    BudgetExceeded(String),
    #[error("not enough credit: this needs {needed} and the balance is {balance}")]
    InsufficientCredit { needed: Money, balance: Money },
    #[error(transparent)]
    Price(#[from] gpurent_billing::QuoteError),
    /// A team's owner, which the caller may not change (its role is read under the team's
    /// lock).
    #[error("only an owner of the team changes or removes an owner")]
    OwnerUntouched,
    #[error("this Idempotency-Key was already used with a different request")]
    IdempotencyMismatch,
    #[error("the join token is unknown or expired")]
    InvalidJoinToken,
    #[error("database URL {0:?} is not supported: use sqlite://PATH or postgres://...")]
    UnsupportedUrl(String),
    #[error("migration {version} ({name}) failed")]
    Migration {
        version: i64,
        name: &'static str,
        #[source]
        source: sqlx::Error,
    },
    #[error("stored data is inconsistent: {0}")]
    Corrupt(String),
    /// No database host takes writes now (lost, a standby, read-only): retry later.
    #[error("the database is unavailable: {0}")]
    Unavailable(String),
    #[error("database error")]
    Database(#[from] sqlx::Error),
}

impl StoreError {
    pub(crate) fn is_unique_violation(&self) -> bool {
        matches!(self, StoreError::Database(sqlx::Error::Database(e)) if e.is_unique_violation())
    }

    /// Every database connection stayed busy for the whole acquire timeout, or the database
    /// kept aborting the transaction on lock conflicts (deadlocks, lock waits past
    /// `lock_timeout`) after its retries: the store is overloaded, nothing was written, and the
    /// request may be retried later (503).
    pub fn is_overloaded(&self) -> bool {
        matches!(self, StoreError::Database(sqlx::Error::PoolTimedOut)) || self.is_transient()
    }

    /// The database is lost or takes no writes (a failover under way): nothing of the failed
    /// statement was written, or its transaction's outcome is for an idempotent retry to find
    /// out; the request may be retried later (503).
    pub fn is_unavailable(&self) -> bool {
        match self {
            StoreError::Unavailable(_) => true,
            StoreError::Database(sqlx::Error::Io(_) | sqlx::Error::PoolClosed) => true,
            StoreError::Database(sqlx::Error::Database(e)) => e.code().is_some_and(|c| {
                // read_only_sql_transaction, the session ended as idle in a transaction (a
                // frozen client: `session`), admin/crash shutdown, cannot connect now, and the
                // connection exceptions.
                matches!(c.as_ref(), "25006" | "25P03" | "57P01" | "57P02" | "57P03")
                    || c.starts_with("08")
            }),
            _ => false,
        }
    }

    /// The server refused a write because it is read-only (a standby, or demoted): nothing was
    /// written, and the transaction may run again once the store found the writable host.
    pub(crate) fn is_read_only(&self) -> bool {
        matches!(self, StoreError::Database(sqlx::Error::Database(e))
            if e.code().as_deref() == Some("25006"))
    }

    /// A deadlock, serialization failure or lock wait past `lock_timeout` (PostgreSQL), or a
    /// busy database (SQLite): the transaction was rolled back and may simply be run again.
    pub(crate) fn is_transient(&self) -> bool {
        let StoreError::Database(sqlx::Error::Database(e)) = self else {
            return false;
        };
        matches!(
            e.code().as_deref(),
            Some("40P01" | "40001" | "55P03" | "5" | "6" | "517" | "262")
        )
    }

    /// A statement waited on a lock past `lock_timeout` (`session`): the holder is busy or
    /// stuck; worth one more try, not five.
    pub(crate) fn is_lock_timeout(&self) -> bool {
        matches!(self, StoreError::Database(sqlx::Error::Database(e))
            if e.code().as_deref() == Some("55P03"))
    }

    pub fn not_found(what: &'static str, id: &str) -> Self {
        StoreError::NotFound {
            what,
            id: id.to_owned(),
        }
    }
}
