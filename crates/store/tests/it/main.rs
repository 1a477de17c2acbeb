//! The store's test suite, run against SQLite and PostgreSQL alike.

mod lifecycle;
mod support;
