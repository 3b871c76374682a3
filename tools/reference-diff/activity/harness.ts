// Why: the one place that runs the reference activity store (shared/seeds/activity-store.ts,
// imported unmodified) the way FORMAT.md §3 describes, so that the generator and the recorder
// produce fixtures exactly as the stock ones were made: in-memory bun:sqlite with
// shared/conformance/schema.sql, Date.now() replaced by the fake clock, one store instance per
// writer over one database, results passed through a JSON round trip, SQLITE_CONSTRAINT* ->
// "constraint". Paths are resolved from this file: <repo>/../shared.
import { Database } from "bun:sqlite";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { createActivityStore, rowToRunRollup } from "../../../../shared/seeds/activity-store.ts";

const SCHEMA = readFileSync(join(import.meta.dir, "../../../../shared/conformance/schema.sql"), "utf8");

// The fake clock: the reference reads Date.now(); replace it globally.
let CLOCK = 0;
Date.now = () => CLOCK;

export type Step = {
  clock?: number;
  writer?: string;
  op: string;
  args: any;
  note?: string;
  expect?: any;
  expectError?: string;
};

export class RefHarness {
  db: Database;
  stores = new Map<string, any>();
  def: any;
  constructor(setup: { writer?: string; clock?: number }) {
    this.db = new Database(":memory:");
    this.db.exec(SCHEMA);
    CLOCK = setup.clock ?? 0;
    this.def = createActivityStore(this.db, { writer: setup.writer });
  }
  storeFor(writer?: string) {
    if (writer === undefined) return this.def;
    let s = this.stores.get(writer);
    if (!s) {
      s = createActivityStore(this.db, { writer });
      this.stores.set(writer, s);
    }
    return s;
  }
  call(store: any, op: string, a: any): any {
    switch (op) {
      case "startSpan": return store.startSpan(a.input);
      case "endSpan": return store.endSpan(a.spanId, a.input);
      case "patchSpan": return store.patchSpan(a.spanId, a.patch);
      case "appendEvent": return store.appendEvent(a.spanId, a.eventType, a.payload, a.ts);
      case "heartbeat": return store.heartbeat(a.spanId, a.at);
      case "cascadeClose": return store.cascadeClose(a.runId, a.outcome, a.reason);
      case "sweepOwnOrphans": return store.sweepOwnOrphans();
      case "sweepStale": return store.sweepStale(a.staleAfterMs, a.now);
      case "findStuck": return store.findStuck(a.thresholdMs, a.now);
      case "changesSince": return store.changesSince(a.changeCursor, a.limit);
      case "terminalRootChangesSince": return store.terminalRootChangesSince(a.changeCursor, a.limit);
      case "latestChangeCursor": return store.latestChangeCursor();
      case "snapshotRun": return store.snapshotRun(a.runId);
      case "runHighWaterSeq": return store.runHighWaterSeq(a.runId);
      case "getSpan": return store.getSpan(a.spanId);
      case "openRootSpans": return store.openRootSpans();
      case "rollupRun": return store.rollupRun(a.runId);
      case "prune": return store.prune(a.options);
      case "readRollup": {
        const r = this.db.query("SELECT * FROM activity_run_rollups WHERE run_id = ?").get(a.runId);
        return r ? rowToRunRollup(r) : null;
      }
      default: throw new Error("unknown op " + op);
    }
  }
  /** Perform one step (clock, writer, op) and return the recorded step. */
  perform(step: Step): Step {
    if (step.clock !== undefined) CLOCK = step.clock;
    const store = this.storeFor(step.writer);
    // args are passed as parsed JSON (a fresh copy, so the reference cannot alias them)
    const args = JSON.parse(JSON.stringify(step.args ?? {}));
    const out: Step = {};
    if (step.clock !== undefined) out.clock = step.clock;
    if (step.writer !== undefined) out.writer = step.writer;
    out.op = step.op;
    out.args = step.args ?? {};
    if (step.note !== undefined) out.note = step.note;
    try {
      const v = this.call(store, step.op, args);
      out.expect = v === undefined ? null : JSON.parse(JSON.stringify(v));
    } catch (e: any) {
      const code = String(e?.code ?? "");
      if (code.startsWith("SQLITE_CONSTRAINT")) out.expectError = "constraint";
      else out.expectError = "UNEXPECTED:" + (e?.name ?? "") + ":" + code + ":" + e?.message;
    }
    return out;
  }
}

export function recordFixture(fx: { name: string; description?: string; setup: any; steps: Step[] }) {
  const h = new RefHarness(fx.setup ?? {});
  const steps = fx.steps.map((s) => h.perform(s));
  return { name: fx.name, store: "activity", description: fx.description ?? "", setup: fx.setup, steps };
}

export function fixtureToText(fx: any): string {
  const head = JSON.stringify({ name: fx.name, store: fx.store, description: fx.description });
  return (
    head.slice(0, -1) +
    ',\n  "setup": ' + JSON.stringify(fx.setup) +
    ',\n  "steps": [\n' +
    fx.steps.map((s: any) => "    " + JSON.stringify(s)).join(",\n") +
    "\n  ]\n}\n"
  );
}
