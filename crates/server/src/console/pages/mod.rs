//! One module per console page (or group of pages), each rendering what the API answers.

// Billing, account and nodes.
pub(crate) mod account;
pub(crate) mod billing;
pub(crate) mod nodes;

// The admin pages (`/admin...`).
pub(crate) mod admin;
pub(crate) mod admin_audit;
pub(crate) mod admin_events;
pub(crate) mod admin_reports;
pub(crate) mod admin_reservations;
pub(crate) mod admin_users;
pub(crate) mod home;
pub(crate) mod instance;
pub(crate) mod instances;
pub(crate) mod login;
pub(crate) mod offers;
