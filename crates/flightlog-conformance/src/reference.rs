//! Scenarios recorded by the reference itself, for the test suite.
//!
//! The stock fixtures are 80 scenarios someone wrote or generated once. `tools/reference-diff`
//! records any number more: seeded random scenarios (and the journal's edge set) run on the
//! reference TypeScript under Bun, written in the same fixture format. The test suite records a
//! fixed, small set of them at every run and replays it like the stock fixtures (in process
//! here, over HTTP in the server's tests), so a change that moves flightlog away from the
//! reference on ground the stock fixtures do not cover fails the suite. Larger sets are for
//! `tools/reference-diff/run.sh` by hand.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The first seed of the recorded set.
pub const FIRST_SEED: u32 = 1;

/// Scenarios per store (the journal adds its edge set): about 10,000 steps each, a few
/// seconds to record and to replay in process.
pub const SCENARIOS_PER_STORE: u32 = 40;

/// `tools/reference-diff/run.sh` of this repository.
pub fn reference_diff_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tools/reference-diff/run.sh")
}

/// Record the fixed set for both stores into `out` (`out/activity`, `out/journal`), with the
/// reference on Bun (installed with npm on first use, see the script). The script first checks
/// that its recorders reproduce every stock fixture. The generators' `FUZZ_*` knobs are not
/// passed on, so the set is the same whatever the caller's environment. An error carries the
/// script's output.
pub fn record_reference_scenarios(out: &Path) -> Result<(), String> {
    let script = reference_diff_script();
    let mut command = Command::new("sh");
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("FUZZ_") {
            command.env_remove(name);
        }
    }
    let output = command
        .arg(&script)
        .arg("record")
        .arg("both")
        .arg(FIRST_SEED.to_string())
        .arg(SCENARIOS_PER_STORE.to_string())
        .arg(out)
        .output()
        .map_err(|err| format!("cannot run {}: {err}", script.display()))?;
    if output.status.success() {
        return Ok(());
    }
    Err(format!(
        "{} record failed ({}); it needs the reference in ../shared and Bun (BUN=..., bun on \
         PATH, or npm to install it):\n{}{}",
        script.display(),
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    ))
}
