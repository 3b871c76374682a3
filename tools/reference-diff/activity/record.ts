// Why: the activity recorder's command line (recorder_cli.ts): run.sh runs its self-check before
// anything else (the harness must give back every stock activity fixture exactly, or the
// fixtures it generates cannot be trusted); `--out` turns a hand-written scenario into a
// fixture, e.g. to minimise a divergence the generator found.
//   bun record.ts --check FILE.json...     re-record fixtures, compare with their own expectations
//   bun record.ts --out DIR FILE.json...   record scenarios into DIR/<name>.json
import { recorderCli } from "../recorder_cli.ts";
import { fixtureToText, recordFixture } from "./harness.ts";

await recorderCli("activity", recordFixture, fixtureToText);
