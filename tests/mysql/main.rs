//! The MySQL/MariaDB backend against real `mariadbd` processes (lock-testkit): the whole
//! conformance suite (directly and through `distlock::connect`), the shared fault rules
//! behind a fault proxy, fencing across a restart and a `kill -9`, database time, grouped
//! scripts, and bad input.

#[path = "../common/mod.rs"]
mod common;
#[path = "../common/sql.rs"]
mod sql;

mod bad_input;
mod conformance;
mod faults;
mod grants;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{mysql_backend as backend, mysql_url, rand_u32};
use distlock::mysql::MysqlBackend;
use distlock::{Attempt, Backend, Error, LockOptions, LockUrl, Locker, Owner};
use lock_conformance::Target;
use lock_testkit::MariaDbServer;

/// The MySQL/MariaDB suite of the rules in [`sql`].
struct Mysql;

impl sql::SqlSuite for Mysql {
    type Server = MariaDbServer;
    type Backend = MysqlBackend;
    const SERVER_SPEAKS_FIRST: bool = true;

    async fn start() -> MariaDbServer {
        MariaDbServer::start().await
    }

    fn url_with(addr: std::net::SocketAddr, password: &str, params: &str) -> String {
        let url = format!(
            "mysql://root:{password}@{addr}/{}",
            lock_testkit::MARIADB_DATABASE
        );
        if params.is_empty() {
            url
        } else {
            format!("{url}?{params}")
        }
    }

    fn url(addr: std::net::SocketAddr, params: &str) -> String {
        mysql_url(addr, params)
    }

    async fn backend(url: &str) -> MysqlBackend {
        backend(url).await
    }

    async fn connect(url: &LockUrl) -> distlock::Result<MysqlBackend> {
        MysqlBackend::connect(url).await
    }
}

fn key(name: &str) -> String {
    format!("{name}-{:08x}", rand_u32())
}
