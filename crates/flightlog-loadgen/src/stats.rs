//! Numbers and their presentation: percentiles, the per-phase record every benchmark fills in,
//! the summary table and the one-line JSON summary.

use std::time::Instant;

use serde_json::{json, Map, Value};

use crate::server::{own_cpu_seconds, ServerProcess};

/// Nearest-rank percentile of an ascending slice (`p` in 0..=1); NaN when empty.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

/// p50 / p99 / max of a set of samples (milliseconds, possibly negative).
#[derive(Debug, Clone, Copy)]
pub struct Distribution {
    pub count: usize,
    pub p50: f64,
    pub p99: f64,
    pub max: f64,
    pub min: f64,
}

impl Distribution {
    pub fn of(mut samples: Vec<f64>) -> Self {
        samples.sort_by(f64::total_cmp);
        Self {
            count: samples.len(),
            p50: percentile(&samples, 0.5),
            p99: percentile(&samples, 0.99),
            max: samples.last().copied().unwrap_or(f64::NAN),
            min: samples.first().copied().unwrap_or(f64::NAN),
        }
    }

    pub fn to_json(self) -> Value {
        json!({
            "count": self.count,
            "p50Ms": round3(self.p50),
            "p99Ms": round3(self.p99),
            "maxMs": round3(self.max),
            "minMs": round3(self.min),
        })
    }
}

/// Milliseconds between two instants, negative when `later` is before `earlier`.
pub fn signed_ms(later: Instant, earlier: Instant) -> f64 {
    match later.checked_duration_since(earlier) {
        Some(d) => d.as_secs_f64() * 1e3,
        None => -(earlier.duration_since(later).as_secs_f64() * 1e3),
    }
}

/// A number with 3 decimals for JSON (NaN becomes null, which JSON can hold).
pub fn round3(x: f64) -> Value {
    if x.is_finite() {
        json!((x * 1000.0).round() / 1000.0)
    } else {
        Value::Null
    }
}

pub fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

/// Errors of one phase: how many, and the first one verbatim (the rest are usually the same).
#[derive(Debug, Default)]
pub struct Errors {
    pub count: u64,
    pub first: Option<String>,
}

impl Errors {
    pub fn record(&mut self, message: impl FnOnce() -> String) {
        self.count += 1;
        if self.first.is_none() {
            self.first = Some(message());
        }
    }

    pub fn merge(&mut self, other: Errors) {
        self.count += other.count;
        if self.first.is_none() {
            self.first = other.first;
        }
    }
}

/// What every phase reports.
pub struct PhaseReport {
    /// Short name (`single-op`, `batch-27`, …), also the JSON key.
    pub name: String,
    /// What `throughput` counts ("writes/s", "ops/s", "spans/s").
    pub unit: &'static str,
    /// The headline rate.
    pub throughput: f64,
    pub requests: u64,
    pub seconds: f64,
    /// Request latency (ms) when the phase has one.
    pub latency: Option<Distribution>,
    pub errors: Errors,
    /// Problems that are not request errors (missing changes, wrong order, …): must be 0.
    pub violations: u64,
    pub rss_peak: u64,
    pub server_cpu: f64,
    pub loadgen_cpu: f64,
    /// Lines printed under the table.
    pub notes: Vec<String>,
    /// Everything else, for the JSON summary.
    pub extra: Map<String, Value>,
}

impl PhaseReport {
    /// Server CPU µs per counted unit (write, op, span) and generator CPU µs per request: on a
    /// shared machine these move less than the rates do.
    pub fn cpu_per_unit(&self) -> (f64, f64) {
        let units = (self.throughput * self.seconds).round();
        (
            self.server_cpu * 1e6 / units,
            self.loadgen_cpu * 1e6 / self.requests as f64,
        )
    }

    pub fn to_json(&self) -> Value {
        let mut object = Map::new();
        object.insert("unit".into(), json!(self.unit));
        object.insert("throughput".into(), json!(self.throughput.round()));
        object.insert("requests".into(), json!(self.requests));
        object.insert("seconds".into(), round3(self.seconds));
        if let Some(latency) = self.latency {
            object.insert("requestLatency".into(), latency.to_json());
        }
        object.insert("errors".into(), json!(self.errors.count));
        if let Some(first) = &self.errors.first {
            object.insert("firstError".into(), json!(first));
        }
        object.insert("violations".into(), json!(self.violations));
        object.insert("rssPeakMiB".into(), round3(mib(self.rss_peak)));
        object.insert("serverCpuS".into(), round3(self.server_cpu));
        object.insert("loadgenCpuS".into(), round3(self.loadgen_cpu));
        let (server_us, loadgen_us) = self.cpu_per_unit();
        object.insert("serverCpuUsPerUnit".into(), round3(server_us));
        object.insert("loadgenCpuUsPerRequest".into(), round3(loadgen_us));
        for (key, value) in &self.extra {
            object.insert(key.clone(), value.clone());
        }
        Value::Object(object)
    }
}

