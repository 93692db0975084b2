//! The optional abilities of [`ZooKeeperBackend`]: admin (inspect, force release), leaders' values
//! (elections) and the raw baseline of `distlock bench`.

use super::*;

#[async_trait]
impl Admin for ZooKeeperBackend {
    /// The key's lowest lock node: its owner token, and its `czxid` as the fence; no time
    /// left (it lasts while its session does).
    async fn inspect(&self, key: &str) -> Result<Vec<Holder>> {
        let inner = &self.inner;
        let s = inner.sessions.get().await?;
        let dir = key_node(&inner.root, key);
        for (_, owner, name) in in_line(
            match inner
                .ask(&s, "list lock nodes", s.client.list_children(&dir))
                .await?
            {
                Ok(children) => children,
                Err(zk::Error::NoNode) => return Ok(Vec::new()),
                Err(e) => return Err(failed("list lock nodes", e)),
            },
        ) {
            let path = format!("{dir}/{name}");
            match inner
                .ask(&s, "read the holder's node", s.client.check_stat(&path))
                .await?
            {
                Ok(Some(stat)) => {
                    let fence = u64::try_from(stat.czxid).ok();
                    return Ok(vec![Holder::new(Some(owner), fence, None)]);
                }
                // Released meanwhile: the next one holds.
                Ok(None) => continue,
                Err(e) => return Err(failed("read the holder's node", e)),
            }
        }
        Ok(Vec::new())
    }

    /// Deletes the key's lowest lock node, whoever's it is; `true` when one was deleted.
    async fn force_release(&self, key: &str) -> Result<bool> {
        let inner = &self.inner;
        let s = inner.sessions.get().await?;
        let dir = key_node(&inner.root, key);
        let children = match inner
            .ask(&s, "list lock nodes", s.client.list_children(&dir))
            .await?
        {
            Ok(children) => children,
            Err(zk::Error::NoNode) => return Ok(false),
            Err(e) => return Err(failed("list lock nodes", e)),
        };
        let Some((_, _, name)) = in_line(children).into_iter().next() else {
            return Ok(false);
        };
        let deleted = inner
            .delete(&s, "delete the holder's node", &format!("{dir}/{name}"))
            .await?;
        inner.notices.notify(key);
        Ok(deleted)
    }
}

#[async_trait]
impl LeaderValues for ZooKeeperBackend {
    /// Sets the data of the lease's node (a marker byte and the value): only while the
    /// node exists, so only while the lease holds.
    async fn publish(&self, lease: &Lease, value: &[u8]) -> Result<()> {
        let inner = &self.inner;
        let (path, session, epoch) = match lock(&inner.held).get(&lease.owner()) {
            Some(h) if *h.key == *lease.key() => (h.path.clone(), h.session, h.epoch),
            _ => return Err(lease.not_held()),
        };
        let Some(s) = inner
            .sessions
            .peek()
            .filter(|s| s.id == session && s.keeps(epoch))
        else {
            return Err(lease.not_held());
        };
        let mut data = Vec::with_capacity(1 + value.len());
        data.push(PUBLISHED);
        data.extend_from_slice(value);
        match inner
            .ask(
                &s,
                "publish a leader's value",
                s.client.set_data(&path, &data, None),
            )
            .await?
        {
            Ok(_) => {}
            Err(zk::Error::NoNode) => return Err(lease.not_held()),
            Err(e) => return Err(failed("publish a leader's value", e)),
        }
        inner.notices.notify(lease.key());
        Ok(())
    }

    /// The key's lowest lock node and its published value, leaving watches on the line and
    /// on that node: a new holder, a new value or a release wakes the key's listeners.
    async fn leader(&self, key: &str) -> Result<Option<Leader>> {
        let inner = &self.inner;
        let s = inner.sessions.get().await?;
        let dir = key_node(&inner.root, key);
        let (children, watcher) = match inner
            .ask(&s, "read the line", s.client.list_and_watch_children(&dir))
            .await?
        {
            Ok(answer) => answer,
            Err(zk::Error::NoNode) => {
                // Watch for the key's node to appear instead.
                inner.watch(&s, key, &dir).await?;
                return Ok(None);
            }
            Err(e) => return Err(failed("read the line", e)),
        };
        let notices = inner.notices.clone();
        let wake = key.to_owned();
        tokio::spawn(async move {
            watcher.changed().await;
            notices.notify(&wake);
        });
        let Some((_, owner, name)) = in_line(children).into_iter().next() else {
            return Ok(None);
        };
        let path = format!("{dir}/{name}");
        match inner
            .ask(
                &s,
                "read the leader's value",
                s.client.get_and_watch_data(&path),
            )
            .await?
        {
            Ok((data, stat, watcher)) => {
                let notices = inner.notices.clone();
                let wake = key.to_owned();
                tokio::spawn(async move {
                    watcher.changed().await;
                    notices.notify(&wake);
                });
                match data.split_first() {
                    Some((&PUBLISHED, value)) => Ok(Some(Leader::new(
                        value.to_vec(),
                        u64::try_from(stat.czxid).unwrap_or(0),
                        owner,
                        None,
                    ))),
                    _ => Ok(None),
                }
            }
            // Released meanwhile; the line's watch has fired or will.
            Err(zk::Error::NoNode) => Ok(None),
            Err(e) => Err(failed("read the leader's value", e)),
        }
    }

    /// The release itself (a deleted node) fires the watches that observers left with
    /// [`leader`](Self::leader); this wakes this process's listeners.
    async fn announce(&self, key: &str) -> Result<()> {
        self.inner.notices.notify(key);
        Ok(())
    }
}

#[async_trait]
impl Baseline for ZooKeeperBackend {
    fn description(&self) -> &'static str {
        "create EPHEMERAL_SEQUENTIAL + getChildren + delete"
    }

    /// What a hand-written Curator-style lock does when the key is free: create an
    /// ephemeral sequential node under the key's raw node (`<key node>-raw`), list the
    /// children, delete the node; no fence, no owner bookkeeping.
    async fn raw_cycle(&self, key: &str, _ttl: Ttl) -> Result<()> {
        let inner = &self.inner;
        let s = inner.sessions.get().await?;
        let dir = format!("{}-raw", key_node(&inner.root, key));
        let (_, name, _) = inner.enter(&s, &dir, Owner::random()).await?;
        inner
            .delete(&s, "delete the raw node", &format!("{dir}/{name}"))
            .await?;
        Ok(())
    }
}
