//! The forwarding impls of [`Backend`] for `Arc<B>` and `Box<B>`, so a shared or boxed
//! backend is a backend.

use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;

use crate::backend::{Admin, Attempt, Backend, Baseline, HandOver, Immediate};
use crate::capabilities::{Capabilities, Ttl};
use crate::error::Result;
use crate::lease::{Lease, Owner};
use crate::notices::ReleaseListener;
use crate::permits::Permits;

// A forwarding impl that left out a provided method would silently fall back to its
// default (`abandon` a no-op, an ability `None`): the lint makes every one explicit.
macro_rules! forward_backend {
    ($ty:ty) => {
        #[async_trait]
        #[deny(clippy::missing_trait_methods)]
        impl<B: Backend + ?Sized> Backend for $ty {
            fn capabilities(&self) -> &Capabilities {
                (**self).capabilities()
            }
            async fn try_acquire(
                &self,
                key: &str,
                owner: Owner,
                permits: Permits,
                ttl: Ttl,
            ) -> Result<Attempt> {
                (**self).try_acquire(key, owner, permits, ttl).await
            }
            async fn extend(&self, lease: &Lease, ttl: Ttl) -> Result<Instant> {
                (**self).extend(lease, ttl).await
            }
            async fn release(&self, lease: &Lease) -> Result<()> {
                (**self).release(lease).await
            }
            fn listen(&self, key: &str) -> Option<ReleaseListener> {
                (**self).listen(key)
            }
            async fn abandon(&self, key: &str, owner: Owner) -> Result<()> {
                (**self).abandon(key, owner).await
            }
            fn hand_over(&self) -> Option<&dyn HandOver> {
                (**self).hand_over()
            }
            fn admin(&self) -> Option<&dyn Admin> {
                (**self).admin()
            }
            fn immediate(&self) -> Option<&dyn Immediate> {
                (**self).immediate()
            }
            fn baseline(&self) -> Option<&dyn Baseline> {
                (**self).baseline()
            }
            fn run_records(&self) -> Option<&dyn crate::records::RunRecords> {
                (**self).run_records()
            }
            fn fire_claims(&self) -> Option<&dyn crate::claims::FireClaims> {
                (**self).fire_claims()
            }
            fn leader_values(&self) -> Option<&dyn crate::election::LeaderValues> {
                (**self).leader_values()
            }
        }
    };
}

forward_backend!(Arc<B>);
forward_backend!(Box<B>);
