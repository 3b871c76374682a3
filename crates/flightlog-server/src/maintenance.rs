//! Scheduled maintenance: what `flightlog serve` does on its own, every `--maintenance-every-ms`,
//! so that a server nobody tends stays right and bounded.
//!
//! Without it the maintenance endpoints only run when someone calls them, and on a server
//! nobody tends that means never: a run whose writer crashed stayed "running" forever (the
//! stale sweep exists so that such runs end), old span detail and idle engagements grew the
//! file without bound (retention exists so that they do not). Each pass does, in this order:
//!
//! 1. **Stale sweep** (`--stale-after-ms`, default 2 hours): the reference's `sweepStale`,
//!    acting as the maintenance identity `serve:<instance>/maintenance`, which nothing writes
//!    under (clients cannot take a `serve:` name), so every open run is judged by its root's
//!    heartbeat, the runs of requests that named no writer included: the server being alive
//!    says nothing about the clients that wrote under its name. Not before the server has been
//!    up for the staleness window: while it was down no client could heartbeat, and a run whose
//!    writer is alive must get a full window to show it. In steps of [`STALE_SWEEP_STEP`] roots a
//!    transaction (`sweep_stale_step`), for at most half of [`PRUNE_TIME_BUDGET`] a pass, so a backlog
//!    never holds writers up for long. Then, with the same window and the other half of the
//!    budget (so a backlog of one never starves the other), the spans left
//!    open in runs that have no open root (`sweep_leftovers_step`: the root ended without
//!    them, or never arrived), which the reference never closes and which would keep their
//!    runs "running" and unprunable for ever; a run goes when its last sign of life (any
//!    span's start or end, an open span's heartbeat) is older than the window.
//! 2. **Stuck-run watchdog** (`--stuck-after-ms`, default 1 hour): open roots running longer
//!    than that (`find_stuck`), alive (the stale sweep spares them) but not finishing. Their
//!    count is the `flightlog_runs_stuck` gauge (for an alert), and each run that becomes stuck
//!    is named once in the server's output.
//! 3. **Activity prune** (`--prune-after-ms`, default 30 days): the detail (spans, events,
//!    change rows) of runs that ended longer ago than that (no span of theirs started or ended
//!    since: a rollup's end is its first root's) is deleted, their rollups kept (made again
//!    from the detail first), in
//!    transactions of at most [`PRUNE_BATCH`] runs and [`PRUNE_SPAN_BUDGET`] spans (as the
//!    rollups count them), so writers wait behind a few tens of milliseconds at most: 50 runs
//!    may be 500 spans or 50 million. Each call also trims up to 20,000 change-log rows far
//!    behind the newest, and the pass goes on while a call prunes or trims anything, for at
//!    most [`PRUNE_TIME_BUDGET`] or a quarter of the interval, the longer (a large backlog is
//!    worked off over several passes). A run is never split, so a single run bigger than
//!    the budget takes one transaction of its own.
//!    The floor and the ceiling are the same time, so a run pruned by this retention is not
//!    marked as a digest coverage gap: there is no digest job, the retention is the choice.
//! 4. **Journal prune** (`journal.max_age_ms`, default 30 days, `off` for none): engagements
//!    nothing was appended to for longer than the journal's retention are removed
//!    (`prune_idle`: judged by when the appends arrived, on the store's clock, not by the `at`
//!    clients give their events as the reference's `prune(now)` does: a client backdating an
//!    event, or giving `at` in seconds, must not get a live engagement deleted unasked).
//!
//! Every time comes from the stores' clock, so under `--manual-clock` a test drives it through
//! `PUT /v1/testing/clock`. A step that fails (a full disk, the file lost) is counted in
//! `flightlog_maintenance_passes_total{result="error"}`, said once until it succeeds again, and
//! tried again at the next pass; it never stops the server or the other steps. Several servers
//! on one database each run their passes: every step is checked inside its write transaction,
//! so doing one twice changes nothing.

use std::collections::HashSet;
use std::future::Future;
use std::io::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use flightlog_core::activity::{ActivityStore, PruneOptions, SpanRow};
use flightlog_core::journal::EngagementJournal;
use flightlog_core::Clock;

