#!/usr/bin/env bash
# Why this exists: the real-client OTLP tests (crates/flightlog-server/tests/api/otlp_clients.rs)
# drive the OpenTelemetry Python SDK (http/protobuf and gRPC exporters) and the OpenTelemetry
# JavaScript SDK (OTLP/HTTP JSON exporter) against a real server. This installs them from the
# registries, at the pinned versions of python/requirements.txt and js/package-lock.json:
#
#   - a Python venv at $DIR/venv (pip install -r python/requirements.txt);
#   - js/node_modules (npm ci --ignore-scripts).
#
# $DIR is $FLIGHTLOG_OTLP_CLIENTS_DIR if set, else ${CARGO_TARGET_DIR:-<workspace>/target}/otlp-clients.
# The Rust test runs this script itself (with FLIGHTLOG_OTLP_CLIENTS_DIR set to its own target
# dir), and .ci/run runs it before `cargo test`. It is idempotent: each half writes a stamp (the
# hash of its pins, this script and the interpreter's version) once it is complete, and a second
# run whose stamps match only says so. Concurrent runs are serialized with flock.
#
# Needs: python3 (>= 3.9, with venv), node (>= 20.6) and npm, and access to PyPI and the npm
# registry. Override the interpreters with PYTHON=..., NODE=..., NPM=....
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
dir="${FLIGHTLOG_OTLP_CLIENTS_DIR:-${CARGO_TARGET_DIR:-$root/target}/otlp-clients}"
python="${PYTHON:-python3}"
node="${NODE:-node}"
npm="${NPM:-npm}"
js="$here/js"

say() { printf 'otlp-clients: %s\n' "$*" >&2; }
fail() {
  say "FAILED: $*"
  exit 1
}

mkdir -p "$dir"
dir="$(cd "$dir" && pwd)"
venv="$dir/venv"

exec 9>"$dir/.install.lock"
flock -w 900 9 || fail "another install.sh held $dir/.install.lock for 15 minutes"

# A fresh Debian or Ubuntu machine may lack Python's venv module (the `python3-venv` package) or
# Node.js: installed with apt-get when this runs as root or may use sudo without a password,
# else (or when that fails) the checks below say what is missing.
apt_install() {
  command -v apt-get >/dev/null || return 1
  local sudo=()
  if [[ "$(id -u)" != 0 ]]; then
    sudo -n true 2>/dev/null || return 1
    sudo=(sudo -n)
  fi
  say "installing $* with apt-get"
  "${sudo[@]}" apt-get update -qq >&2 || true
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >&2
}
if [[ -z "${PYTHON:-}" ]] && ! python3 -c 'import venv, ensurepip' 2>/dev/null; then
  apt_install python3 python3-venv || say "could not install python3-venv with apt-get"
fi
if [[ -z "${NODE:-}${NPM:-}" ]] && ! { command -v node && command -v npm; } >/dev/null; then
  apt_install nodejs npm || say "could not install nodejs and npm with apt-get"
fi

command -v "$python" >/dev/null || fail "no $python on PATH (Python >= 3.9 with the venv module is needed)"
command -v "$node" >/dev/null || fail "no $node on PATH (Node.js >= 20.6 is needed)"
command -v "$npm" >/dev/null || fail "no $npm on PATH"

digest() { sha256sum "$@" | sha256sum | cut -c1-64; }
# A registry's passing hiccup (a reset, a 503) should not fail a CI run: up to three tries, 5
# and 10 s apart, on top of the clients' own retries.
with_retries() {
  local try
  for try in 1 2 3; do
    "$@" && return 0
    [[ $try -lt 3 ]] && { say "try $try of 3 failed: $*; again in $((try * 5)) s"; sleep $((try * 5)); }
  done
  return 1
}

python_version="$("$python" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])')"
"$python" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 9) else 1)' \
  || fail "$python is $python_version; Python >= 3.9 is needed"
python_stamp="$(digest "$here/python/requirements.txt" "$here/install.sh")-python-$python_version"
node_version="$("$node" --version)"
# The lock is committed; should it be missing, `npm install` writes it and the stamp is taken after.
node_stamp() {
  local files=("$js/package.json" "$here/install.sh")
  [[ -f "$js/package-lock.json" ]] && files+=("$js/package-lock.json")
  printf '%s-node-%s' "$(digest "${files[@]}")" "$node_version"
}

# --- Python -------------------------------------------------------------------------------
if [[ -x "$venv/bin/python" && "$(cat "$venv/.flightlog-stamp" 2>/dev/null)" == "$python_stamp" ]]; then
  say "python venv up to date: $venv"
else
  say "creating python venv $venv ($python $python_version)"
  rm -rf "$venv"
  "$python" -m venv "$venv" || fail "$python -m venv $venv"
  say "pip install -r tests/otlp-clients/python/requirements.txt"
  with_retries "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-input \
    --retries 10 --timeout 60 -r "$here/python/requirements.txt" || fail "pip install into $venv"
  "$venv/bin/python" -c 'import opentelemetry.sdk.trace, opentelemetry.exporter.otlp.proto.http.trace_exporter, opentelemetry.exporter.otlp.proto.grpc.trace_exporter' \
    || fail "the installed Python SDK does not import"
  printf '%s\n' "$python_stamp" >"$venv/.flightlog-stamp"
  say "python venv ready"
fi

# --- JavaScript ---------------------------------------------------------------------------
node_version_number="$("$node" -p 'process.versions.node.split(".").slice(0, 2).map(Number).reduce((major, minor) => major * 1000 + minor)')"
[[ "$node_version_number" -ge 20006 ]] || fail "node is $node_version; Node.js >= 20.6 is needed"
if [[ -d "$js/node_modules" && "$(cat "$js/node_modules/.flightlog-stamp" 2>/dev/null)" == "$(node_stamp)" ]]; then
  say "js node_modules up to date: $js/node_modules"
else
  if [[ -f "$js/package-lock.json" ]]; then
    say "npm ci in tests/otlp-clients/js ($node $node_version)"
    (cd "$js" && with_retries "$npm" ci --ignore-scripts --no-audit --no-fund --loglevel=error \
      --fetch-retries=5 >&2) || fail "npm ci in $js"
  else
    say "npm install in tests/otlp-clients/js (no package-lock.json: it will be written; commit it)"
    (cd "$js" && "$npm" install --ignore-scripts --no-audit --no-fund --loglevel=error >&2) || fail "npm install in $js"
  fi
  (cd "$js" && "$node" --input-type=module -e "await import('@opentelemetry/exporter-trace-otlp-http'); await import('@opentelemetry/sdk-trace-node');") \
    || fail "the installed JavaScript SDK does not import"
  printf '%s\n' "$(node_stamp)" >"$js/node_modules/.flightlog-stamp"
  say "js node_modules ready"
fi

say "python: $venv/bin/python; node modules: $js/node_modules"
