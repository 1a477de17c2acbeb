//! One module per console page (or group of pages), each rendering what the API answers.

pub(crate) mod home;
pub(crate) mod instance;
pub(crate) mod instances;
pub(crate) mod login;
pub(crate) mod offers;
