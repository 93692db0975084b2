//! The PostgreSQL backend against real `postgres` processes (lock-testkit): the whole
//! conformance suite (directly, through `Arc<dyn Backend>` and through
//! `distlock::connect`), the shared fault rules behind a fault proxy, fencing across a
//! restart and a `kill -9`, database time against a skewed client, and bad input.

#[path = "../common/mod.rs"]
mod common;

mod bad_input;
mod conformance;
mod election;
mod faults;
mod grants;
mod grouped;
mod notify;
mod permits;
mod records;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{postgres_backend as backend, postgres_url, rand_u32, Proxied};
use distlock::postgres::PostgresBackend;
use distlock::{Attempt, Backend, Error, LockOptions, LockUrl, Locker, Owner};
use lock_conformance::{run_faults, Faults, Target};
use lock_testkit::PostgresServer;

fn key(name: &str) -> String {
    format!("{name}-{:08x}", rand_u32())
}
