//! Instances' output, as the bytes their agents shipped: appended chunk by chunk (each checked
//! against the reservation's node, epoch and its own size), capped, read from any byte, and
//! pruned once its reservation ended longer ago than kept.

use std::collections::BTreeMap;

use gpurent_types::agent::{LogChunk, LOG_CAP_BYTES, LOG_TAIL_BYTES};
use sqlx::{AnyConnection, Row};

use super::fragments::live_statuses;

use crate::Result;

/// The head kept of a reservation's output: the cap less the tail kept past it, so that head,
/// marker and tail stay about the cap.
const HEAD_BYTES: i64 = (LOG_CAP_BYTES - LOG_TAIL_BYTES) as i64;
const TAIL_BYTES: i64 = LOG_TAIL_BYTES as i64;

/// The line put where output was left out (it starts on a line of its own).
fn gap_marker(left_out: i64) -> Vec<u8> {
    format!(
        "\n[gpurent: {left_out} bytes of output left out here; a log keeps the first {HEAD_BYTES} bytes and the last {TAIL_BYTES} of each run]\n"
    )
    .into_bytes()
}

/// Where the reservation's log stands.
struct LogState {
    epoch: i64,
    /// Bytes stored (the offset of the next row).
    stored: i64,
    /// Bytes of this epoch's output received (the agent's offset).
    read: i64,
    /// Where this epoch's kept head ended, once the head is full.
    cut: Option<i64>,
    /// Bytes kept after this epoch's gap marker, once it is written.
    tail: Option<i64>,
}