use crate::metrics::MaintenanceMetrics;
use crate::state::AppState;

/// The most runs pruned in one transaction (the reference's default batch).
pub const PRUNE_BATCH: i64 = 50;

/// The most spans one prune transaction deletes (the first run is always taken, however big):
/// about 30 ms of deleting on this project's 2-core machine (150,000 spans/s, BENCHMARKS.md).
pub const PRUNE_SPAN_BUDGET: i64 = 5_000;

/// Stale roots whose runs one sweep transaction closes (a run of ten spans closes in about
/// 20 us here, so a step stays within a few milliseconds for runs of common sizes).
pub const STALE_SWEEP_STEP: i64 = 200;

/// How long one pass keeps sweeping or pruning steps before leaving the rest to the next pass.
pub const PRUNE_TIME_BUDGET: Duration = Duration::from_secs(2);

/// Runs the watchdog remembers as already reported; past it, newly stuck runs are counted in
/// the output but no longer named one by one (the gauge stays exact).
const STUCK_MEMORY: usize = 10_000;

/// Runs named in the output per pass; the rest are counted.
const STUCK_NAMED_PER_PASS: usize = 5;

/// What the scheduled passes do, each step `None` when switched off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MaintenancePlan {
    /// Time between passes.
    pub every: Duration,
    /// Close runs whose open root had no heartbeat for this long (ms), and the spans left open
    /// in runs without an open root that showed no life for this long.
    pub stale_after_ms: Option<i64>,
    /// Count (and name once) open roots running longer than this (ms).
    pub stuck_after_ms: Option<i64>,
    /// Delete the detail of runs that ended longer ago than this (ms).
    pub prune_after_ms: Option<i64>,
    /// Remove engagements idle past the journal's retention (`journal.max_age_ms`).
    pub journal_prune: bool,
}

impl MaintenancePlan {
    /// Every step on, with the defaults of `flightlog serve`.
    pub const DEFAULT: MaintenancePlan = MaintenancePlan {
        every: Duration::from_secs(60),
        stale_after_ms: Some(2 * 60 * 60 * 1000),
        stuck_after_ms: Some(60 * 60 * 1000),
        prune_after_ms: Some(30 * 24 * 60 * 60 * 1000),
        journal_prune: true,
    };

    /// One line for the server's start-up output saying what the passes will do.
    pub fn describe(&self, journal_max_age_ms: i64) -> String {
        let mut steps = Vec::new();
        if let Some(ms) = self.stale_after_ms {
            steps.push(format!(
                "close runs whose writer is silent for {}",
                human_duration(ms)
            ));
        }
        if let Some(ms) = self.stuck_after_ms {
            steps.push(format!(
                "report runs open over {} as stuck",
                human_duration(ms)
            ));
        }
        if let Some(ms) = self.prune_after_ms {
            steps.push(format!(
                "prune the span detail of runs ended over {} ago (rollups kept)",
                human_duration(ms)
            ));
        }
        if self.journal_prune {
            steps.push(format!(
                "remove engagements idle for {}",
                human_duration(journal_max_age_ms)
            ));
        }
        if steps.is_empty() {
            return "maintenance: every step is off".to_owned();
        }
        format!(
            "maintenance every {}: {}",
            human_duration(i64::try_from(self.every.as_millis()).unwrap_or(i64::MAX)),
            steps.join("; ")
        )
    }
}

/// What one pass did (for the tests, and the output lines).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PassReport {
    /// Spans the stale sweep closed (leftovers of ended runs included).
    pub stale_spans_closed: i64,
    /// Open roots running longer than the stuck threshold now (`None`: the step is off).
    pub stuck_runs: Option<usize>,
    /// The runs that became stuck in this pass, by run id (at most what the output names).
    pub newly_stuck: Vec<String>,
    /// Runs whose detail was pruned.
    pub runs_pruned: i64,
    /// Spans deleted with them.
    pub spans_pruned: i64,
    /// Engagements removed by the journal's retention.
    pub engagements_removed: u64,
    /// The steps that failed, with why.
    pub errors: Vec<(Step, String)>,
}

