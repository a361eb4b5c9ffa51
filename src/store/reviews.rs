//! Review: what the automatic path hands to a person, and how a person settles it.

use async_trait::async_trait;

use super::rules::review::{Resolution, ReviewState};
use super::{ConversationView, Result};
use crate::clock::At;
use crate::domain::{BatchMessage, ConversationKey, ReviewReason};

/// A batch waiting for a person.
#[derive(Debug, Clone, PartialEq)]
pub struct ReviewEntry {
    pub id: i64,
    pub batch_id: i64,
    /// The reply part it is about, when a send went wrong.
    pub outbox_id: Option<i64>,
    pub state: ReviewState,
    pub conversation: ConversationKey,
    pub reason: ReviewReason,
    pub error: Option<String>,
    pub created_at: At,
    pub messages: Vec<BatchMessage>,
}

/// Which review items to list.
#[derive(Debug, Clone, Default)]
pub struct ReviewQuery {
    /// Only items of this reason.
    pub reason: Option<ReviewReason>,
    /// Only items of this customer.
    pub customer: Option<String>,
    pub limit: Option<usize>,
}

/// What people do: the review queue, settling its items, and customers' conversations.
#[async_trait]
pub trait Reviews: Send + Sync + 'static {
    /// Open review items, oldest first.
    async fn review_queue(&self, query: ReviewQuery) -> Result<Vec<ReviewEntry>>;

    /// One review item, open or settled.
    async fn review_item(&self, id: i64) -> Result<Option<ReviewEntry>>;

    /// Settles an open review item, atomically with what it asks for.
    ///
    /// # Errors
    /// [`Error::NotFound`](super::Error::NotFound) when no open item has this id.
    async fn resolve_review(&self, id: i64, now: At, resolution: Resolution) -> Result<()>;

    /// The conversations of a customer, with their history (the last `turns` turns).
    async fn conversations(&self, customer: &str, turns: usize) -> Result<Vec<ConversationView>>;

    /// A person's word on what a turn's messages asked (an intent's name, or `out_of_scope`);
    /// a later label replaces an earlier one.
    ///
    /// # Errors
    /// [`Error::NotFound`](super::Error::NotFound) when there is no such batch.
    async fn label_turn(&self, batch: i64, intent: &str) -> Result<()>;
}
