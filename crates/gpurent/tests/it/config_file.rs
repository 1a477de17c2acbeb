//! The configuration files: `--config`, `config check`, `config print` and SIGHUP.
