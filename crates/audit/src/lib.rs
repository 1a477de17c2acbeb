//! The audit trail's integrity rules, with no I/O: each record carries the hash of the one
//! before it (`record`), checkpoints sign the chain's head with the server's Ed25519 key
//! (`checkpoint`), and `verify` walks records in order and names the first one that was
//! altered, removed or reordered. The store keeps the records; the server holds the key.

mod checkpoint;
mod record;
mod verify;

pub use checkpoint::{Checkpoint, KeyError, Signer};
pub use record::{chain_hash, Entry, Record, GENESIS};
pub use verify::{Bad, Problem, Verdict, Verifier};
