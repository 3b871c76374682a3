//! The server's SQLite writer thread during a phase, read from `GET /metrics` before and after
//! it: how many group commits it ran, how many writes each held, and how busy it was.
//!
//! The writer thread is the one serial resource of the SQLite backend, so this tells what limits
//! a phase: a writer busy for nearly the whole phase is the bottleneck (fewer instructions per
//! write there raise the rate), one busy for a third of it is not (the request path, the kernel
//! or the generator are). A server that exports no writer metrics (another backend, an older
//! build) just leaves the line out.

use reqwest::{Client, Url};
use serde_json::{json, Map, Value};

use crate::stats::round3;

/// The writer's counters at one moment.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WriterSample {
    transactions: f64,
    writes: f64,
    /// Apply plus commit seconds.
    busy_seconds: f64,
}

/// What the writer did between two samples.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WriterUse {
    pub transactions: f64,
    pub writes_per_transaction: f64,
    /// Busy seconds over the phase's seconds (0 to 1).
    pub busy_share: f64,
}

const TRANSACTIONS: &str = "flightlog_sqlite_writer_transactions_total";
const WRITES: &str = "flightlog_sqlite_writer_writes_total";
const APPLY: &str = "flightlog_sqlite_writer_apply_seconds_total";
const COMMIT: &str = "flightlog_sqlite_writer_commit_seconds_total";

/// The writer's counters from the server's `/metrics`; `None` when it cannot be read or does
/// not have them.
pub async fn sample(client: &Client, base: &Url) -> Option<WriterSample> {
    let url = base.join("/metrics").ok()?;
    let response = client.get(url).send().await.ok()?;
    if !response.status().is_success() {
        return None;
    }
    parse(&response.text().await.ok()?)
}

fn parse(exposition: &str) -> Option<WriterSample> {
    let value = |name: &str| {
        exposition.lines().find_map(|line| {
            let rest = line.strip_prefix(name)?.strip_prefix(' ')?;
            rest.trim().parse::<f64>().ok()
        })
    };
    Some(WriterSample {
        transactions: value(TRANSACTIONS)?,
        writes: value(WRITES)?,
        busy_seconds: value(APPLY)? + value(COMMIT)?,
    })
}

/// The writer's use over a phase of `seconds`, when both samples exist.
pub fn between(
    before: Option<WriterSample>,
    after: Option<WriterSample>,
    seconds: f64,
) -> Option<WriterUse> {
    let (before, after) = (before?, after?);
    let transactions = after.transactions - before.transactions;
    let writes = after.writes - before.writes;
    Some(WriterUse {
        transactions,
        writes_per_transaction: if transactions > 0.0 {
            writes / transactions
        } else {
            0.0
        },
        busy_share: if seconds > 0.0 {
            (after.busy_seconds - before.busy_seconds) / seconds
        } else {
            0.0
        },
    })
}

impl WriterUse {
    /// The line under the phase's table.
    pub fn note(&self) -> String {
        format!(
            "writer thread: {:.0} transactions, {:.1} write jobs each, busy {:.0}% of the phase",
            self.transactions,
            self.writes_per_transaction,
            self.busy_share * 100.0
        )
    }

    /// Add the line under the phase's table and the `writer` entry of its JSON.
    pub fn report(self, notes: &mut Vec<String>, extra: &mut Map<String, Value>) {
        notes.push(self.note());
        extra.insert("writer".into(), self.to_json());
    }

    pub fn to_json(self) -> Value {
        json!({
            "transactions": self.transactions,
            "writeJobsPerTransaction": round3(self.writes_per_transaction),
            "busyShare": round3(self.busy_share),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_writer_counters_are_read_from_the_exposition() {
        let text = "# HELP flightlog_sqlite_writer_transactions_total Transactions.\n\
                    # TYPE flightlog_sqlite_writer_transactions_total counter\n\
                    flightlog_sqlite_writer_transactions_total 10.0\n\
                    flightlog_sqlite_writer_transactions_totalx 99\n\
                    flightlog_sqlite_writer_writes_total 250\n\
                    flightlog_sqlite_writer_apply_seconds_total 0.75\n\
                    flightlog_sqlite_writer_commit_seconds_total 0.25\n";
        let sample = parse(text);
        assert_eq!(
            sample,
            Some(WriterSample {
                transactions: 10.0,
                writes: 250.0,
                busy_seconds: 1.0
            })
        );
        assert_eq!(parse("flightlog_http_write_limit 4\n"), None);
    }

    #[test]
    fn use_is_the_difference_over_the_phase() {
        let before = WriterSample {
            transactions: 10.0,
            writes: 250.0,
            busy_seconds: 1.0,
        };
        let after = WriterSample {
            transactions: 30.0,
            writes: 850.0,
            busy_seconds: 2.5,
        };
        let used = between(Some(before), Some(after), 2.0);
        assert_eq!(
            used,
            Some(WriterUse {
                transactions: 20.0,
                writes_per_transaction: 30.0,
                busy_share: 0.75
            })
        );
        assert!(used.is_some_and(|used| used.note().contains("busy 75%")));
        assert_eq!(between(None, Some(after), 2.0), None);
    }
}
