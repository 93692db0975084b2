//! Dev-only test kit for the `distlock` workspace.
//!
//! `lock-testkit` starts **real** lock servers as child processes on free
//! loopback ports and lets tests inject faults into them. There is no Docker
//! and there are no mocks: the binaries `redis-server` and `etcd` must be
//! installed (a missing binary panics with the exact `apt-get` command that
//! installs it; nothing is ever skipped silently).
//!
//! * [`RedisServer`] / [`RedisNodes`]: one or several independent
//!   `redis-server` processes (the latter for Redlock tests).
//! * [`EtcdServer`] / [`EtcdCluster`]: a single-member etcd or an N-member
//!   etcd cluster on loopback with short election timings.
//! * [`FaultProxy`]: a TCP proxy inside the test process that can delay,
//!   blackhole, reset or refuse connections on demand ([`ProxyMode`]).
//! * [`ManagedProcess`]: the small shared "managed child process" type both
//!   server kinds are built on (spawn, kill, pause, resume, wait until ready).
//!   Adding another server kind means building its command line and a
//!   readiness probe on top of it.
//!
//! # Process hygiene
//!
//! Servers never outlive the test binary:
//!
//! * dropping a server handle sends `SIGKILL` to its process group and reaps
//!   it (this also works for a paused server);
//! * every child is spawned with `prctl(PR_SET_PDEATHSIG, SIGKILL)`, so the
//!   kernel kills it when the test process dies without unwinding (failed
//!   `abort`, `std::process::exit`, a signal, ...). Because the death signal
//!   is tied to the *thread* that forked, all spawns happen on one dedicated
//!   long-lived thread owned by this crate (see [`ManagedProcess::spawn`]);
//! * each child gets its own process group, so a Ctrl-C in the terminal is
//!   delivered to the test process only (which then takes its children down).
//!
//! Every server uses its own ports and its own temporary directory, so tests
//! in one binary may run in parallel threads.
//!
//! # Example
//!
//! ```no_run
//! use lock_testkit::{FaultProxy, ProxyMode, RedisServer};
//!
//! # async fn demo() {
//! let mut redis = RedisServer::start().await;
//! let proxy = FaultProxy::start(redis.addr()).await;
//! // Point the code under test at `proxy.addr()` ...
//! proxy.set_mode(ProxyMode::Blackhole);
//! // ... and watch it time out, then heal the network:
//! proxy.set_mode(ProxyMode::Pass);
//! redis.restart().await; // same port, empty data set
//! # }
//! ```
#![deny(missing_docs)]

mod binary;
mod etcd;
mod http;
mod ports;
mod process;
mod proxy;
mod redis;

pub use crate::binary::find_binary;
pub use crate::etcd::{EtcdCluster, EtcdServer};
pub use crate::process::{ManagedProcess, StartError};
pub use crate::proxy::{FaultProxy, ProxyMode};
pub use crate::redis::{RedisNodes, RedisOptions, RedisServer};
