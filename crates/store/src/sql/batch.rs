//! Statements sent together: on SQLite in one round trip to its connection's thread (its
//! driver runs a string of statements in order, their parameters anonymous `?`s bound in
//! order), on PostgreSQL one after another. Each statement's rows and count come back apart.

use futures_util::TryStreamExt;
use sqlx::any::AnyRow;
use sqlx::{AnyConnection, Either};

use crate::{Backend, Result};

/// One argument of a batched statement.
#[derive(Debug, Clone)]
pub(super) enum Arg {
    Int(Option<i64>),
    Text(Option<String>),
}

impl From<i64> for Arg {
    fn from(v: i64) -> Self {
        Arg::Int(Some(v))
    }
}

impl From<Option<i64>> for Arg {
    fn from(v: Option<i64>) -> Self {
        Arg::Int(v)
    }
}

impl From<&str> for Arg {
    fn from(v: &str) -> Self {
        Arg::Text(Some(v.to_owned()))
    }
}

impl From<&String> for Arg {
    fn from(v: &String) -> Self {
        Arg::Text(Some(v.clone()))
    }
}

impl From<String> for Arg {
    fn from(v: String) -> Self {
        Arg::Text(Some(v))
    }
}

impl From<Option<&str>> for Arg {
    fn from(v: Option<&str>) -> Self {
        Arg::Text(v.map(str::to_owned))
    }
}

impl From<&Option<String>> for Arg {
    fn from(v: &Option<String>) -> Self {
        Arg::Text(v.clone())
    }
}

/// A statement of a batch: its SQL (`$1`... its own arguments) and arguments.
#[derive(Debug, Clone)]
struct Part {
    sql: String,
    args: Vec<Arg>,
}

/// Statements to run in order, in the caller's transaction.
#[derive(Debug, Default)]
pub(super) struct Batch {
    parts: Vec<Part>,
}

/// What each statement of a batch answered, by the index `Batch::push` gave it.
#[derive(Default)]
pub(super) struct Answers {
    rows: Vec<Vec<AnyRow>>,
    affected: Vec<u64>,
}

impl Answers {
    pub fn rows(&self, part: usize) -> &[AnyRow] {
        self.rows.get(part).map_or(&[], Vec::as_slice)
    }

    pub fn affected(&self, part: usize) -> u64 {
        self.affected.get(part).copied().unwrap_or(0)
    }
}

/// `sql` with each `$N` moved up by `offset` (statements here hold no `$` in literals).
fn renumbered(sql: &str, offset: usize) -> String {
    let mut out = String::with_capacity(sql.len() + 16);
    let mut chars = sql.char_indices().peekable();
    while let Some((_, c)) = chars.next() {
        out.push(c);
        if c != '$' {
            continue;
        }
        let mut n = 0usize;
        let mut digits = false;
        while let Some(&(_, d)) = chars.peek() {
            let Some(v) = d.to_digit(10) else { break };
            n = n * 10 + v as usize;
            digits = true;
            chars.next();
        }
        if digits {
            out.push_str(&(n + offset).to_string());
        }
    }
    out
}

/// Appends `sql` to `out` with each `$N` made an anonymous `?`, and its argument to `args` in
/// the order the `?`s come (a `$N` used twice is bound twice). SQLite looks a named
/// parameter's name up by walking a list of them, and sqlx asks the name of each, so a
/// statement of `n` named parameters costs `n²/2` steps to bind: 2 % of the reservation
/// path's samples with a batch's hundreds of them (`perf`, 2026-12-02). Anonymous ones are
/// bound in order. Statements here hold no `$` or `?` in literals.
fn positional(sql: &str, part_args: &[Arg], out: &mut String, args: &mut Vec<Arg>) {
    let mut chars = sql.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '$' {
            out.push(c);
            continue;
        }
        let mut n = 0usize;
        let mut digits = false;
        while let Some(&d) = chars.peek() {
            let Some(v) = d.to_digit(10) else { break };
            n = n * 10 + v as usize;
            digits = true;
            chars.next();
        }
        match n.checked_sub(1).and_then(|i| part_args.get(i)) {
            Some(arg) if digits => {
                out.push('?');
                args.push(arg.clone());
            }
            // Past the arguments given: SQLite binds NULL to it, as sqlx does.
            _ if digits => {
                out.push('?');
                args.push(Arg::Text(None));
            }
            _ => out.push('$'),
        }
    }
}