/// A step of a pass (the `step` label of the maintenance metrics).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Step {
    /// The stale sweep.
    StaleSweep,
    /// The stuck-run watchdog.
    Stuck,
    /// The activity prune.
    Prune,
    /// The journal prune.
    JournalPrune,
}

impl Step {
    /// Every step, in pass order.
    pub const ALL: [Step; 4] = [
        Step::StaleSweep,
        Step::Stuck,
        Step::Prune,
        Step::JournalPrune,
    ];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Step::StaleSweep => "stale_sweep",
            Step::Stuck => "stuck",
            Step::Prune => "prune",
            Step::JournalPrune => "journal_prune",
        }
    }
}

/// The scheduled maintenance of one server: its plan, its stores and what it remembers
/// between passes.
pub struct Maintenance {
    plan: MaintenancePlan,
    /// The activity store acting as the maintenance identity.
    sweeper: Arc<dyn ActivityStore>,
    journal: Arc<dyn EngagementJournal>,
    clock: Arc<dyn Clock>,
    metrics: MaintenanceMetrics,
    /// The clock's time when this maintenance was made (the server's start).
    started_at_ms: i64,
    /// Stuck runs already named in the output.
    reported_stuck: HashSet<String>,
    /// Stuck runs past [`STUCK_MEMORY`] at the last pass (counted in the output, not named).
    unremembered_stuck: usize,
    /// The steps whose failure was said and has not cleared since.
    failing: HashSet<Step>,
}

impl std::fmt::Debug for Maintenance {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Maintenance")
            .field("plan", &self.plan)
            .field("sweeper", &self.sweeper.writer())
            .field("started_at_ms", &self.started_at_ms)
            .finish_non_exhaustive()
    }
}

/// The maintenance identity of `instance`'s servers: `serve:<instance>/maintenance`. No client
/// can write under it (the `serve:` names are refused in `Flightlog-Writer`), and the passes
/// write no span under it either (they close and prune spans, which keeps their writers), so
/// the boot sweep, which closes open spans whose writer starts with `serve:<instance>/`,
/// never finds one of it.
pub fn maintenance_writer(instance: &str) -> String {
    format!("serve:{instance}/maintenance")
}

impl Maintenance {
    /// The maintenance of the server of `state`, acting as `writer` (see
    /// [`maintenance_writer`]), taking every time from `clock` (the stores' clock).
    pub fn new(
        state: &AppState,
        writer: &str,
        clock: Arc<dyn Clock>,
        plan: MaintenancePlan,
    ) -> Self {
        let started_at_ms = clock.now_ms();
        Self {
            plan,
            sweeper: state.activity_as(writer),
            journal: Arc::clone(state.journal()),
            clock,
            metrics: state.metrics().maintenance(),
            started_at_ms,
            reported_stuck: HashSet::new(),
            unremembered_stuck: 0,
            failing: HashSet::new(),
        }
    }

    /// Run a pass every `plan.every` (the first one interval after the start) until `stop`
    /// completes; a pass under way finishes its current store call first.
    pub async fn run(mut self, stop: impl Future<Output = ()>) {
        // tokio's interval refuses a zero period; the settings never give one, a library
        // caller might.
        let every = self.plan.every.max(Duration::from_millis(1));
        let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tokio::pin!(stop);
        loop {
            tokio::select! {
                () = &mut stop => return,
                _ = ticks.tick() => {}
            }
            tokio::select! {
                () = &mut stop => return,
                report = self.pass() => self.tell(&report),
            }
        }
    }

    /// One pass of every step that is on.
    pub async fn pass(&mut self) -> PassReport {
        let mut report = PassReport::default();
        if let Some(stale_after_ms) = self.plan.stale_after_ms {
            self.stale_sweep(stale_after_ms, &mut report).await;
        }
        if let Some(stuck_after_ms) = self.plan.stuck_after_ms {
            self.watch_stuck(stuck_after_ms, &mut report).await;
        }
        if let Some(prune_after_ms) = self.plan.prune_after_ms {
            self.prune(prune_after_ms, &mut report).await;
        }
        if self.plan.journal_prune {
            let now = self.clock.now_ms();
            match self.journal.prune_idle(now).await {
                Ok(removed) => {
                    report.engagements_removed = removed;
                    self.metrics.engagements_removed.inc_by(removed);
                    self.succeeded(Step::JournalPrune);
                }
                Err(err) => self.failed(Step::JournalPrune, err.to_string(), &mut report),
            }
        }
        report
    }

