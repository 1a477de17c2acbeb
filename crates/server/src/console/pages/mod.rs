//! One module per console page (or group of pages), each rendering what the API answers.

// Billing, account and nodes.
pub(crate) mod account;
pub(crate) mod account_tokens;
pub(crate) mod billing;
pub(crate) mod budget_view;
pub(crate) mod nodes;

// Teams (`/teams...`).
pub(crate) mod team;
pub(crate) mod teams;

// The admin pages (`/admin...`).
pub(crate) mod admin;
pub(crate) mod admin_audit;
pub(crate) mod admin_events;
pub(crate) mod admin_reports;
pub(crate) mod admin_reservations;
pub(crate) mod admin_users;
pub(crate) mod endpoints;
pub(crate) mod home;
pub(crate) mod instance;
pub(crate) mod instances;
pub(crate) mod login;
pub(crate) mod offers;