fn bind<'q>(
    mut q: sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments<'q>>,
    args: &[Arg],
) -> sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments<'q>> {
    for a in args {
        q = match a {
            Arg::Int(v) => q.bind(*v),
            Arg::Text(v) => q.bind(v.clone()),
        };
    }
    q
}

/// The placeholders `$from, $from + 1, …` of `n` arguments, for an `IN (…)` list.
pub(super) fn placeholders(from: usize, n: usize) -> String {
    (from..from + n)
        .map(|i| format!("${i}"))
        .collect::<Vec<_>>()
        .join(", ")
}

impl Batch {
    /// Adds a statement; returns its index among the answers.
    pub fn push(&mut self, sql: impl Into<String>, args: Vec<Arg>) -> usize {
        self.parts.push(Part {
            sql: sql.into(),
            args,
        });
        self.parts.len() - 1
    }

    /// Runs the statements in order; the first error stops the rest (the caller's
    /// transaction then rolls back).
    pub async fn run(self, conn: &mut AnyConnection, backend: Backend) -> Result<Answers> {
        let mut answers = Answers::default();
        match backend {
            Backend::Postgres => {
                for part in &self.parts {
                    // Rows and the count of rows affected of any statement, whatever its
                    // first word (`WITH ... SELECT` returns rows, `WITH ... UPDATE` may not).
                    #[allow(deprecated)]
                    let mut stream =
                        bind(sqlx::query(&part.sql), &part.args).fetch_many(&mut *conn);
                    let mut rows = Vec::new();
                    let mut affected = 0;
                    while let Some(item) = stream.try_next().await? {
                        match item {
                            Either::Right(row) => rows.push(row),
                            Either::Left(done) => affected += done.rows_affected(),
                        }
                    }
                    answers.affected.push(affected);
                    answers.rows.push(rows);
                }
            }
            Backend::Sqlite => {
                let mut sql = String::new();
                let mut args = Vec::new();
                for part in &self.parts {
                    positional(&part.sql, &part.args, &mut sql, &mut args);
                    sql.push_str(";\n");
                }
                // Several statements in one prepared query is what sqlx 0.8 deprecates (only
                // its SQLite driver runs them, `$N` bound over the whole string, each
                // statement's end reported apart); it is this module's reason to be: one round
                // trip to the connection's thread instead of one per statement.
                #[allow(deprecated)]
                let mut stream = bind(sqlx::query(&sql), &args).fetch_many(&mut *conn);
                let mut rows = Vec::new();
                while let Some(item) = stream.try_next().await? {
                    match item {
                        Either::Right(row) => rows.push(row),
                        // The end of one statement.
                        Either::Left(done) => {
                            answers.rows.push(std::mem::take(&mut rows));
                            answers.affected.push(done.rows_affected());
                        }
                    }
                }
            }
        }
        Ok(answers)
    }
}

impl Batch {
    /// PostgreSQL: the statements sent as one, each a data-modifying CTE named `p{index}`
    /// (a later one may read an earlier one's `RETURNING` by that name; all see the snapshot
    /// the statement began with), so that the batch costs one round trip instead of one per
    /// statement. The answer of part `rows_of`, which must return at least one row, comes
    /// back whole; every part's count comes back as its affected rows. `beside`: a part that
    /// returns one row, and the columns of it that come back on each of `rows_of`'s rows as
    /// `p{part}_{column}`.
    pub async fn run_as_one(
        self,
        conn: &mut AnyConnection,
        rows_of: usize,
        beside: Option<(usize, &[&str])>,
    ) -> Result<Answers> {
        let mut sql = String::from("WITH ");
        let mut args = Vec::new();
        for (i, part) in self.parts.iter().enumerate() {
            if i > 0 {
                sql.push_str(", ");
            }
            let body = renumbered(&part.sql, args.len());
            let returns = body.contains("RETURNING") || body.trim_start().starts_with("SELECT");
            sql.push_str(&format!(
                "p{i} AS ({body}{})",
                if returns { "" } else { " RETURNING 1" }
            ));
            args.extend(part.args.iter().cloned());
        }
        let mut counts: Vec<String> = (0..self.parts.len())
            .map(|i| format!("(SELECT COUNT(*) FROM p{i}) AS batch_count_{i}"))
            .collect();
        if let Some((part, columns)) = beside {
            counts.extend(
                columns
                    .iter()
                    .map(|c| format!("(SELECT {c} FROM p{part}) AS p{part}_{c}")),
            );
        }
        sql.push_str(&format!(
            " SELECT p{rows_of}.*, {} FROM p{rows_of}",
            counts.join(", ")
        ));
        let rows = bind(sqlx::query(&sql), &args).fetch_all(&mut *conn).await?;
        let mut answers = Answers::default();
        for i in 0..self.parts.len() {
            let count: i64 = match rows.first() {
                Some(row) => sqlx::Row::try_get(row, format!("batch_count_{i}").as_str())?,
                None => 0,
            };
            answers.affected.push(u64::try_from(count).unwrap_or(0));
            answers.rows.push(Vec::new());
        }
        if let Some(slot) = answers.rows.get_mut(rows_of) {
            *slot = rows;
        }
        Ok(answers)
    }
}

