//! RedisServer / RedisNodes against real redis-server processes.

use std::collections::HashSet;
use std::time::Duration;

use lock_testkit::{RedisNodes, RedisOptions, RedisServer};
use redis::aio::MultiplexedConnection;
use tokio::net::TcpStream;

async fn set(connection: &mut MultiplexedConnection, key: &str, value: &str) {
    redis::cmd("SET")
        .arg(key)
        .arg(value)
        .query_async::<()>(connection)
        .await
        .expect("SET");
}

async fn get(connection: &mut MultiplexedConnection, key: &str) -> Option<String> {
    redis::cmd("GET")
        .arg(key)
        .query_async(connection)
        .await
        .expect("GET")
}

#[tokio::test]
async fn set_get_kill_restart_comes_back_empty() {
    let mut server = RedisServer::start().await;
    assert_eq!(server.url(), format!("redis://127.0.0.1:{}", server.port()));
    assert_eq!(server.addr().port(), server.port());
    assert!(server.is_running());
    assert!(server.ping().await);

    let mut connection = server.client().await;
    set(&mut connection, "k", "v").await;
    assert_eq!(get(&mut connection, "k").await.as_deref(), Some("v"));

    server.kill();
    assert!(!server.is_running());
    assert!(server.pid().is_none());
    assert!(!server.ping().await);
    assert!(
        TcpStream::connect(server.addr()).await.is_err(),
        "a killed server must refuse connections"
    );
    server.kill(); // idempotent

    let port = server.port();
    server.restart().await;
    assert_eq!(server.port(), port, "restart keeps the port");
    assert!(server.is_running());
    let mut connection = server.client().await;
    assert_eq!(
        get(&mut connection, "k").await,
        None,
        "not persistent: data is gone"
    );
}

#[tokio::test]
async fn persistent_server_keeps_keys_across_restart() {
    let mut server = RedisServer::start_with(RedisOptions {
        persistent: true,
        password: None,
        ..RedisOptions::default()
    })
    .await;
    let mut connection = server.client().await;
    set(&mut connection, "durable", "yes").await;
    server.restart().await; // SIGKILL, then start on the same port and dir
    let mut connection = server.client().await;
    assert_eq!(
        get(&mut connection, "durable").await.as_deref(),
        Some("yes")
    );
}

#[tokio::test]
async fn rdb_server_restarts_from_its_last_snapshot() {
    let mut server = RedisServer::start_with(RedisOptions {
        rdb: true,
        ..RedisOptions::default()
    })
    .await;
    let mut connection = server.client().await;
    set(&mut connection, "saved", "old").await;
    server.save().await;
    set(&mut connection, "saved", "new").await;
    set(&mut connection, "unsaved", "yes").await;
    server.restart().await; // SIGKILL: nothing written after the SAVE survives
    let mut connection = server.client().await;
    assert_eq!(get(&mut connection, "saved").await.as_deref(), Some("old"));
    assert_eq!(get(&mut connection, "unsaved").await, None);
}

#[tokio::test]
async fn password_is_required_and_in_the_url() {
    let server = RedisServer::start_with(RedisOptions {
        persistent: false,
        password: Some("s3cr3t/pw".into()),
        ..RedisOptions::default()
    })
    .await;
    assert_eq!(
        server.url(),
        format!("redis://:s3cr3t%2Fpw@127.0.0.1:{}", server.port())
    );
    let mut connection = server.client().await;
    set(&mut connection, "a", "1").await;
    assert_eq!(get(&mut connection, "a").await.as_deref(), Some("1"));

    let anonymous = redis::Client::open(format!("redis://127.0.0.1:{}", server.port()))
        .unwrap()
        .get_multiplexed_async_connection()
        .await;
    let denied = match anonymous {
        Err(_) => true,
        Ok(mut connection) => redis::cmd("GET")
            .arg("a")
            .query_async::<Option<String>>(&mut connection)
            .await
            .is_err(),
    };
    assert!(denied, "a connection without the password must be rejected");
}

#[tokio::test]
async fn pause_makes_requests_hang_and_resume_answers_them() {
    let server = RedisServer::start().await;
    let mut connection = server.client().await;
    set(&mut connection, "p", "1").await;

    server.pause();
    assert!(server.is_running(), "a paused server is still running");
    let stalled = tokio::time::timeout(Duration::from_millis(300), get(&mut connection, "p")).await;
    assert!(stalled.is_err(), "GET on a paused server must time out");

    server.resume();
    let answered = tokio::time::timeout(Duration::from_secs(5), get(&mut connection, "p"))
        .await
        .expect("GET after resume must answer");
    assert_eq!(answered.as_deref(), Some("1"));
}

#[tokio::test]
async fn paused_server_can_be_killed_and_restarted() {
    let mut server = RedisServer::start().await;
    server.pause();
    server.kill();
    assert!(!server.is_running());
    server.pause(); // no-op when not running
    server.resume();
    server.pause();
    server.restart().await; // restart of a paused server kills it first
    assert!(server.ping().await);
    server.pause();
    let pid = server.pid().expect("running");
    drop(server);
    // Dropping a paused server kills and reaps it (not even a zombie left).
    assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists());
}

#[tokio::test]
async fn nodes_are_independent_servers() {
    let mut nodes = RedisNodes::start(3).await;
    assert_eq!(nodes.len(), 3);
    assert!(!nodes.is_empty());
    let ports: HashSet<u16> = nodes.addrs().iter().map(|a| a.port()).collect();
    assert_eq!(ports.len(), 3, "three distinct ports");
    for (i, node) in nodes.nodes().iter().enumerate() {
        assert!(node.ping().await, "node {i} answers");
        let mut connection = node.client().await;
        set(&mut connection, "node", &i.to_string()).await;
    }
    for (i, node) in nodes.nodes().iter().enumerate() {
        let mut connection = node.client().await;
        assert_eq!(get(&mut connection, "node").await, Some(i.to_string()));
    }
    nodes.node_mut(1).kill();
    assert!(nodes.nodes()[0].ping().await);
    assert!(!nodes.nodes()[1].ping().await);
    assert!(nodes.nodes()[2].ping().await);
}
