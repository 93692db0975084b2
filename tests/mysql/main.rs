//! The MySQL/MariaDB backend against real `mariadbd` processes (lock-testkit): the whole
//! conformance suite (directly and through `distlock::connect`), the shared fault rules
//! behind a fault proxy, fencing across a restart and a `kill -9`, database time, grouped
//! scripts, and bad input.

#[path = "../common/mod.rs"]
mod common;

mod bad_input;
mod conformance;
mod faults;
mod grants;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{mysql_backend as backend, mysql_url, rand_u32, Proxied};
use distlock::mysql::MysqlBackend;
use distlock::{Attempt, Backend, Error, LockOptions, LockUrl, Locker, Owner};
use lock_conformance::{run_faults, Faults, Target};
use lock_testkit::MariaDbServer;

fn key(name: &str) -> String {
    format!("{name}-{:08x}", rand_u32())
}