    async fn stale_sweep(&mut self, stale_after_ms: i64, report: &mut PassReport) {
        let now = self.clock.now_ms();
        // Clients could not heartbeat while the server was down: each gets a full window.
        if now.saturating_sub(self.started_at_ms) < stale_after_ms {
            return;
        }
        // In steps of a few runs a transaction, so a backlog (the first pass after an upgrade, a
        // fleet of writers gone at once) never holds writers up for long; the rest waits for
        // the next pass once this one's time is up.
        // Stale roots first, then the spans left open in runs without an open root, which the
        // reference's sweep never judges; each with half the pass's budget, so a backlog of
        // one never starves the other.
        let half = PRUNE_TIME_BUDGET / 2;
        for leftovers in [false, true] {
            let began = Instant::now();
            loop {
                let step = if leftovers {
                    self.sweeper
                        .sweep_leftovers_step(stale_after_ms, Some(now), STALE_SWEEP_STEP)
                        .await
                } else {
                    self.sweeper
                        .sweep_stale_step(stale_after_ms, Some(now), STALE_SWEEP_STEP)
                        .await
                };
                match step {
                    Ok((closed, more)) => {
                        report.stale_spans_closed += closed;
                        self.metrics
                            .stale_spans_closed
                            .inc_by(u64::try_from(closed).unwrap_or(0));
                        if !more || began.elapsed() >= half {
                            break;
                        }
                    }
                    Err(err) => return self.failed(Step::StaleSweep, err.to_string(), report),
                }
            }
        }
        self.succeeded(Step::StaleSweep);
    }

    async fn watch_stuck(&mut self, stuck_after_ms: i64, report: &mut PassReport) {
        let now = self.clock.now_ms();
        let stuck = match self.sweeper.find_stuck(stuck_after_ms, Some(now)).await {
            Ok(stuck) => stuck,
            Err(err) => return self.failed(Step::Stuck, err.to_string(), report),
        };
        self.succeeded(Step::Stuck);
        // Counted by run: a run may have several roots.
        let now_stuck: HashSet<&str> = stuck.iter().map(|span| span.run_id.as_str()).collect();
        self.metrics
            .runs_stuck
            .set(i64::try_from(now_stuck.len()).unwrap_or(i64::MAX));
        report.stuck_runs = Some(now_stuck.len());
        // Forget the runs that are no longer stuck (ended, or swept), so a run id used again
        // is reported again.
        self.reported_stuck
            .retain(|run_id| now_stuck.contains(run_id.as_str()));
        let mut seen = HashSet::new();
        let mut named = Vec::new();
        let mut more = 0usize;
        let mut unremembered = 0usize;
        for span in &stuck {
            if !seen.insert(span.run_id.as_str()) || self.reported_stuck.contains(&span.run_id) {
                continue;
            }
            if self.reported_stuck.len() >= STUCK_MEMORY {
                unremembered += 1;
                continue;
            }
            self.reported_stuck.insert(span.run_id.clone());
            if named.len() < STUCK_NAMED_PER_PASS {
                named.push(describe_stuck(span, now));
                report.newly_stuck.push(span.run_id.clone());
            } else {
                more += 1;
            }
        }
        // Runs past the memory are counted, not named; said again only when their number
        // changes, not at every pass.
        if unremembered != self.unremembered_stuck {
            more += unremembered;
            self.unremembered_stuck = unremembered;
        }
        for line in &named {
            say(&format!("flightlog: stuck: {line}"));
        }
        if more > 0 {
            say(&format!(
                "flightlog: stuck: {more} more run(s) open for over {} (GET \
                 /v1/activity/stuck?thresholdMs={stuck_after_ms} lists them all)",
                human_duration(stuck_after_ms)
            ));
        }
    }

