//! The requests behind one attempt: creating a lock node and listing the line, watching the
//! node ahead, deleting nodes, and the expiry a TTL server would keep.

use super::*;

pub(super) fn options(mode: zk::CreateMode) -> zk::CreateOptions<'static> {
    mode.with_acls(zk::Acls::anyone_all())
}

impl Inner {
    /// Sends nothing itself: awaits a request already sent (the client sends at the call,
    /// so requests reach the server in call order), bounded by the timeout. A session the
    /// answer says is over is marked so.
    pub(super) async fn ask<T>(
        &self,
        session: &Session,
        op: &'static str,
        request: impl Future<Output = std::result::Result<T, zk::Error>>,
    ) -> Answer<T> {
        match tokio::time::timeout(self.timeout, request).await {
            Err(_) => Err(timed_out(op, self.timeout)),
            Ok(Ok(value)) => Ok(Ok(value)),
            Ok(Err(e)) => {
                if ends_session(&e) {
                    session.end();
                }
                if is_transient(&e) {
                    Err(failed(op, e))
                } else {
                    Ok(Err(e))
                }
            }
        }
    }

    /// How long a grant or renewal of `ttl` sent at `sent` in `session` is believed.
    pub(super) fn validity(&self, session: &Session, sent: Instant, ttl: Ttl) -> Instant {
        self.caps.validity(sent, ttl.get().min(session.timeout))
    }

    /// Makes the root (persistent) and the key's node (a container, which the server
    /// deletes once it has had children and has none).
    pub(super) async fn make_key_node(&self, s: &Session, dir: &str) -> Result<()> {
        const OP: &str = "create the key's node";
        let create_dir = || {
            self.ask(
                s,
                OP,
                s.client
                    .create(dir, &[], &options(zk::CreateMode::Container)),
            )
        };
        match create_dir().await? {
            Ok(_) | Err(zk::Error::NodeExists) => return Ok(()),
            Err(zk::Error::NoNode) => {}
            Err(e) => return Err(failed(OP, e)),
        }
        match self
            .ask(
                s,
                "create the root node",
                s.client
                    .mkdir(&self.root, &options(zk::CreateMode::Persistent)),
            )
            .await?
        {
            Ok(()) => {}
            Err(e) => return Err(failed("create the root node", e)),
        }
        // The root exists now: the key's node again.
        match create_dir().await? {
            Ok(_) | Err(zk::Error::NodeExists) => Ok(()),
            Err(e) => Err(failed(OP, e)),
        }
    }

    /// Creates `owner`'s lock node under `dir` and lists the line, in one round trip (the
    /// list is sent after the create, so it sees the new node). The key's node is made
    /// when missing.
    pub(super) async fn enter(
        &self,
        s: &Session,
        dir: &str,
        owner: Owner,
    ) -> Result<(zk::Stat, String, Vec<String>)> {
        const OP: &str = "create a lock node";
        let prefix = lock_prefix(dir, owner);
        let mut made_dir = false;
        loop {
            let create =
                s.client
                    .create(&prefix, &[], &options(zk::CreateMode::EphemeralSequential));
            let list = s.client.list_children(dir);
            let (created, listed) = tokio::join!(
                self.ask(s, OP, create),
                self.ask(s, "list the key's lock nodes", list)
            );
            match created? {
                Ok((stat, sequence)) => {
                    let name = format!("{}{sequence}", &prefix[dir.len() + 1..]);
                    let children = match listed? {
                        Ok(children) => children,
                        Err(e) => return Err(failed("list the key's lock nodes", e)),
                    };
                    return Ok((stat, name, children));
                }
                Err(zk::Error::NoNode) if !made_dir => {
                    self.make_key_node(s, dir).await?;
                    made_dir = true;
                }
                Err(e) => return Err(failed(OP, e)),
            }
        }
    }

    /// Wakes the key's waiters when `path` changes (is deleted), or at once when it is gone
    /// already.
    pub(super) async fn watch(&self, s: &Session, key: &str, path: &str) -> Result<()> {
        match self
            .ask(
                s,
                "watch the predecessor",
                s.client.check_and_watch_stat(path),
            )
            .await?
        {
            Ok((Some(_), watcher)) => {
                let notices = self.notices.clone();
                let key = key.to_owned();
                tokio::spawn(async move {
                    watcher.changed().await;
                    notices.notify(&key);
                });
            }
            Ok((None, _)) => self.notices.notify(key),
            Err(e) => return Err(failed("watch the predecessor", e)),
        }
        Ok(())
    }

    /// Deletes `path` if it exists: `Ok(true)` deleted, `Ok(false)` was gone.
    pub(super) async fn delete(&self, s: &Session, op: &'static str, path: &str) -> Result<bool> {
        match self.ask(s, op, s.client.delete(path, None)).await? {
            Ok(()) => Ok(true),
            Err(zk::Error::NoNode) => Ok(false),
            Err(e) => Err(failed(op, e)),
        }
    }

    /// Deletes every lock node of `owner` under `key`'s node (found by name: an attempt
    /// whose answer never came). A failure ends the session, so that the server deletes
    /// them with it within the session timeout.
    pub(super) async fn remove_owner(&self, key: &str, owner: Owner) -> Result<()> {
        let s = self.sessions.get().await?;
        let dir = key_node(&self.root, key);
        let result = async {
            let children = match self
                .ask(&s, "list lock nodes", s.client.list_children(&dir))
                .await?
            {
                Ok(children) => children,
                Err(zk::Error::NoNode) => return Ok(()),
                Err(e) => return Err(failed("list lock nodes", e)),
            };
            for (_, node_owner, name) in in_line(children) {
                if node_owner == owner {
                    self.delete(
                        &s,
                        "delete an abandoned lock node",
                        &format!("{dir}/{name}"),
                    )
                    .await?;
                }
            }
            Ok(())
        }
        .await;
        if let Err(e) = &result {
            if e.is_transient() {
                s.end();
            }
        }
        self.notices.notify(key);
        result
    }
}
