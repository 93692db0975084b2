#!/usr/bin/env python3
"""Builds every test binary of the workspace once, then runs them on a few workers at a time.

`cargo test` runs its test binaries one after another, and most of ours spend their time
waiting: for a TTL to pass, a server to start, a failover, the exclusion checker's fixed
run. Running two binaries at once halves that wait on the project's 2-core machines; each
binary starts its own servers on ports the test kit picks, so binaries never share one.

Usage: scripts/run-tests.py [--jobs N] [--doc] [--package P,...] [--only NAME,...] [-- FILTER...]

  --jobs N      binaries at once (default $DISTLOCK_TEST_JOBS, else 2)
  --doc         also run the doc tests (`cargo test --doc`), after the binaries
  --package P   only the test binaries of these packages (e.g. distlock,lock-testkit)
  --only NAMES  only the test targets with these names (e.g. redis,etcd,exclusion_redis)
  FILTER...     passed to every binary (libtest name filters: a test runs when its name
                contains one of them)

Each binary runs in its package's directory, as `cargo test` runs it, with its output kept
in target/test-logs/; a failing binary's output is printed whole. The closing line is
`N passed, N failed` over every test of every binary.
"""

import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Longest first (seconds on the 2-core machine), so the slow ones do not start last.
WEIGHTS = {
    "cron": 205, "etcd": 61, "redis": 47, "postgres": 57, "exclusion_etcd": 68,
    "memory": 22, "exclusion_postgres": 61, "redlock": 33, "scheduler_clocks": 29,
    "redis_sentinel": 42, "etcd_tls": 39, "exclusion_fire_times": 38, "backends": 30,
    "exclusion_redis": 30, "exclusion_redis_cluster": 30, "exclusion_redlock": 26,
    "exclusion_memory": 25, "file": 22, "redis_cluster": 22, "redis_tls": 19, "redis5": 18,
    "exclusion_file": 14, "mysql": 35, "exclusion_mysql": 28, "zookeeper": 38,
    "exclusion_zookeeper": 45,
}
# Tests at once inside these binaries (libtest's --test-threads; its default is one per
# core). Their time goes to the conformance suite, run several ways (direct, through a
# `Box<dyn>`, through `connect`, on a current-thread runtime), each run a sequence of
# waits on TTLs and release notices that uses little CPU: running those runs together
# took memory from 64 to 22 s, etcd from 113 to 61 s, redis from 85 to 47 s. Binaries
# whose tests load the machine (the exclusion checkers, cron's replicas) keep the default,
# and so does file: its rule on refusals after a drop counts them, and four runs at once
# on the same host's locks refused one too many.
# Not in container mode, where every test's servers are containers on the same two cores.
THREADS = {
    ("distlock", "memory"): 8, ("distlock", "etcd"): 4, ("distlock", "redis"): 4,
    ("distlock", "postgres"): 4, ("distlock", "redlock"): 4,
    ("distlock", "scheduler_clocks"): 4,
}


def parse_args(argv):
    jobs = int(os.environ.get("DISTLOCK_TEST_JOBS", "2"))
    doc, packages, only, filters = False, None, None, []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--jobs":
            jobs = int(argv[i + 1])
            i += 1
        elif arg == "--doc":
            doc = True
        elif arg == "--package":
            packages = set(argv[i + 1].split(","))
            i += 1
        elif arg == "--only":
            only = set(argv[i + 1].split(","))
            i += 1
        elif arg == "--":
            filters = argv[i + 1:]
            break
        else:
            sys.exit(f"run-tests: unknown argument {arg!r} (see the top of {__file__})")
        i += 1
    return max(jobs, 1), doc, packages, only, filters


def package_name(package_id):
    """The package name in a cargo package id (`path+file:///…/lock-core#0.1.0`,
    `path+file:///…/distlock#distlock@0.1.0` or the older `name 0.1.0 (…)`)."""
    if " " in package_id:
        return package_id.split(" ")[0]
    tail = package_id.rsplit("#", 1)
    if len(tail) == 2 and "@" in tail[1]:
        return tail[1].split("@")[0]
    return tail[0].rstrip("/").rsplit("/", 1)[-1]


