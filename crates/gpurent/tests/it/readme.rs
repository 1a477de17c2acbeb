//! The README's two commands and its tour, run as written.
