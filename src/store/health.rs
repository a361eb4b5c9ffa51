//! Whether the store answers, for the health endpoint and readiness.

use async_trait::async_trait;

use super::Result;

/// Whether the store can serve.
#[async_trait]
pub trait Health: Send + Sync + 'static {
    /// Succeeds when the store is reachable and its schema is current.
    async fn ready(&self) -> Result<()>;
}
