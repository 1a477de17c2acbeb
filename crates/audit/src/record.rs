//! One audit record and the hash that chains it to the record before it.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The `prev_hash` of the first record ever written.
pub const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// What one API request did, as the trail records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    pub request_id: String,
    pub at: DateTime<Utc>,
    /// The authenticated caller (`usr_...`, or `node:<id>` for an agent); None when the
    /// request was refused before anyone was authenticated.
    pub user_id: Option<String>,
    /// `METHOD /route/{template}`, e.g. `POST /api/v1/reservations`.
    pub action: String,
    /// What it acted on: the path with its ids (`/api/v1/reservations/res_...`).
    pub resource: String,
    /// The GPUs involved, where a reservation was (`2x RTX 4090 on box-1: GPU-...`).
    pub allocation: Option<String>,
    /// The HTTP status answered.
    pub outcome: u16,
    /// The client's address.
    pub client: String,
}

/// An entry in its place in the chain.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    pub seq: u64,
    #[serde(flatten)]
    pub entry: Entry,
    pub prev_hash: String,
    pub hash: String,
}

impl Record {
    /// Chains `entry` after the record whose hash is `prev_hash`.
    pub fn chain(seq: u64, entry: Entry, prev_hash: &str) -> Record {
        let hash = chain_hash(prev_hash, &entry);
        Record {
            seq,
            entry,
            prev_hash: prev_hash.to_owned(),
            hash,
        }
    }
}

/// SHA-256 (hex) of the previous hash and every field of the entry, each length-prefixed so
/// that no two entries encode alike. The position (`seq`) is not hashed: a record moved
/// elsewhere keeps its hash and is found by its `prev_hash`, not reported as altered.
pub fn chain_hash(prev_hash: &str, e: &Entry) -> String {
    let mut h = Sha256::new();
    h.update(b"gpurent-audit-v1");
    let mut field = |bytes: &[u8]| {
        h.update(u64::try_from(bytes.len()).unwrap_or(u64::MAX).to_be_bytes());
        h.update(bytes);
    };
    field(prev_hash.as_bytes());
    field(e.request_id.as_bytes());
    field(&e.at.timestamp_micros().to_be_bytes());
    match &e.user_id {
        Some(u) => field(format!("+{u}").as_bytes()),
        None => field(b"-"),
    }
    field(e.action.as_bytes());
    field(e.resource.as_bytes());
    match &e.allocation {
        Some(a) => field(format!("+{a}").as_bytes()),
        None => field(b"-"),
    }
    field(&e.outcome.to_be_bytes());
    field(e.client.as_bytes());
    hex::encode(h.finalize())
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn entry() -> Entry {
        Entry {
            request_id: "req-1".into(),
            at: Utc
                .timestamp_opt(1_780_000_000, 0)
                .single()
                .unwrap_or_default(),
            user_id: Some("usr_1".into()),
            action: "POST /api/v1/reservations".into(),
            resource: "/api/v1/reservations".into(),
            allocation: None,
            outcome: 201,
            client: "127.0.0.1:5000".into(),
        }
    }

    #[test]
    fn every_field_is_in_the_hash() {
        let base = chain_hash(GENESIS, &entry());
        let changes: [fn(&mut Entry); 9] = [
            |e| e.request_id.push('x'),
            |e| e.at += chrono::Duration::microseconds(1),
            |e| e.user_id = None,
            |e| e.user_id = Some(String::new()),
            |e| e.action.push('x'),
            |e| e.resource.push('x'),
            |e| e.allocation = Some(String::new()),
            |e| e.outcome = 200,
            |e| e.client.push('x'),
        ];
        for change in changes {
            let mut e = entry();
            change(&mut e);
            assert_ne!(chain_hash(GENESIS, &e), base, "{e:?}");
        }
        assert_ne!(chain_hash(&"1".repeat(64), &entry()), base);
        assert_eq!(chain_hash(GENESIS, &entry()), base);
    }

    #[test]
    fn fields_cannot_be_shifted_into_each_other() {
        let mut a = entry();
        a.action = "GET /a".into();
        a.resource = "b".into();
        let mut b = entry();
        b.action = "GET /".into();
        b.resource = "ab".into();
        assert_ne!(chain_hash(GENESIS, &a), chain_hash(GENESIS, &b));
    }
}
