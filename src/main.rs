//! The `flightlog` binary (placeholder until the CLI lands).
fn main() {}