/// Resource use of one phase: RSS peak, and CPU seconds of the server and of the generator.
pub struct PhaseMeter {
    server_cpu: f64,
    own_cpu: f64,
}

impl PhaseMeter {
    pub fn start(server: &ServerProcess) -> Self {
        server.rss().take_phase_peak();
        Self {
            server_cpu: server.cpu_seconds(),
            own_cpu: own_cpu_seconds(),
        }
    }

    /// (RSS peak during the phase, server CPU s, load generator CPU s).
    pub fn finish(&self, server: &ServerProcess) -> (u64, f64, f64) {
        (
            server.rss().take_phase_peak(),
            server.cpu_seconds() - self.server_cpu,
            own_cpu_seconds() - self.own_cpu,
        )
    }
}

/// A target from the issue, and whether the measured value met it.
pub struct Target {
    pub what: String,
    pub measured: f64,
    pub goal: f64,
    /// True when bigger is better.
    pub at_least: bool,
    pub unit: &'static str,
}

impl Target {
    pub fn met(&self) -> bool {
        if self.at_least {
            self.measured >= self.goal
        } else {
            self.measured <= self.goal
        }
    }

    pub fn to_json(&self) -> Value {
        json!({
            "what": self.what,
            "measured": round3(self.measured),
            "target": self.goal,
            "atLeast": self.at_least,
            "met": self.met(),
        })
    }
}

/// The human summary: one row per phase, then the targets, then the notes.
pub fn print_table(title: &str, phases: &[PhaseReport], targets: &[Target]) {
    say!("");
    say!("{title}");
    say!(
        "{:<16} {:>14} {:<9} {:>8} {:>8} {:>9} {:>9} {:>7} {:>6} {:>9} {:>8} {:>8}",
        "phase",
        "rate",
        "unit",
        "requests",
        "seconds",
        "p50 ms",
        "p99 ms",
        "errors",
        "viol.",
        "RSS MiB",
        "srv CPU",
        "gen CPU"
    );
    for phase in phases {
        let (p50, p99) = phase
            .latency
            .map_or((f64::NAN, f64::NAN), |l| (l.p50, l.p99));
        say!(
            "{:<16} {:>14.0} {:<9} {:>8} {:>8.2} {:>9.3} {:>9.3} {:>7} {:>6} {:>9.1} {:>7.2}s {:>7.2}s",
            phase.name,
            phase.throughput,
            phase.unit,
            phase.requests,
            phase.seconds,
            p50,
            p99,
            phase.errors.count,
            phase.violations,
            mib(phase.rss_peak),
            phase.server_cpu,
            phase.loadgen_cpu,
        );
    }
    if !targets.is_empty() {
        say!("");
        say!("targets:");
        for target in targets {
            say!(
                "  {:<52} {:>12.1} {:<8} {} {:>10} -> {}",
                target.what,
                target.measured,
                target.unit,
                if target.at_least { ">=" } else { "<=" },
                target.goal,
                if target.met() { "met" } else { "MISSED" }
            );
        }
    }
    for phase in phases {
        say!("");
        say!("{}:", phase.name);
        let (server_us, loadgen_us) = phase.cpu_per_unit();
        say!(
            "  CPU: server {server_us:.1} us per {}, generator {loadgen_us:.1} us per request",
            phase.unit.trim_end_matches("/s").trim_end_matches('s')
        );
        for note in &phase.notes {
            say!("  {note}");
        }
        if let Some(first) = &phase.errors.first {
            say!("  first error: {first}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let samples: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&samples, 0.5), 51.0);
        assert_eq!(percentile(&samples, 0.99), 99.0);
        assert_eq!(percentile(&samples, 1.0), 100.0);
        assert!(percentile(&[], 0.5).is_nan());
    }

    #[test]
    fn distributions_keep_negative_samples() {
        let d = Distribution::of(vec![3.0, -1.0, 2.0]);
        assert_eq!((d.min, d.p50, d.max, d.count), (-1.0, 2.0, 3.0, 3));
    }

    #[test]
    fn signed_ms_goes_both_ways() {
        let a = Instant::now();
        let b = a + std::time::Duration::from_millis(5);
        assert!((signed_ms(b, a) - 5.0).abs() < 1e-9);
        assert!((signed_ms(a, b) + 5.0).abs() < 1e-9);
    }
}
