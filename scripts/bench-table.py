#!/usr/bin/env python3
"""The README's table of benchmark ratios, made from the JSON documents the benches write.

    cargo bench --features full          # writes target/bench-ratios/<backend>.json
    python3 scripts/bench-table.py       # prints the Markdown table
    python3 scripts/bench-table.py --readme README.md   # replaces the table in the README

Every number is a ratio of two subjects measured in interleaved rounds of the same run
(> 1 favours distlock), next to the client and server CPU each spends per cycle.
"""
import json
import os
import sys

BACKENDS = [
    "memory", "file", "redis", "redlock", "etcd", "postgres", "mysql", "zookeeper", "memory-permits",
    "redis-permits", "postgres-permits", "memory-kinds", "redis-kinds", "postgres-kinds",
]
PEER = {
    "memory": "mutex-map",
    "file": "flock",
    "redis": "rslock",
    "redlock": "rslock",
    "etcd": "lock-rpc",
    "postgres": "advisory",
    "mysql": "get_lock",
    "zookeeper": "raw",
    "memory-permits": "semaphore-map",
    "redis-permits": "raw",
    "postgres-permits": "raw",
    # A semaphore's permit, a reader and a writer against a lock on the same backend.
    "memory-kinds": "lock",
    "redis-kinds": "lock",
    "postgres-kinds": "lock",
}
START, END = "<!-- bench-table:start -->", "<!-- bench-table:end -->"


def fmt_ratio(r):
    if r is None:
        return "–"
    goal = r.get("goal")
    mark = "" if goal is None else (" ✓" if r["ratio"] >= goal else f" ✗ (goal {goal:.3g})")
    return f"{r['ratio']:.2f}{mark}"


def table(directory):
    head = (
        "| backend | workload | ours / peer | drop / peer | drop / release | ours / raw "
        "| bound: raw-fenced or raw-lease / peer | CPU µs per cycle, client + server: ours · peer |\n"
        "|---|---|---|---|---|---|---|---|\n"
    )
    rows = []
    for backend in BACKENDS:
        path = os.path.join(directory, f"{backend}.json")
        if not os.path.exists(path):
            continue
        doc = json.load(open(path))
        peer = PEER[backend]
        workloads = []
        for row in doc["rows"]:
            if row["workload"] not in workloads:
                workloads.append(row["workload"])
        for w in workloads:
            ratio = {
                (r["num"], r["den"]): r for r in doc["ratios"] if r["workload"] == w
            }
            cpu = {r["subject"]: r for r in doc["rows"] if r["workload"] == w}

            def c(subject):
                r = cpu.get(subject)
                return "–" if r is None else f"{r['client_cpu_us']:.1f} + {r['server_cpu_us']:.1f}"

            ours = fmt_ratio(ratio.get(("ours", peer)))
            if peer == "lock":
                ours = f"semaphore {ours}; reader {fmt_ratio(ratio.get(('reader', peer)))}; " \
                    f"writer {fmt_ratio(ratio.get(('writer', peer)))}"
            unwatched = ratio.get(("ours-nowd", peer))
            if unwatched is not None:
                ours += f"; without watchdog {fmt_ratio(unwatched)}"
            unsynced = ratio.get(("ours-nosync", peer))
            if unsynced is not None:
                ours += f"; without sync {fmt_ratio(unsynced)}"
            raw = fmt_ratio(ratio.get(("ours", "raw")))
            lease_raw = ratio.get(("raw-lease", "raw"))
            if lease_raw is not None:
                raw += f"; bound: raw-lease / raw {fmt_ratio(lease_raw)}"
            bound = ratio.get(("raw-fenced", peer)) or ratio.get(("raw-lease", peer))
            rows.append(
                f"| {backend} (vs {peer}) | {w} | {ours} "
                f"| {fmt_ratio(ratio.get(('ours-drop', peer)))} "
                f"| {fmt_ratio(ratio.get(('ours-drop', 'ours')))} "
                f"| {raw} "
                f"| {fmt_ratio(bound)} | {c('ours')} · {c(peer)} |"
            )
        for one in doc.get("one_key", []):
            # met is null where there is no bound (back to back on an in-process backend).
            if one["subject"] == "ours" and one.get("met") is not None:
                met = "✓" if one["met"] else "✗"
                rows.append(
                    f"| {backend} | one key, worst wait | {one['worst_wait_ms']:.1f} ms {met} "
                    f"(bound {one['bound_ms']:.1f} ms) | | | | | |"
                )
    if not rows:
        sys.exit(f"no benchmark results under {directory}: run `cargo bench --features full`")
    return head + "\n".join(rows) + "\n"


def main():
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    directory = os.environ.get("DISTLOCK_BENCH_OUT", os.path.join(here, "target", "bench-ratios"))
    text = table(directory)
    if len(sys.argv) == 3 and sys.argv[1] == "--readme":
        readme = open(sys.argv[2]).read()
        if START not in readme or END not in readme:
            sys.exit(f"{sys.argv[2]} has no {START} … {END} markers")
        before, rest = readme.split(START, 1)
        _, after = rest.split(END, 1)
        open(sys.argv[2], "w").write(before + START + "\n" + text + END + after)
    elif len(sys.argv) == 1:
        sys.stdout.write(text)
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
