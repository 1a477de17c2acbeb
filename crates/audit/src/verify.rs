//! Walks the records in order against the chain and the signed checkpoints and names the
//! first record that was altered, removed or reordered.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::record::{chain_hash, Record, GENESIS};
use crate::Checkpoint;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Problem {
    /// Its content no longer matches its hash.
    Altered,
    /// It is not there: the next record has a later position, or the trail ends before it.
    Missing,
    /// Intact, but not where it was written: it does not follow the record before it.
    OutOfOrder,
    /// The chain up to it is not the one a checkpoint signed (rewritten, hashes and all).
    Rewritten,
    /// A checkpoint at it is not signed by the server's key.
    BadSignature,
}

/// The first problem found, at the position (`seq`) of the record it concerns.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bad {
    pub seq: u64,
    pub problem: Problem,
    pub message: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Verdict {
    pub ok: bool,
    /// Records read.
    pub records: u64,
    /// Signed checkpoints matched by the chain.
    pub checkpoints: u64,
    pub first_bad: Option<Bad>,
}

#[derive(Debug)]
pub struct Verifier {
    /// By the position they sign; only those with a good signature.
    checkpoints: BTreeMap<u64, Checkpoint>,
    expected_seq: u64,
    prev_hash: String,
    records: u64,
    matched: u64,
    first_bad: Option<Bad>,
    bad_signature: Option<Bad>,
}

impl Verifier {
    /// `public_key` (hex) is the server's; `anchor`, where older records were pruned, is the
    /// checkpoint of the last pruned record, from which the retained chain continues.
    pub fn new(
        public_key: &str,
        checkpoints: Vec<Checkpoint>,
        anchor: Option<&Checkpoint>,
    ) -> Self {
        let mut bad_signature = None;
        let mut good = BTreeMap::new();
        for c in checkpoints.into_iter().chain(anchor.cloned()) {
            if c.signed_by(public_key) {
                good.insert(c.seq, c);
            } else if bad_signature.as_ref().is_none_or(|b: &Bad| c.seq < b.seq) {
                bad_signature = Some(Bad {
                    seq: c.seq,
                    problem: Problem::BadSignature,
                    message: format!(
                        "the checkpoint at record {} is not signed by the server's key {public_key}",
                        c.seq
                    ),
                });
            }
        }
        let (expected_seq, prev_hash) = match anchor {
            Some(a) if good.contains_key(&a.seq) => (a.seq + 1, a.hash.clone()),
            _ => (1, GENESIS.to_owned()),
        };
        Verifier {
            checkpoints: good,
            expected_seq,
            prev_hash,
            records: 0,
            matched: 0,
            first_bad: None,
            bad_signature,
        }
    }

    fn found(&mut self, seq: u64, problem: Problem, message: String) {
        self.first_bad = Some(Bad {
            seq,
            problem,
            message,
        });
    }

    /// The next record, in the order of its position. False once a problem is found (the
    /// rest is only counted).
    pub fn push(&mut self, r: &Record) -> bool {
        self.records += 1;
        if self.first_bad.is_some() {
            return false;
        }
        let expected = self.expected_seq;
        if r.seq > expected {
            let message = format!(
                "record {expected} is missing: the record after {} is {}",
                expected.saturating_sub(1),
                r.seq
            );
            self.found(expected, Problem::Missing, message);
        } else if r.seq < expected {
            let message = format!(
                "record {} appears again after record {}",
                r.seq,
                expected - 1
            );
            self.found(r.seq, Problem::OutOfOrder, message);
        } else if chain_hash(&r.prev_hash, &r.entry) != r.hash {
            let message = format!(
                "record {} was altered: its content does not match its hash",
                r.seq
            );
            self.found(r.seq, Problem::Altered, message);
        } else if r.prev_hash != self.prev_hash {
            let message = format!(
                "record {} is out of place: it does not follow record {}",
                r.seq,
                expected.saturating_sub(1)
            );
            self.found(r.seq, Problem::OutOfOrder, message);
        } else if let Some(c) = self.checkpoints.get(&r.seq) {
            if c.hash == r.hash {
                self.matched += 1;
            } else {
                let message = format!(
                    "the chain up to record {} is not the one its signed checkpoint of {} holds",
                    r.seq, c.at
                );
                self.found(r.seq, Problem::Rewritten, message);
            }
        }
        if self.first_bad.is_some() {
            return false;
        }
        self.prev_hash.clone_from(&r.hash);
        self.expected_seq = r.seq + 1;
        true
    }

