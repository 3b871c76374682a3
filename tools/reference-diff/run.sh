#!/bin/sh
# Differential check of flightlog against the reference TypeScript (see README.md): record
# seeded random scenarios with the reference on Bun, then replay them through flightlog's
# conformance replayers (in memory, SQLite, over HTTP).
#
# usage: tools/reference-diff/run.sh activity|journal|both [FIRST_SEED] [COUNT]
#        tools/reference-diff/run.sh record activity|journal|both FIRST_SEED COUNT OUTDIR
#   FIRST_SEED defaults to 1, COUNT (scenarios per store) to 200. The first form records into a
#   new temporary folder and replays there; `record` only records (after the self-check) into
#   OUTDIR, which the test suite then replays itself (`reference_recorded` in the conformance
#   suite and in the HTTP tests). Environment: BUN (the Bun to run), CARGO_TARGET_DIR
#   (honoured), the generators' FUZZ_* knobs (README.md).
set -eu

BUN_VERSION=1.4.5

usage() {
  echo "usage: $0 activity|journal|both [FIRST_SEED] [COUNT]" >&2
  echo "       $0 record activity|journal|both FIRST_SEED COUNT OUTDIR" >&2
  exit 2
}
say() { echo "reference-diff: $*"; }

record_only=
if [ "${1:-}" = record ]; then
  record_only=yes
  shift
  if [ $# -ne 4 ]; then usage; fi
elif [ $# -lt 1 ] || [ $# -gt 3 ]; then
  usage
fi
case $1 in
activity | journal) stores=$1 ;;
both) stores="activity journal" ;;
*) usage ;;
esac
first=${2:-1}
count=${3:-200}
for n in "$first" "$count"; do
  case $n in '' | *[!0-9]*) usage ;; esac
done

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
if ! shared=$(cd "$repo/../shared" 2>/dev/null && pwd); then
  say "no reference beside the repository: $repo/../shared is missing" >&2
  exit 1
fi

# Bun: $BUN, else bun on PATH, else a pinned copy installed with npm into node_modules here.
if [ -z "${BUN:-}" ]; then
  if command -v bun >/dev/null 2>&1; then
    BUN=$(command -v bun)
  else
    case "$(uname -s)-$(uname -m)" in
    Linux-x86_64)
      # Bun's default x64 build needs AVX2; the baseline build runs without it.
      if grep -q avx2 /proc/cpuinfo 2>/dev/null; then pkg=bun-linux-x64; else pkg=bun-linux-x64-baseline; fi
      ;;
    Linux-aarch64 | Linux-arm64) pkg=bun-linux-aarch64 ;;
    Darwin-x86_64) pkg=bun-darwin-x64 ;;
    Darwin-arm64) pkg=bun-darwin-aarch64 ;;
    *)
      say "no Bun for $(uname -s) $(uname -m): install Bun $BUN_VERSION and set BUN" >&2
      exit 1
      ;;
    esac
    BUN=$here/node_modules/@oven/$pkg/bin/bun
    if [ ! -x "$BUN" ]; then
      if ! command -v npm >/dev/null 2>&1; then
        say "no Bun: set BUN, put bun on PATH, or install npm to fetch Bun $BUN_VERSION" >&2
        exit 1
      fi
      # Two test binaries (or two runs) may get here at once: one installs, the other waits.
      mkdir -p "$here/node_modules"
      if command -v flock >/dev/null 2>&1; then
        exec 9>"$here/node_modules/.install.lock"
        flock -w 600 9
      fi
      if [ ! -x "$BUN" ]; then
        say "installing Bun $BUN_VERSION (@oven/$pkg) into $here/node_modules"
        # Up to three tries (a registry's passing hiccup should not fail a test run).
        for try in 1 2 3; do
          if npm install --prefix "$here" --no-save --no-package-lock --no-audit --no-fund \
            --fetch-retries=5 "@oven/$pkg@$BUN_VERSION" >&2; then
            break
          fi
          if [ "$try" = 3 ]; then
            say "npm could not fetch Bun $BUN_VERSION (@oven/$pkg); set BUN or put bun on PATH" >&2
            exit 1
          fi
          sleep $((try * 5))
        done
      fi
    fi
  fi
fi
say "Bun $("$BUN" --version) ($BUN)"

# The recorders must reproduce every stock fixture first, or what they record proves nothing.
for store in $stores; do
  if ! "$BUN" "$here/$store/record.ts" --check "$shared/conformance/$store"/*.json; then
    say "the $store recorder does not reproduce the stock fixtures (above); fix it before trusting its fixtures" >&2
    exit 1
  fi
done

if [ -n "$record_only" ]; then
  mkdir -p "$4"
  out=$(cd "$4" && pwd)
else
  out=$(mktemp -d -t reference-diff.XXXXXX)
fi
say "recording $count scenarios per store from seed $first into $out"
for store in $stores; do
  "$BUN" "$here/$store/gen.ts" "$out" "$first" "$count"
done
case $stores in *journal*) "$BUN" "$here/journal/edge.ts" "$out" ;; esac
if [ -n "$record_only" ]; then exit 0; fi

cd "$repo"
export FLIGHTLOG_CONFORMANCE_DIR="$out"
failed=
if ! cargo test --release -p flightlog-conformance --test conformance -- --nocapture; then
  failed="$failed in-process"
fi
for store in $stores; do
  # The failure message lists the failing fixtures; a backtrace would only bury it.
  if ! RUST_BACKTRACE=0 cargo test --release -p flightlog-server --test api -- \
    --exact "conformance::every_${store}_fixture_passes_over_http" --nocapture; then
    failed="$failed http-$store"
  fi
done

if [ -n "$failed" ]; then
  say "FAILED:$failed; fixtures kept in $out" >&2
  exit 1
fi
say "no divergence; fixtures kept in $out"
