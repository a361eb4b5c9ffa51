//! The sweeper's role: what is past its horizon is deleted.

use std::time::Duration;

use async_trait::async_trait;

use super::Result;
use super::rules::retention::{Horizons, Swept};
use crate::clock::At;

/// Keeping data only as long as it is needed ([`rules::retention`](super::rules::retention) has the rules).
#[async_trait]
pub trait Retention: Send + Sync + 'static {
    /// Takes `lease` for `holder` until `now + ttl`, or renews it; `false` while another
    /// holder's time is not up.
    async fn hold_lease(&self, lease: &str, holder: &str, now: At, ttl: Duration) -> Result<bool>;

    /// Removes at most `batch` of each kind past its horizon at `now`, and says what went.
    /// Empty: nothing more is past its horizon.
    async fn sweep(&self, horizons: &Horizons, now: At, batch: usize) -> Result<Swept>;

    /// After a pass that deleted something: gives a slice of the space it freed back to the
    /// file system (SQLite), or makes it free for new rows at once (PostgreSQL's vacuum);
    /// `true` while more could go.
    async fn reclaim_space(&self) -> Result<bool> {
        Ok(false)
    }
}