#[cfg(test)]
mod tests {
    use sqlx::Row;

    use super::{positional, renumbered, Arg, Batch};
    use crate::testing::TestDatabase;
    use crate::{Backend, SqlStore};

    #[test]
    fn sqlite_parameters_are_anonymous_in_the_order_they_come() {
        let mut sql = String::from("SELECT 1;\n");
        let mut args = vec![Arg::from(0)];
        positional(
            "UPDATE t SET a = $2 WHERE b = $1 AND c = $2",
            &[Arg::from(1), Arg::from("two")],
            &mut sql,
            &mut args,
        );
        assert_eq!(sql, "SELECT 1;\nUPDATE t SET a = ? WHERE b = ? AND c = ?");
        let shown: Vec<String> = args.iter().map(|a| format!("{a:?}")).collect();
        assert_eq!(
            shown,
            [
                "Int(Some(0))",
                "Text(Some(\"two\"))",
                "Int(Some(1))",
                "Text(Some(\"two\"))"
            ]
        );
    }

    /// Rows and counts come back whatever a statement's first word: a `WITH ... SELECT`'s
    /// rows, a `WITH ... UPDATE`'s count without rows, an `INSERT ... RETURNING`'s both.
    async fn every_statement_answers_its_rows_and_count(backend: Backend) {
        let db = TestDatabase::new(backend).await.expect("test database");
        let store = SqlStore::connect(&db.url).await.expect("connect");
        let mut tx = store.begin().await.expect("begin");
        sqlx::query("CREATE TEMP TABLE batch_notes (note TEXT NOT NULL)")
            .execute(&mut *tx)
            .await
            .expect("a table of the test's own");
        let mut batch = Batch::default();
        let made = batch.push(
            "INSERT INTO batch_notes (note) VALUES ($1), ($2) RETURNING note",
            vec![Arg::from("a"), Arg::from("b")],
        );
        let read = batch.push(
            "WITH n AS (SELECT note FROM batch_notes) SELECT note FROM n ORDER BY note",
            Vec::new(),
        );
        let moved = batch.push(
            "WITH n AS (SELECT $1 AS note) UPDATE batch_notes SET note = note \
             WHERE note IN (SELECT note FROM n)",
            vec![Arg::from("a")],
        );
        let answers = batch.run(&mut tx, backend).await.expect("run");
        assert_eq!((answers.rows(made).len(), answers.affected(made)), (2, 2));
        let notes: Vec<String> = answers
            .rows(read)
            .iter()
            .map(|r| r.try_get("note").expect("note"))
            .collect();
        assert_eq!(notes, ["a", "b"]);
        assert_eq!((answers.rows(moved).len(), answers.affected(moved)), (0, 1));
        tx.rollback().await.expect("rollback");
        store.close().await;
    }

    #[tokio::test]
    async fn every_statement_answers_its_rows_and_count_sqlite() {
        every_statement_answers_its_rows_and_count(Backend::Sqlite).await;
    }

    #[tokio::test]
    async fn every_statement_answers_its_rows_and_count_postgres() {
        every_statement_answers_its_rows_and_count(Backend::Postgres).await;
    }

    #[test]
    fn arguments_are_numbered_over_the_whole_batch() {
        assert_eq!(
            renumbered("UPDATE t SET a = $1 WHERE b = $2 AND c = $10", 3),
            "UPDATE t SET a = $4 WHERE b = $5 AND c = $13"
        );
        assert_eq!(renumbered("SELECT 1", 7), "SELECT 1");
    }
}
