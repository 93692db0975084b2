//! File backend against the plain pattern users write by hand, in the same run: open the
//! key's file, `flock(LOCK_EX)` (here `LOCK_NB` retried every millisecond, so a waiting
//! task never blocks a runtime thread), and close it to unlock, as `flock(1)` does; no
//! fence, no queue. Ours adds the fence read, written and synced in the file (`fdatasync`,
//! the bulk of a cycle on a disk, nothing on a tmpfs), the in-process FIFO queue and the
//! guard; `ours-nosync` is ours with `?sync=false` (the fence written but not synced:
//! what a tmpfs such as `$XDG_RUNTIME_DIR` costs). The lock directory is a fresh one in the
//! temporary directory.

mod common;

use std::fs::{File, OpenOptions};
use std::os::unix::io::AsRawFd as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use common::{
    named, ratio, Bench, Child, Distlock, End, Ratio, Settings, Subject, Workload, WORKLOADS,
};

/// The hand-written `flock` loop, on files of its own beside ours.
struct RawFlock {
    dir: PathBuf,
}

impl Subject for RawFlock {
    type Guard = File;
    async fn lock(&self, key: Arc<str>) -> File {
        let path = self.dir.join(format!("raw-{}", key.replace('/', "%2F")));
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .expect("open");
        loop {
            // SAFETY: flock on a descriptor we own.
            if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
                return file;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    async fn unlock(&self, file: File) {
        drop(file);
    }
}

fn ratios(_: Workload) -> Vec<Ratio> {
    // Reported, no goal: a synced fence costs a disk flush the peer never makes.
    vec![
        ratio("ours", "flock", None),
        ratio("ours-drop", "flock", None),
        ratio("ours-drop", "ours", Some(0.95)),
        ratio("ours-nosync", "flock", None),
    ]
}

#[tokio::main]
async fn main() {
    if let Some(child) = Child::from_env() {
        let url = child.target().to_owned();
        match child.subject() {
            "ours" => {
                child
                    .run(&Distlock::connect(&url, End::Release).await)
                    .await
            }
            "ours-drop" => child.run(&Distlock::connect(&url, End::Drop).await).await,
            "ours-nosync" => {
                let url = format!("{url}?sync=false");
                child
                    .run(&Distlock::connect(&url, End::Release).await)
                    .await
            }
            "flock" => {
                let parsed = distlock::LockUrl::parse(&url).expect("the URL");
                let peer = RawFlock {
                    dir: PathBuf::from(parsed.path),
                };
                child.run(&Arc::new(peer)).await
            }
            other => panic!("no subject {other}"),
        }
        return;
    }
    let dir = std::env::temp_dir().join(format!("distlock-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("the lock directory");
    let bench = Bench {
        backend: "file",
        peers: "open + flock(LOCK_EX) + close on a file per key (flock(1)'s pattern), in the temporary directory",
        subjects: vec![
            named("ours"),
            named("ours-drop"),
            named("ours-nosync"),
            named("flock"),
        ],
        target: distlock::file::FileBackend::url_of(&dir).expect("a URL"),
        servers: Vec::new(),
        raw: Some("flock"),
        settings: Settings::from_args(),
    };
    let measured = bench.run(&WORKLOADS).await;
    bench.report(&measured, ratios);
    let _ = std::fs::remove_dir_all(&dir);
}
