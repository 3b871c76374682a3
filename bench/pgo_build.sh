#!/usr/bin/env bash
# A profile-guided (PGO) release build of the flightlog binary, for deployments: a fifth fewer
# instructions on the request path and about 7% less server CPU a single-op write than
# `cargo build --release` (BENCHMARKS.md, stop 40).
#
#     bench/pgo_build.sh [OUT_DIR]        # default target/pgo; the binary is OUT_DIR/flightlog
#
# Four steps, about 10 minutes on 2 cores from a fresh clone (two whole release builds with
# LTO, then the tests):
#   1. an instrumented server (`-Cprofile-generate`) in OUT_DIR/instrumented;
#   2. training: that server under the agent workload it is built for, the same mix the
#      benchmarks run but smaller — `flightlog-loadgen http` (single-op writes, batches, a live
#      change stream), `flightlog-loadgen otlp` (OTLP/HTTP ingest with read-back: protobuf,
#      gzip, JSON) and bench/cross_process_latency.py (journal appends, an engagement stream,
#      two servers on one file) — each server stopped with SIGTERM so that it writes its
#      profile on the way out;
#   3. the profiles merged with the toolchain's own `llvm-profdata` (its LLVM must be the one
#      that wrote them) and the server built again with `-Cprofile-use`;
#   4. the root package's tests run against the new binary (`FLIGHTLOG_TEST_BINARY`, see
#      tests/support/mod.rs): every process-level test starts it instead of this build's.
# Code the training never runs is compiled as cold (smaller; journal summaries, boards and
# listings over HTTP measured no slower: bench/untrained_paths.py); the profile is made fresh
# by each run of this script, so it always fits the source.
#
# Needs `llvm-profdata` from rustup: `rustup component add llvm-tools`.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
out=${1:-target/pgo}
mkdir -p "$out"
out=$(cd "$out" && pwd)
case "$out" in
  *[[:space:]]*)
    echo "pgo_build: the output directory '$out' holds a space, which RUSTFLAGS cannot carry: give another one" >&2
    exit 1
    ;;
esac

host=$(rustc -vV | sed -n 's/^host: //p')
profdata="$(rustc --print sysroot)/lib/rustlib/$host/bin/llvm-profdata"
if [ ! -x "$profdata" ]; then
  echo "pgo_build: no llvm-profdata at $profdata" >&2
  echo "pgo_build: install the toolchain's LLVM tools with: rustup component add llvm-tools" >&2
  exit 1
fi
command -v python3 >/dev/null || {
  echo "pgo_build: python3 is needed for the journal part of the training" >&2
  exit 1
}

# `--target` keeps RUSTFLAGS off build scripts and proc macros (they are not the server).
echo "pgo_build: 1/4 instrumented build (a few minutes)"
cargo build --release -q -p flightlog-loadgen
# A binary from an earlier run is not left to be taken for this one's if this run fails.
rm -rf "$out/profiles" "$out/instrumented-server.pid" "$out/flightlog" "$out/untested"
RUSTFLAGS="${RUSTFLAGS:-} -Cprofile-generate=$out/profiles" \
  cargo build --release -q -p flightlog --target "$host" --target-dir "$out/instrumented"
instrumented="$out/instrumented/$host/release/flightlog"

# The load generator kills its server (SIGKILL: no profile would be written), so it gets this
# wrapper, which runs the server as its own child; the server is stopped with SIGTERM after.
wrapper="$out/instrumented-server.sh"
cat >"$wrapper" <<EOF
#!/usr/bin/env bash
"$instrumented" "\$@" &
echo \$! >"$out/instrumented-server.pid"
wait
EOF
chmod +x "$wrapper"

stop_instrumented() {
  local pid
  pid=$(cat "$out/instrumented-server.pid" 2>/dev/null) || return 0
  # Read once: a pid left from an earlier run could name another process by now.
  rm -f "$out/instrumented-server.pid"
  kill -TERM "$pid" 2>/dev/null || return 0
  for _ in $(seq 1 100); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.1
  done
  echo "pgo_build: the instrumented server did not stop within 10 s" >&2
  exit 1
}

loadgen="${CARGO_TARGET_DIR:-$root/target}/release/flightlog-loadgen"
train() {
  if ! "$loadgen" --server "$wrapper" "$@" >>"$out/training.log" 2>&1; then
    stop_instrumented
    echo "pgo_build: training run '$*' failed; its output is in $out/training.log" >&2
    exit 1
  fi
  stop_instrumented
}

echo "pgo_build: 2/4 training (about a minute)"
: >"$out/training.log"
train http --runs 1000 --batch-runs 500 --stream-seconds 2
train otlp --spans 100000
train otlp --spans 50000 --gzip
train otlp --spans 20000 --json
if ! TMPDIR_FOR_DB="$out" python3 bench/cross_process_latency.py 100 5 "$instrumented" \
  >>"$out/training.log" 2>&1; then
  echo "pgo_build: the journal training run failed; its output is in $out/training.log" >&2
  exit 1
fi

echo "pgo_build: 3/4 optimized build (a few minutes)"
"$profdata" merge -o "$out/flightlog.profdata" "$out/profiles"
RUSTFLAGS="${RUSTFLAGS:-} -Cprofile-use=$out/flightlog.profdata" \
  cargo build --release -q -p flightlog --target "$host" --target-dir "$out/optimized"
# Named `flightlog` like any build (clap's usage lines show the file's name, and the tests
# read them), in a folder of its own until the tests pass.
mkdir -p "$out/untested"
candidate="$out/untested/flightlog"
cp "$out/optimized/$host/release/flightlog" "$candidate"

# The same source, but another compilation of it: the process-level tests (every setting, the
# CLI's errors, hostile connections, a full disk, a foreign lock, the restart sweep) run
# against the new binary before it is called built.
echo "pgo_build: 4/4 the process-level tests against it (a few minutes)"
if ! FLIGHTLOG_TEST_BINARY="$candidate" cargo test -q -p flightlog --tests >"$out/tests.log" 2>&1; then
  echo "pgo_build: the process-level tests failed against $candidate; see $out/tests.log" >&2
  exit 1
fi
mv "$candidate" "$out/flightlog"
echo "pgo_build: built and tested $out/flightlog"
