//! What a storage backend reports about its own machinery (a SQLite writer's group commits and
//! WAL, a PostgreSQL pool's waits), for the server's `GET /metrics`.
//!
//! The store traits name no backend type, so a backend reports plain samples: a metric name of
//! its choosing (prefixed with the backend's name, such as `flightlog_sqlite_`), a help text, a
//! kind and a value. The server exports them as they are. Reading them must be cheap (atomic
//! counters, a file's size): every scrape reads them.

/// How a sample behaves over time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricKind {
    /// Only goes up (until the process restarts); exported with the `_total` suffix.
    Counter,
    /// A current value that may go up and down.
    Gauge,
}

/// One sample of a backend's metrics.
#[derive(Debug, Clone, PartialEq)]
pub struct BackendMetric {
    /// The metric name without any `_total` suffix (the exporter adds it to counters), in
    /// Prometheus' charset: `[a-zA-Z_:][a-zA-Z0-9_:]*`.
    pub name: &'static str,
    /// One line saying what is counted, for the exposition's `# HELP`.
    pub help: &'static str,
    pub kind: MetricKind,
    pub value: f64,
}

impl BackendMetric {
    /// A counter sample.
    pub fn counter(name: &'static str, help: &'static str, value: f64) -> Self {
        Self {
            name,
            help,
            kind: MetricKind::Counter,
            value,
        }
    }

    /// A gauge sample.
    pub fn gauge(name: &'static str, help: &'static str, value: f64) -> Self {
        Self {
            name,
            help,
            kind: MetricKind::Gauge,
            value,
        }
    }
}