    async fn prune(&mut self, prune_after_ms: i64, report: &mut PassReport) {
        let began = Instant::now();
        loop {
            let now = self.clock.now_ms();
            let options = PruneOptions {
                digest_floor_at: now.saturating_sub(prune_after_ms),
                hard_ceiling_ms: prune_after_ms,
                now: Some(now),
                batch: Some(PRUNE_BATCH),
                max_spans: Some(PRUNE_SPAN_BUDGET),
                scheduled: true,
            };
            match self.sweeper.prune(options).await {
                Ok(result) => {
                    report.runs_pruned += result.runs_pruned;
                    report.spans_pruned += result.spans_deleted;
                    self.metrics
                        .runs_pruned
                        .inc_by(u64::try_from(result.runs_pruned).unwrap_or(0));
                    self.metrics
                        .spans_pruned
                        .inc_by(u64::try_from(result.spans_deleted).unwrap_or(0));
                    self.metrics
                        .changes_trimmed
                        .inc_by(u64::try_from(result.changes_trimmed).unwrap_or(0));
                    // Nothing left (the last call took nothing and trimmed nothing), or this
                    // pass's time is up. A call that only trimmed goes on: stopping at the first
                    // call that pruned no run left the change log trimming 100,000 rows a pass
                    // behind a burst (3.19 million rows kept after 30 s of load, an audit's
                    // finding).
                    let nothing_left = result.runs_pruned == 0 && result.changes_trimmed == 0;
                    if nothing_left || began.elapsed() >= self.prune_time_budget() {
                        // Behind: this pass ran out of time with more to do (an alert's cue
                        // that ingest outruns retention).
                        self.metrics.prune_behind.set(i64::from(!nothing_left));
                        self.succeeded(Step::Prune);
                        return;
                    }
                }
                Err(err) => return self.failed(Step::Prune, err.to_string(), report),
            }
        }
    }

    /// How long one pass may prune: [`PRUNE_TIME_BUDGET`], or a quarter of the interval when
    /// that is longer. At 2 s a minute the default pass pruned about 3,700 spans/s at best,
    /// and a server ingesting 35,000 spans/s grew without bound (an audit's finding); a quarter
    /// of the interval, in transactions of a few tens of milliseconds, prunes about 20,000
    /// spans/s (BENCHMARKS.md, stop 34), and `flightlog_maintenance_prune_behind` says when
    /// even that falls behind.
    fn prune_time_budget(&self) -> Duration {
        PRUNE_TIME_BUDGET.max(self.plan.every / 4)
    }

    fn succeeded(&mut self, step: Step) {
        self.metrics.pass(step, true);
        if self.failing.remove(&step) {
            say(&format!(
                "flightlog: maintenance: {} works again",
                step.as_str()
            ));
        }
    }

    fn failed(&mut self, step: Step, message: String, report: &mut PassReport) {
        self.metrics.pass(step, false);
        // Said once until it works again: a full disk would otherwise print every pass.
        if self.failing.insert(step) {
            say_err(&format!(
                "flightlog: warning: maintenance: {} failed ({message}); tried again every \
                 pass, said again only once it has worked",
                step.as_str()
            ));
        }
        report.errors.push((step, message));
    }

    /// The output lines of a pass that did something worth saying.
    fn tell(&self, report: &PassReport) {
        if report.stale_spans_closed > 0 {
            if let Some(ms) = self.plan.stale_after_ms {
                say(&format!(
                    "flightlog: maintenance: closed {} span(s) of runs whose writer went silent \
                     (no sign of life for {}) as interrupted",
                    report.stale_spans_closed,
                    human_duration(ms)
                ));
            }
        }
        if report.runs_pruned > 0 {
            say(&format!(
                "flightlog: maintenance: pruned the detail of {} ended run(s) ({} span(s)); \
                 their rollups are kept",
                report.runs_pruned, report.spans_pruned
            ));
        }
        if report.engagements_removed > 0 {
            say(&format!(
                "flightlog: maintenance: removed {} idle engagement(s)",
                report.engagements_removed
            ));
        }
    }
}

