#!/usr/bin/env bash
# Runs every check and test of distlock on a fresh Debian machine: installs the real
# servers the tests start (redis-server, etcd, postgresql), protoc and protobuf's
# well-known types (etcd-client's build)
# and faketime (the clock-skew tests) when they are missing, then the module-cycle check,
# fmt, clippy, tests (all features) and docs.
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v etcd >/dev/null 2>&1 || missing+=(etcd-server)
command -v protoc >/dev/null 2>&1 || missing+=(protobuf-compiler)
# etcd-client 0.21's build also needs protobuf's well-known types (google/protobuf/*.proto).
[ -f /usr/include/google/protobuf/timestamp.proto ] || missing+=(libprotobuf-dev)
command -v python3 >/dev/null 2>&1 || missing+=(python3)
# libfaketime: the clock-skew tests run a distlock whose wall clock is off.
ls /usr/lib/*/faketime/libfaketimeMT.so.1 >/dev/null 2>&1 || missing+=(faketime)
# PostgreSQL's binaries live under /usr/lib/postgresql/<version>/bin, not on PATH.
ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 || command -v postgres >/dev/null 2>&1 \
  || missing+=(postgresql)
if [ ${#missing[@]} -gt 0 ]; then
  echo "==> installing ${missing[*]}"
  sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

echo "==> module cycles (no module imports a module that imports it back)"
python3 scripts/module-cycles.py
echo "==> cargo fmt --check"
cargo fmt --all -- --check
echo "==> cargo clippy (all targets, all features)"
cargo clippy --workspace --all-targets --all-features -- -D warnings
echo "==> cargo test (all features)"
cargo test --workspace --all-features
echo "==> cargo doc"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --all-features --no-deps --quiet
echo "==> all checks passed"
