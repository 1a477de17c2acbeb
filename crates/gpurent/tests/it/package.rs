//! The `.deb` from `scripts/package.sh`, installed into a fresh Debian root.