    /// The verdict, given the head the store keeps (the position and hash of the last record
    /// written), so that records removed from the end are found too.
    pub fn finish(mut self, head: Option<(u64, &str)>) -> Verdict {
        if self.first_bad.is_none() {
            let next = self.expected_seq;
            let last = next.saturating_sub(1);
            let signed_later = self.checkpoints.range(next..).next().map(|(s, _)| *s);
            match (head, signed_later) {
                (Some((head_seq, _)), _) if head_seq >= next => {
                    let message = format!(
                        "records {next} to {head_seq} are missing: the trail ends at {last}"
                    );
                    self.found(next, Problem::Missing, message);
                }
                (_, Some(signed)) => {
                    let message = format!("records {next} to {signed} are missing: a checkpoint signed record {signed}");
                    self.found(next, Problem::Missing, message);
                }
                (Some((head_seq, head_hash)), _)
                    if head_seq == last && head_hash != self.prev_hash && last > 0 =>
                {
                    let message = format!("record {last} is not the last record written");
                    self.found(last, Problem::Altered, message);
                }
                _ => {}
            }
        }
        let first_bad = match (self.first_bad, self.bad_signature) {
            (Some(a), Some(b)) => Some(if b.seq < a.seq { b } else { a }),
            (a, b) => a.or(b),
        };
        Verdict {
            ok: first_bad.is_none(),
            records: self.records,
            checkpoints: self.matched,
            first_bad,
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use chrono::{DateTime, Utc};
    use proptest::prelude::*;

    use super::*;
    use crate::{Entry, Signer};

    fn entry(i: u64) -> Entry {
        Entry {
            request_id: format!("req-{i}"),
            at: DateTime::<Utc>::UNIX_EPOCH + chrono::Duration::seconds(i64::try_from(i).unwrap()),
            user_id: (!i.is_multiple_of(3)).then(|| format!("usr_{}", i % 5)),
            action: "POST /api/v1/reservations".into(),
            resource: format!("/api/v1/reservations/r{i}"),
            allocation: i
                .is_multiple_of(2)
                .then(|| "1x RTX 4090 on box-1: GPU-a".to_owned()),
            outcome: if i.is_multiple_of(7) { 409 } else { 201 },
            client: "127.0.0.1:4000".into(),
        }
    }

    /// A chain of `n` records with a checkpoint every `every`.
    fn chain(n: u64, every: u64, signer: &Signer) -> (Vec<Record>, Vec<Checkpoint>) {
        let mut records: Vec<Record> = Vec::new();
        let mut checkpoints = Vec::new();
        for seq in 1..=n {
            let prev = records
                .last()
                .map_or(GENESIS.to_owned(), |r| r.hash.clone());
            let r = Record::chain(seq, entry(seq), &prev);
            if seq.is_multiple_of(every) {
                checkpoints.push(signer.sign(seq, &r.hash, r.entry.at));
            }
            records.push(r);
        }
        (records, checkpoints)
    }

    fn verify(
        records: &[Record],
        checkpoints: &[Checkpoint],
        signer: &Signer,
        head: Option<(u64, &str)>,
    ) -> Verdict {
        let mut v = Verifier::new(&signer.public_key(), checkpoints.to_vec(), None);
        for r in records {
            v.push(r);
        }
        v.finish(head)
    }

    fn head(records: &[Record]) -> Option<(u64, &str)> {
        records.last().map(|r| (r.seq, r.hash.as_str()))
    }

    #[test]
    fn an_intact_trail_verifies() {
        let signer = Signer::from_seed([1; 32]);
        let (records, checkpoints) = chain(50, 10, &signer);
        let verdict = verify(&records, &checkpoints, &signer, head(&records));
        assert_eq!(
            verdict,
            Verdict {
                ok: true,
                records: 50,
                checkpoints: 5,
                first_bad: None
            }
        );
        assert!(verify(&[], &[], &signer, None).ok);
    }

    #[test]
    fn a_rewritten_chain_fails_at_its_checkpoint() {
        let signer = Signer::from_seed([1; 32]);
        let (mut records, checkpoints) = chain(30, 10, &signer);
        // Record 13 changed and every hash after it recomputed: only the signature holds.
        records[12].entry.outcome = 200;
        for i in 12..records.len() {
            let prev = records[i - 1].hash.clone();
            records[i] = Record::chain(records[i].seq, records[i].entry.clone(), &prev);
        }
        let verdict = verify(&records, &checkpoints, &signer, head(&records));
        let bad = verdict.first_bad.unwrap();
        assert_eq!((bad.seq, bad.problem), (20, Problem::Rewritten));
    }

    #[test]
    fn a_forged_checkpoint_is_named() {
        let signer = Signer::from_seed([1; 32]);
        let (records, mut checkpoints) = chain(30, 10, &signer);
        checkpoints[1] =
            Signer::from_seed([2; 32]).sign(20, &records[19].hash, records[19].entry.at);
        let bad = verify(&records, &checkpoints, &signer, head(&records))
            .first_bad
            .unwrap();
        assert_eq!((bad.seq, bad.problem), (20, Problem::BadSignature));
    }

    #[test]
    fn removed_from_the_end_is_found_by_the_head_or_a_checkpoint() {
        let signer = Signer::from_seed([1; 32]);
        let (records, checkpoints) = chain(30, 10, &signer);
        let full_head = head(&records).map(|(s, h)| (s, h.to_owned())).unwrap();
        let bad = verify(
            &records[..25],
            &checkpoints,
            &signer,
            Some((full_head.0, &full_head.1)),
        )
        .first_bad
        .unwrap();
        assert_eq!((bad.seq, bad.problem), (26, Problem::Missing));
        let bad = verify(&records[..15], &checkpoints, &signer, None)
            .first_bad
            .unwrap();
        assert_eq!((bad.seq, bad.problem), (16, Problem::Missing));
    }

    #[test]
    fn a_pruned_trail_verifies_from_its_anchor() {
        let signer = Signer::from_seed([1; 32]);
        let (records, checkpoints) = chain(30, 10, &signer);
        let anchor = checkpoints[0].clone();
        let mut v = Verifier::new(
            &signer.public_key(),
            checkpoints[1..].to_vec(),
            Some(&anchor),
        );
        for r in &records[10..] {
            v.push(r);
        }
        assert!(v.finish(head(&records)).ok);
        // Without its anchor, the first retained record has no predecessor.
        let bad = verify(&records[10..], &checkpoints[1..], &signer, head(&records))
            .first_bad
            .unwrap();
        assert_eq!((bad.seq, bad.problem), (1, Problem::Missing));
    }

    #[derive(Debug, Clone)]
    enum Tamper {
        Alter(usize),
        Delete(usize),
        Swap(usize, usize),
    }

    fn tamper() -> impl Strategy<Value = (u64, Tamper)> {
        (2u64..60).prop_flat_map(|n| {
            let i = 0..usize::try_from(n).unwrap();
            let pair = (
                0..usize::try_from(n).unwrap(),
                0..usize::try_from(n).unwrap(),
            )
                .prop_filter("two places", |(a, b)| a != b)
                .prop_map(|(a, b)| Tamper::Swap(a.min(b), a.max(b)));
            (
                Just(n),
                prop_oneof![
                    i.clone().prop_map(Tamper::Alter),
                    i.prop_map(Tamper::Delete),
                    pair
                ],
            )
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(96))]

        /// Whatever is altered, removed or swapped, verification names the first record it
        /// touched, and how.
        #[test]
        fn the_first_tampered_record_is_named((n, t) in tamper(), every in 3u64..20) {
            let signer = Signer::from_seed([3; 32]);
            let (mut records, checkpoints) = chain(n, every, &signer);
            let true_head = head(&records).map(|(s, h)| (s, h.to_owned())).unwrap();
            let (seq, problem) = match t {
                Tamper::Alter(i) => {
                    records[i].entry.client.push('!');
                    (records[i].seq, Problem::Altered)
                }
                Tamper::Delete(i) => {
                    let seq = records[i].seq;
                    records.remove(i);
                    (seq, Problem::Missing)
                }
                Tamper::Swap(i, j) => {
                    let (a, b) = (records[i].clone(), records[j].clone());
                    records[i] = Record { seq: a.seq, ..b };
                    records[j] = Record { seq: records[j].seq, ..a };
                    (records[i].seq, Problem::OutOfOrder)
                }
            };
            let verdict = verify(&records, &checkpoints, &signer, Some((true_head.0, &true_head.1)));
            let bad = verdict.first_bad.unwrap();
            prop_assert_eq!((bad.seq, bad.problem), (seq, problem));
        }
    }
}
