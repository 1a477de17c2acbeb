//! The web console (placeholder until the console's foundation lands on main).

pub(crate) mod terminal;
