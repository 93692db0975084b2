//! The PostgreSQL backend against real `postgres` processes (lock-testkit): the whole
//! conformance suite (directly, through `Arc<dyn Backend>` and through
//! `distlock::connect`), the shared fault rules behind a fault proxy, fencing across a
//! restart and a `kill -9`, database time against a skewed client, and bad input.

#[path = "../common/mod.rs"]
mod common;
#[path = "../common/sql.rs"]
mod sql;

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

use common::{postgres_backend as backend, postgres_url, rand_u32};
use distlock::postgres::PostgresBackend;
use distlock::{Attempt, Backend, Error, LockOptions, LockUrl, Locker, Owner};
use lock_conformance::Target;
use lock_testkit::PostgresServer;

/// The PostgreSQL suite of the rules in [`sql`].
struct Postgres;

impl sql::SqlSuite for Postgres {
    type Server = PostgresServer;
    type Backend = PostgresBackend;
    const SERVER_SPEAKS_FIRST: bool = false;

    async fn start() -> PostgresServer {
        PostgresServer::start().await
    }

    fn url_with(addr: std::net::SocketAddr, password: &str, params: &str) -> String {
        let url = format!("postgres://postgres:{password}@{addr}/{}", "postgres");
        if params.is_empty() {
            url
        } else {
            format!("{url}?{params}")
        }
    }

    fn url(addr: std::net::SocketAddr, params: &str) -> String {
        postgres_url(addr, params)
    }

    async fn backend(url: &str) -> PostgresBackend {
        backend(url).await
    }

    async fn connect(url: &LockUrl) -> distlock::Result<PostgresBackend> {
        PostgresBackend::connect(url).await
    }
}

fn key(name: &str) -> String {
    format!("{name}-{:08x}", rand_u32())
}
