#!/usr/bin/env python3
"""Checks that the library's dependency floors are true: the crates whose floors are ours
alone (lock-core, lock-memory, lock-scheduler and the facade with `memory,scheduler`) build
with the declared minimum Rust version when every direct dependency is at the lowest
version its requirement allows (cargo's `-Z direct-minimal-versions`, taken from the
declared toolchain's cargo with RUSTC_BOOTSTRAP=1, so no nightly is needed).

Why only those crates: a user resolves every requirement in their tree together, so a
floor matters where it is the highest requirement on that crate. The network backends'
clients raise the floors above ours (redis 1.4+ asks tokio 1.51, croner 4 jiff 0.2.35):
there the resolver picks their floors whatever ours say. Dev-dependencies (rslock,
testcontainers, …) are not the user's and are stripped, with the tests, benches and
examples that need them.

Usage: scripts/minimal-versions.py TOOLCHAIN   (e.g. 1.88)
Runs on a copy of the tracked files under a temporary directory; its own target directory
is target/minimal-versions.
"""

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHECKED = ["lock-core", "lock-memory", "lock-scheduler"]


def strip(manifest: Path, root: bool) -> None:
    text = manifest.read_text()
    # Dev-dependencies, and the targets that need them.
    text = re.sub(r"(?ms)^\[dev-dependencies\].*?(?=^\[|\Z)", "", text)
    text = re.sub(r"(?ms)^\[\[(test|bench|example)\]\].*?(?=^\[|\Z)", "", text)
    if root:
        members = ", ".join(f'"{m}"' for m in CHECKED)
        text = re.sub(r"(?m)^members = .*$", f"members = [{members}]", text)
        # The facade without its network backends (their crates are not in this check).
        for backend in ["lock-file", "lock-redis", "lock-redlock", "lock-etcd", "lock-postgres",
                        "lock-mysql", "lock-zookeeper"]:
            text = re.sub(rf"(?m)^{backend} = \{{ workspace = true, optional = true \}}\n", "", text)
        text = re.sub(r'(?m)^(file|redis|redlock|etcd|postgres|mysql|zookeeper) = \["dep:lock-[a-z]+"\]\n',
                      "", text)
        text = re.sub(r"(?m)^full = .*$", 'full = ["memory", "scheduler"]', text)
        text = re.sub(r"(?m)^tls = .*$", "tls = []", text)
        text = re.sub(r"(?m)^tls-ring = .*$", "tls-ring = []", text)
    manifest.write_text(text)


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    toolchain = sys.argv[1]
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.split()
    with tempfile.TemporaryDirectory(prefix="distlock-minver.") as tmp:
        copy = Path(tmp)
        for name in files:
            parts = Path(name).parts
            # The root's files, the facade's sources and the checked crates, without the
            # tests, benches and examples (they use dev-dependencies).
            wanted = len(parts) == 1 or parts[0] == "src" or (
                parts[0] in CHECKED and parts[1] not in ("tests", "benches", "examples"))
            if not wanted:
                continue
            dest = copy / name
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, dest)
        strip(copy / "Cargo.toml", root=True)
        for member in CHECKED:
            strip(copy / member / "Cargo.toml", root=False)
        # The facade names the backends stripped above in cfg attributes: not a warning here.
        env = dict(os.environ, RUSTC_BOOTSTRAP="1", RUSTFLAGS="-A unexpected_cfgs",
                   CARGO_TARGET_DIR=str(ROOT / "target" / "minimal-versions"))
        steps = [
            ["cargo", f"+{toolchain}", "update", "-Z", "direct-minimal-versions", "--quiet"],
            ["cargo", f"+{toolchain}", "check", "--quiet", "--workspace", "--all-features",
             "--lib"],
        ]
        for step in steps:
            if subprocess.run(step, cwd=copy, env=env).returncode != 0:
                print(f"minimal versions: `{' '.join(step)}` failed: a dependency floor in "
                      "Cargo.toml is below what the code (or another dependency) needs")
                return 1
    print("minimal versions: lock-core, lock-memory, lock-scheduler and the facade "
          "(memory, scheduler) build at their dependencies' floors")
    return 0


if __name__ == "__main__":
    sys.exit(main())