/// Stores what of the chunk continues the reservation's log, within the cap. Refused (not
/// stored, a warning logged): a chunk from a node the reservation is not on, of another epoch,
/// whose data is not its declared length, that leaves a gap while the head has room, or of a
/// reservation that ended. A repeat (an agent that did not see the last answer) is dropped.
pub(crate) async fn append(
    conn: &mut AnyConnection,
    node_id: &str,
    chunk: &LogChunk,
) -> Result<()> {
    let id = &chunk.reservation_id;
    let refuse = |why: &str| {
        tracing::warn!(reservation_id = %id, %node_id, offset = chunk.offset, length = chunk.length, why, "output chunk refused");
        Ok(())
    };
    // An update that changes nothing, to lock the row (PostgreSQL) while the chunk is placed.
    let row = sqlx::query(concat!(
        "UPDATE reservations SET log_read = log_read WHERE id = $1 AND status IN ",
        live_statuses!(),
        " RETURNING node_id, epoch, log_bytes, log_read, log_cut, log_tail"
    ))
    .bind(id)
    .fetch_optional(&mut *conn)
    .await?;
    let Some(row) = row else {
        return refuse("no live reservation of that id");
    };
    if row.try_get::<Option<String>, _>("node_id")?.as_deref() != Some(node_id) {
        return refuse("the reservation is not on this node");
    }
    let mut log = LogState {
        epoch: row.try_get("epoch")?,
        stored: row.try_get("log_bytes")?,
        read: row.try_get("log_read")?,
        cut: row.try_get("log_cut")?,
        tail: row.try_get("log_tail")?,
    };
    if chunk.epoch.is_some_and(|e| e != log.epoch) {
        return refuse("the output of another epoch's run");
    }
    let Ok(mut bytes) = chunk.bytes() else {
        return refuse("its data is not base64");
    };
    if bytes.len() as u64 != chunk.length {
        return refuse("its data is not the length it declares");
    }
    let Ok(offset) = i64::try_from(chunk.offset) else {
        return refuse("its offset is out of range");
    };
    let end = offset.saturating_add(bytes.len() as i64);
    if end <= log.read {
        return Ok(());
    }
    // What of a partly repeated chunk is new.
    let (offset, mut bytes) = if offset < log.read {
        let skip = usize::try_from(log.read - offset).unwrap_or(usize::MAX);
        (log.read, bytes.split_off(skip.min(bytes.len())))
    } else {
        (offset, bytes)
    };
    if log.cut.is_none() && log.stored < HEAD_BYTES {
        if offset != log.read {
            return refuse("it leaves a gap in the output");
        }
        let room = usize::try_from(HEAD_BYTES - log.stored).unwrap_or(usize::MAX);
        if bytes.len() > room {
            // The rest of this chunk is in the gap; the tail comes once the run ended.
            bytes.truncate(room);
            log.cut = Some(offset + room as i64);
        }
        insert(conn, id, log.stored, &bytes).await?;
        log.stored += bytes.len() as i64;
    } else {
        // The head is full: only the end of the run is kept, after a marker.
        let cut = *log.cut.get_or_insert(log.read);
        let mut kept = match log.tail {
            Some(_) if offset != log.read => return refuse("it leaves a gap in the tail"),
            Some(kept) => kept,
            None => {
                if offset > cut {
                    let marker = gap_marker(offset - cut);
                    insert(conn, id, log.stored, &marker).await?;
                    log.stored += marker.len() as i64;
                }
                0
            }
        };
        let room = usize::try_from((TAIL_BYTES - kept).max(0)).unwrap_or(0);
        bytes.truncate(room);
        if !bytes.is_empty() {
            insert(conn, id, log.stored, &bytes).await?;
            log.stored += bytes.len() as i64;
            kept += bytes.len() as i64;
        }
        log.tail = Some(kept);
    }
    sqlx::query(
        "UPDATE reservations SET log_bytes = $1, log_read = $2, log_cut = $3, log_tail = $4
         WHERE id = $5",
    )
    .bind(log.stored)
    .bind(end)
    .bind(log.cut)
    .bind(log.tail)
    .bind(id)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

async fn insert(conn: &mut AnyConnection, id: &str, at: i64, bytes: &[u8]) -> Result<()> {
    if bytes.is_empty() {
        return Ok(());
    }
    sqlx::query(
        "INSERT INTO reservation_output (reservation_id, byte_offset, data) VALUES ($1, $2, $3)",
    )
    .bind(id)
    .bind(at)
    .bind(bytes.to_vec())
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// Longest note the platform writes into a log (a longer one is cut at a character boundary).
const NOTE_MAX_BYTES: usize = 2000;

/// Writes a line of the platform's own into the reservation's log (`[gpurent] ...`, on a line
/// of its own), whatever its status: why a start failed, why the instance was stopped. It is
/// stored after what the log holds and moves neither the agent's offset nor the kept head's
/// cut, so the output still shipped lands after it.
pub(crate) async fn note(conn: &mut AnyConnection, id: &str, line: &str) -> Result<()> {
    let row = sqlx::query(
        "UPDATE reservations SET log_read = log_read WHERE id = $1 RETURNING log_bytes",
    )
    .bind(id)
    .fetch_optional(&mut *conn)
    .await?;
    let Some(row) = row else {
        return Err(crate::StoreError::NotFound {
            what: "reservation",
            id: id.to_owned(),
        });
    };
    let stored: i64 = row.try_get("log_bytes")?;
    let last: Option<Vec<u8>> = sqlx::query_scalar(
        // Only its last byte: a row may hold a megabyte of output.
        "SELECT substr(data, length(data), 1) FROM reservation_output WHERE reservation_id = $1
         ORDER BY byte_offset DESC LIMIT 1",
    )
    .bind(id)
    .fetch_optional(&mut *conn)
    .await?;
    let mut text = line.trim_end().replace(['\r', '\n'], " ");
    gpurent_types::text::cut_to_bytes(&mut text, NOTE_MAX_BYTES);
    let starts_line = last.as_deref().is_none_or(|d| d == b"\n".as_slice());
    let bytes = format!("{}[gpurent] {text}\n", if starts_line { "" } else { "\n" }).into_bytes();
    insert(conn, id, stored, &bytes).await?;
    sqlx::query("UPDATE reservations SET log_bytes = $1 WHERE id = $2")
        .bind(stored + bytes.len() as i64)
        .bind(id)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// The log's bytes from `offset` on, at most `max`, and the offset that follows them.
pub(crate) async fn read(
    conn: &mut AnyConnection,
    id: &str,
    offset: u64,
    max: u64,
) -> Result<(Vec<u8>, u64)> {
    let from = i64::try_from(offset).unwrap_or(i64::MAX);
    // From the row that holds byte `offset` on.
    let rows = sqlx::query(
        "SELECT byte_offset, data FROM reservation_output
         WHERE reservation_id = $1 AND byte_offset >= COALESCE(
             (SELECT MAX(byte_offset) FROM reservation_output
              WHERE reservation_id = $1 AND byte_offset <= $2), 0)
         ORDER BY byte_offset LIMIT 256",
    )
    .bind(id)
    .bind(from)
    .fetch_all(&mut *conn)
    .await?;
    let max = usize::try_from(max).unwrap_or(usize::MAX);
    let mut out = Vec::new();
    for row in rows {
        let start: i64 = row.try_get("byte_offset")?;
        let data: Vec<u8> = row.try_get("data")?;
        // Only the first row can start before `offset`.
        let skip = usize::try_from((from - start).max(0)).unwrap_or(usize::MAX);
        if skip >= data.len() {
            continue;
        }
        let take = (data.len() - skip).min(max - out.len());
        out.extend_from_slice(&data[skip..skip + take]);
        if out.len() >= max {
            break;
        }
    }
    let next = offset + out.len() as u64;
    Ok((out, next))
}

/// Per live reservation on the node, the bytes its log still keeps from the agent's offset on
/// before only the run's tail is kept.
pub(crate) async fn rooms(
    conn: &mut AnyConnection,
    node_id: &str,
) -> Result<BTreeMap<String, u64>> {
    let rows = sqlx::query(concat!(
        "SELECT id, log_bytes, log_cut FROM reservations WHERE node_id = $1 AND status IN ",
        live_statuses!()
    ))
    .bind(node_id)
    .fetch_all(&mut *conn)
    .await?;
    rows.iter()
        .map(|r| {
            let stored: i64 = r.try_get("log_bytes")?;
            let cut: Option<i64> = r.try_get("log_cut")?;
            let room = match cut {
                Some(_) => 0,
                None => u64::try_from(HEAD_BYTES - stored).unwrap_or(0),
            };
            Ok((r.try_get("id")?, room))
        })
        .collect()
}

/// Removes the logs of reservations that ended before `before`, a batch at a time; how many
/// reservations' logs went.
pub(crate) async fn prune(conn: &mut AnyConnection, before: i64) -> Result<u64> {
    let ids: Vec<String> = sqlx::query_scalar(
        "SELECT id FROM reservations WHERE ended_at < $1 AND log_bytes > 0 LIMIT 100",
    )
    .bind(before)
    .fetch_all(&mut *conn)
    .await?;
    for id in &ids {
        sqlx::query("DELETE FROM reservation_output WHERE reservation_id = $1")
            .bind(id)
            .execute(&mut *conn)
            .await?;
        sqlx::query("UPDATE reservations SET log_bytes = 0 WHERE id = $1")
            .bind(id)
            .execute(&mut *conn)
            .await?;
    }
    Ok(ids.len() as u64)
}
