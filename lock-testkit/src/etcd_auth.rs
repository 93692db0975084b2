//! etcd's authentication for tests: a root user, users whose roles grant one key prefix,
//! and `auth enable`, through etcd-client's auth API (no etcdctl).

use std::time::Duration;

use etcd_client::{Client, ConnectOptions, Permission};

use crate::etcd::EtcdServer;

/// Bound on each auth API call of [`EtcdServer::enable_auth`].
const AUTH_TIMEOUT: Duration = Duration::from_secs(10);

/// A user [`EtcdServer::enable_auth`] creates: allowed to read and write the keys starting
/// with `prefix` (a role of its own with a readwrite permission on that range), nothing else.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EtcdUser {
    /// The user name (also the name of its role, with `-role` appended).
    pub name: String,
    /// Its password.
    pub password: String,
    /// The key prefix it may read and write.
    pub prefix: String,
}

impl EtcdServer {
    /// Creates user `root` (password `root_password`, role `root`), every user of `users`
    /// with its role, then enables authentication: from then on every request needs a
    /// user's credentials, and a user may touch only its prefix.
    ///
    /// # Panics
    ///
    /// If the member does not answer or refuses a step within 10 s (the message names the
    /// step).
    pub async fn enable_auth(&self, root_password: &str, users: &[EtcdUser]) {
        let mut options = ConnectOptions::new().with_connect_timeout(AUTH_TIMEOUT);
        if let Some(tls) = self.tls() {
            options = options.with_tls(tls.etcd_options());
        }
        let mut client = step("connect", Client::connect([self.endpoint()], Some(options))).await;
        step(
            "add user root",
            client.user_add("root", root_password, None),
        )
        .await;
        // etcd 3.4 has no root role until it is added; later versions have one already.
        let _ = tokio::time::timeout(AUTH_TIMEOUT, client.role_add("root")).await;
        step(
            "grant role root to root",
            client.user_grant_role("root", "root"),
        )
        .await;
        for user in users {
            let role = format!("{}-role", user.name);
            step("add a role", client.role_add(role.as_str())).await;
            let range = Permission::read_write(user.prefix.as_str()).with_prefix();
            step(
                "grant the prefix",
                client.role_grant_permission(role.as_str(), range),
            )
            .await;
            step(
                "add a user",
                client.user_add(user.name.as_str(), user.password.as_str(), None),
            )
            .await;
            step(
                "grant the role",
                client.user_grant_role(user.name.as_str(), role.as_str()),
            )
            .await;
        }
        step("enable auth", client.auth_enable()).await;
    }
}

/// Runs one auth API call within [`AUTH_TIMEOUT`], panicking with `what` on failure.
async fn step<T>(
    what: &str,
    call: impl std::future::Future<Output = Result<T, etcd_client::Error>>,
) -> T {
    match tokio::time::timeout(AUTH_TIMEOUT, call).await {
        Ok(Ok(answer)) => answer,
        Ok(Err(e)) => panic!("lock-testkit: etcd auth setup, {what}: {e}"),
        Err(_) => {
            panic!("lock-testkit: etcd auth setup, {what}: no answer within {AUTH_TIMEOUT:?}")
        }
    }
}