/// `run "<id>" ("<name>") has been open for <age> (writer "<writer>")`. The id, name and writer
/// come from clients: quoted with their control characters escaped, so none can forge an
/// output line or drive a terminal, and the name cut to [`STUCK_NAME_CHARS`] characters.
fn describe_stuck(root: &SpanRow, now: i64) -> String {
    let mut name: String = root.name.chars().take(STUCK_NAME_CHARS).collect();
    if name.len() < root.name.len() {
        name.push('…');
    }
    format!(
        "run {:?} ({:?}) has been open for {} (writer {:?})",
        root.run_id,
        name,
        human_duration(now.saturating_sub(root.started_at)),
        root.writer
    )
}

/// The longest span name a stuck line shows.
const STUCK_NAME_CHARS: usize = 120;

/// A duration in ms the way people say it: `30 min`, `1 h 5 min`, `30 days`, `1.5 s`.
pub fn human_duration(ms: i64) -> String {
    const SECOND: i64 = 1000;
    const MINUTE: i64 = 60 * SECOND;
    const HOUR: i64 = 60 * MINUTE;
    const DAY: i64 = 24 * HOUR;
    let ms = ms.max(0);
    if ms < SECOND {
        return format!("{ms} ms");
    }
    if ms < MINUTE {
        return if ms % SECOND == 0 {
            format!("{} s", ms / SECOND)
        } else {
            // Tenths, cut rather than rounded: 59,999 ms is `59.9 s`, never `60.0 s`.
            format!("{}.{} s", ms / SECOND, ms % SECOND / 100)
        };
    }
    // The two largest units that are not zero: `1 day 30 min`, `1 h 5 min`, `2 min 30 s`.
    let units = [
        (ms / DAY, if ms / DAY == 1 { "day" } else { "days" }),
        (ms % DAY / HOUR, "h"),
        (ms % HOUR / MINUTE, "min"),
        (ms % MINUTE / SECOND, "s"),
    ];
    units
        .iter()
        .filter(|(count, _)| *count > 0)
        .take(2)
        .map(|(count, unit)| format!("{count} {unit}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// A line on standard output (written, not `println!`: a closed stdout must not panic).
fn say(line: &str) {
    let _ = writeln!(std::io::stdout().lock(), "{line}");
}

/// A line on standard error (see [`say`]).
fn say_err(line: &str) {
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_the_way_people_say_them() {
        assert_eq!(human_duration(250), "250 ms");
        assert_eq!(human_duration(1_500), "1.5 s");
        assert_eq!(human_duration(45_000), "45 s");
        assert_eq!(human_duration(90_000), "1 min 30 s");
        assert_eq!(human_duration(30 * 60 * 1000), "30 min");
        assert_eq!(human_duration(65 * 60 * 1000), "1 h 5 min");
        assert_eq!(human_duration(24 * 60 * 60 * 1000), "1 day");
        assert_eq!(human_duration(30 * 24 * 60 * 60 * 1000), "30 days");
        assert_eq!(human_duration(-5), "0 ms");
        assert_eq!(human_duration(59_999), "59.9 s");
        assert_eq!(
            human_duration(24 * 60 * 60 * 1000 + 30 * 60 * 1000),
            "1 day 30 min"
        );
        assert_eq!(human_duration(60 * 60 * 1000 + 30 * 1000), "1 h 30 s");
        assert_eq!(human_duration(2 * 60 * 60 * 1000), "2 h");
    }

    #[test]
    fn the_default_plan_says_every_step() {
        let line = MaintenancePlan::DEFAULT.describe(30 * 24 * 60 * 60 * 1000);
        assert_eq!(
            line,
            "maintenance every 1 min: close runs whose writer is silent for 2 h; report \
             runs open over 1 h as stuck; prune the span detail of runs ended over 30 days ago \
             (rollups kept); remove engagements idle for 30 days"
        );
        let off = MaintenancePlan {
            stale_after_ms: None,
            stuck_after_ms: None,
            prune_after_ms: None,
            journal_prune: false,
            ..MaintenancePlan::DEFAULT
        };
        assert_eq!(off.describe(1), "maintenance: every step is off");
    }
}
