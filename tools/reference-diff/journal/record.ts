// Why: runs journal scenarios on the reference — InMemoryEngagementJournal and the pure functions
// of shared/seeds/engagement-journal.ts, imported unmodified — and writes fixtures in FORMAT.md's
// format. gen.ts and edge.ts record through recordScenario(); run as a script it is the recorder's
// command line (recorder_cli.ts): the self-check (run.sh runs it first: every stock journal
// fixture must come back exactly) and the way to turn a hand-written scenario into a fixture.
//   bun record.ts --check FILE.json...     re-record fixtures, compare with their own expectations
//   bun record.ts --out DIR FILE.json...   record scenarios into DIR/<name>.json
//
// Emulates flightlog's one documented journal difference that fixtures pin (FORMAT.md §8): an
// append whose `type` is not a non-empty string fails with TypeError (after the reference's own
// validation, before the full check) and stores nothing.
import { realpathSync } from 'node:fs';
import { join } from 'node:path';
import { recorderCli } from '../recorder_cli.ts';
import { JournalFullError } from './contracts.ts';

// The reference imports './contracts.js', which does not exist beside it: resolve that one import
// (from that one file) to the stub. The plugin must be registered before the reference is loaded,
// hence the dynamic import. Bun names the importer by its real path (../shared may be a symbolic
// link), so the reference is compared by that.
const REFERENCE = realpathSync(join(import.meta.dir, '../../../../shared/seeds/engagement-journal.ts'));
Bun.plugin({
  name: 'reference-diff contracts stub',
  setup(build) {
    build.onResolve({ filter: /^\.\/contracts\.js$/ }, (args) =>
      args.importer === REFERENCE ? { path: join(import.meta.dir, 'contracts.ts') } : undefined);
  },
});
const { InMemoryEngagementJournal, summarizeEngagementEvents, reconstructBoardFromEvents } = await import(REFERENCE);

type Step = { op: string; args: any; expect?: unknown; expectError?: string; note?: string };
type Scenario = { name: string; store: string; description?: string; setup: any; steps: Step[] };

function toJson(value: unknown): unknown {
  if (value === undefined) return null;
  const text = JSON.stringify(value);
  return text === undefined ? null : JSON.parse(text);
}

function errorKind(err: unknown): string {
  if (err instanceof JournalFullError) return 'JournalFullError';
  if (err instanceof TypeError) return 'TypeError';
  throw err;
}

// Deep-clone args so the reference can never alias or mutate what we write out.
const clone = (v: unknown) => (v === undefined ? undefined : JSON.parse(JSON.stringify(v)));

export async function recordScenario(sc: Scenario): Promise<Scenario> {
  const retention = sc.setup?.retention;
  const journal = new InMemoryEngagementJournal(retention ? { retention } : {});
  const steps: Step[] = [];
  for (const step of sc.steps) {
    const args = clone(step.args) ?? {};
    const out: Step = { op: step.op, args: step.args };
    if (step.note !== undefined) out.note = step.note;
    try {
      let result: unknown;
      switch (step.op) {
        case 'append': {
          const ev = args.event;
          // flightlog's additional check (FORMAT.md §8): type must be a non-empty string. Every
          // validation failure is a TypeError, so its place in the order does not matter; it
          // comes before the full check, and nothing is stored.
          if (ev && typeof ev === 'object' && !Array.isArray(ev) && !(typeof ev.type === 'string' && ev.type !== '')) {
            throw new TypeError('type must be a non-empty string (flightlog, FORMAT.md §8)');
          }
          result = await journal.append(ev);
          break;
        }
        case 'read':
          result = await journal.read(args.engagementId);
          break;
        case 'summarize':
          result = await journal.summarize(args.engagementId);
          break;
        case 'compact':
          result = await journal.compact(args.engagementId);
          break;
        case 'listEngagements':
          result = 'limit' in args ? await journal.listEngagements(args.limit) : await journal.listEngagements();
          break;
        case 'prune':
          result = await journal.prune(args.now);
          break;
        case 'summarizeEngagementEvents':
          result = summarizeEngagementEvents(args.engagementId, args.records);
          break;
        case 'reconstructBoardFromEvents':
          result = 'filter' in args ? reconstructBoardFromEvents(args.records, args.filter) : reconstructBoardFromEvents(args.records);
          break;
        default:
          throw new Error(`unknown op ${step.op}`);
      }
      out.expect = toJson(result);
    } catch (err) {
      out.expectError = errorKind(err);
    }
    steps.push(out);
  }
  return { name: sc.name, store: 'journal', description: sc.description ?? '', setup: sc.setup ?? {}, steps };
}

if (import.meta.main) {
  await recorderCli('journal', recordScenario, (fixture) => JSON.stringify(fixture));
}
