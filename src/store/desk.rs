//! Where a help desk (Chatwoot, or one on `[handoff.webhook]`) meets the store: the desk's thread for a conversation handed to
//! it, which holds the conversation for the desk until the desk resolves it, and how far each
//! review item's messages were mirrored into that thread. A desk's replies settle review
//! items through [`Reviews::resolve_review`](super::Reviews::resolve_review) with
//! [`Resolution::Reply`](super::Resolution::Reply)'s `desk` id, sent once however often the
//! desk delivers them.

use async_trait::async_trait;

use super::Result;
use crate::clock::At;
use crate::domain::ConversationKey;

/// A conversation's thread on the help desk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeskThread {
    /// The desk's id of it (Chatwoot's conversation id).
    pub thread: String,
    /// Open: the desk holds the conversation. Closed: the desk resolved it, and the next
    /// hand-off opens it again.
    pub open: bool,
}

#[async_trait]
pub trait Desk: Send + Sync + 'static {
    /// The desk's thread for `conversation`, when it has one.
    async fn desk_thread(&self, conversation: &ConversationKey) -> Result<Option<DeskThread>>;

    /// Hands `conversation` to the desk's `thread` (kept, or opened again): the desk holds it,
    /// so no automatic answer goes to the customer until the thread closes
    /// ([`DESK_HOLD`](super::rules::review::DESK_HOLD)).
    ///
    /// # Errors
    /// [`Error::NotFound`](super::Error::NotFound) when there is no such conversation.
    async fn open_desk_thread(&self, conversation: &ConversationKey, thread: &str) -> Result<()>;

    /// The desk resolved `thread`: its conversation's hold goes. The conversation, when the
    /// thread is known.
    async fn close_desk_thread(&self, thread: &str) -> Result<Option<ConversationKey>>;

    /// The conversation `thread` is for, open or closed.
    async fn desk_conversation(&self, thread: &str) -> Result<Option<ConversationKey>>;

    /// Up to `limit` open review items the desk has not seen whole, oldest first: (item, the
    /// last message mirrored, `None` when the item itself is new to the desk).
    async fn desk_pending(&self, limit: usize) -> Result<Vec<(i64, Option<i64>)>>;

    /// Item `item`'s messages up to `seq` are on the desk.
    async fn set_desk_mirrored(&self, item: i64, seq: i64) -> Result<()>;

    /// Claims desk message `key` (`chatwoot:<id>`): true the first time. A message Sabi wrote
    /// into the desk is claimed as it is written, so it never comes back as an agent's reply;
    /// a reply that found nothing to settle is claimed so the agents are told once. Kept as
    /// long as a desk's reply ([`DESK_REPLY_MEMORY`](super::rules::review::DESK_REPLY_MEMORY)).
    async fn claim_desk_message(&self, key: &str, now: At) -> Result<bool>;
}
