//! EtcdServer / EtcdCluster against real etcd processes.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use lock_testkit::{EtcdCluster, EtcdServer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Minimal HTTP/1.0 POST of a JSON body to etcd's gRPC gateway.
async fn post(addr: SocketAddr, path: &str, body: &str) -> String {
    let exchange = async {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        let request = format!(
            "POST {path} HTTP/1.0\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\n\r\n{body}",
            body.len()
        );
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).await.unwrap();
        response
    };
    tokio::time::timeout(Duration::from_secs(5), exchange)
        .await
        .expect("etcd gateway answers")
}

// base64("testkit-key") and base64("testkit-value").
const KEY_B64: &str = "dGVzdGtpdC1rZXk=";
const VALUE_B64: &str = "dGVzdGtpdC12YWx1ZQ==";

async fn put(addr: SocketAddr) {
    let response = post(
        addr,
        "/v3/kv/put",
        &format!(r#"{{"key":"{KEY_B64}","value":"{VALUE_B64}"}}"#),
    )
    .await;
    assert!(response.starts_with("HTTP/1.0 200"), "{response}");
}

async fn has_value(addr: SocketAddr) -> bool {
    let response = post(addr, "/v3/kv/range", &format!(r#"{{"key":"{KEY_B64}"}}"#)).await;
    assert!(response.starts_with("HTTP/1.0 200"), "{response}");
    response.contains(VALUE_B64)
}

#[tokio::test]
async fn single_server_health_kill_restart_keeps_data() {
    let mut server = EtcdServer::start().await;
    assert_eq!(
        server.endpoint(),
        format!("127.0.0.1:{}", server.client_port())
    );
    assert_eq!(server.addr().port(), server.client_port());
    assert_ne!(server.client_port(), server.peer_port());
    assert!(server.is_running());
    assert!(server.health().await);

    put(server.addr()).await;
    assert!(has_value(server.addr()).await);

    server.kill();
    assert!(!server.is_running());
    assert!(!server.health().await, "health must fail after kill");
    assert!(TcpStream::connect(server.addr()).await.is_err());

    server.restart().await;
    assert!(server.is_running());
    assert!(server.health().await, "healthy again after restart");
    assert!(
        has_value(server.addr()).await,
        "etcd keeps its data across restart"
    );
}

#[tokio::test]
async fn paused_server_is_unhealthy_until_resumed() {
    let server = EtcdServer::start().await;
    server.pause();
    assert!(server.is_running());
    assert!(!server.health().await, "a paused server does not answer");
    server.resume();
    assert!(server.health().await);
}

#[tokio::test]
async fn cluster_elects_a_new_leader_when_the_leader_is_paused() {
    let mut cluster = EtcdCluster::start(3).await;
    assert_eq!(cluster.len(), 3);
    let endpoints: HashSet<String> = cluster.endpoints().into_iter().collect();
    assert_eq!(endpoints.len(), 3, "distinct endpoints");
    for member in cluster.members() {
        assert!(member.health().await, "{} healthy", member.name());
    }

    let leader = cluster.leader().await;
    assert!(leader < 3);

    cluster.member_mut(leader).pause();
    let started = Instant::now();
    let new_leader = loop {
        let current = cluster.leader().await;
        if current != leader {
            break current;
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "no failover within 5 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(new_leader < 3);
    assert_ne!(new_leader, leader);

    // The old leader rejoins as a follower once resumed.
    cluster.member_mut(leader).resume();
    let started = Instant::now();
    while !cluster.member(leader).health().await {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "old leader rejoins"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn cluster_member_kill_and_restart() {
    let mut cluster = EtcdCluster::start(3).await;
    let leader = cluster.leader().await;
    let follower = (leader + 1) % 3;
    put(cluster.member(leader).addr()).await;

    cluster.member_mut(follower).kill();
    assert!(!cluster.member(follower).is_running());
    // Two of three still form a quorum.
    assert!(cluster.member(leader).health().await);

    cluster.member_mut(follower).restart().await;
    assert!(cluster.member(follower).health().await);
    assert!(has_value(cluster.member(follower).addr()).await);
}