def build():
    """Builds every test target; returns (name, package, manifest dir, executable)."""
    cmd = ["cargo", "test", "--workspace", "--all-features", "--no-run",
           "--message-format=json-render-diagnostics"]
    proc = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        sys.exit(f"run-tests: {' '.join(cmd)} failed ({proc.returncode})")
    binaries = []
    for line in proc.stdout.splitlines():
        try:
            msg = json.loads(line)
        except ValueError:
            continue
        if msg.get("reason") != "compiler-artifact" or not msg.get("executable"):
            continue
        if not msg.get("profile", {}).get("test"):
            continue
        target = msg["target"]
        package = package_name(msg["package_id"])
        name = target["name"]
        kind = target["kind"][0]
        label = name if kind == "test" else f"{name} ({kind})"
        manifest = Path(msg["manifest_path"]).parent
        binaries.append((name, label, package, manifest, msg["executable"]))
    return binaries


def main():
    jobs, doc, packages, only, filters = parse_args(sys.argv[1:])
    binaries = build()
    if packages is not None:
        binaries = [b for b in binaries if b[2] in packages]
    if only is not None:
        binaries = [b for b in binaries if b[0] in only]
        missing = only - {b[0] for b in binaries}
        if missing:
            sys.exit(f"run-tests: no test target named {', '.join(sorted(missing))}")
    binaries.sort(key=lambda b: -WEIGHTS.get(b[0], 5))
    logs = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target")) / "test-logs"
    containers = os.environ.get("DISTLOCK_TESTKIT") == "containers"
    own_threads = any(f.startswith("--test-threads") for f in filters)
    logs.mkdir(parents=True, exist_ok=True)

    queue = list(binaries)
    lock = threading.Lock()
    totals = {"passed": 0, "failed": 0}
    failures = []
    started = time.monotonic()

    def worker():
        while True:
            with lock:
                if not queue:
                    return
                name, label, package, manifest, exe = queue.pop(0)
            env = dict(os.environ)
            env["CARGO_MANIFEST_DIR"] = str(manifest)
            log = logs / (re.sub(r"[^A-Za-z0-9_.-]", "_", f"{manifest.name}-{label}") + ".log")
            t0 = time.monotonic()
            args = list(filters)
            threads = THREADS.get((package, name))
            if threads and not containers and not own_threads:
                args = ["--test-threads", str(threads), *args]
            with open(log, "w") as out:
                code = subprocess.call([exe, *args], cwd=manifest, env=env,
                                       stdout=out, stderr=subprocess.STDOUT)
            took = time.monotonic() - t0
            text = log.read_text(errors="replace")
            results = re.findall(r"^test result: .*?(\d+) passed; (\d+) failed", text, re.M)
            passed = sum(int(p) for p, _ in results)
            failed = sum(int(f) for _, f in results)
            if code != 0 and failed == 0:
                failed = 1  # died before its summary (a crash, a panic outside a test)
            with lock:
                totals["passed"] += passed
                totals["failed"] += failed
                status = "ok" if code == 0 else "FAILED"
                print(f"{status:6} {manifest.name}: {label}: {passed} passed, {failed} failed"
                      f" in {took:.1f}s", flush=True)
                if code != 0:
                    failures.append(label)
                    print(f"---- output of {label} ({log}) ----\n{text}\n---- end of {label} ----",
                          flush=True)

    threads = [threading.Thread(target=worker) for _ in range(jobs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(f"run-tests: {len(binaries)} binaries on {jobs} workers in "
          f"{time.monotonic() - started:.0f}s", flush=True)

    if doc:
        code = subprocess.call(["cargo", "test", "--workspace", "--all-features", "--doc",
                                "--quiet"], cwd=ROOT)
        if code != 0:
            failures.append("doc tests")
            totals["failed"] += 1

    if failures:
        print(f"run-tests: failed: {', '.join(failures)}")
    print(f"{totals['passed']} passed, {totals['failed']} failed")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
