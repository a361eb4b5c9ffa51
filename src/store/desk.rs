//! Where a help desk (Chatwoot) meets the store: the desk's thread for a conversation handed to
//! it, which holds the conversation for the desk until the desk resolves it, and how far each
//! review item's messages were mirrored into that thread. A desk's replies settle review
//! items through [`Reviews::resolve_review`](super::Reviews::resolve_review) with
//! [`Resolution::Reply`](super::Resolution::Reply)'s `desk` id, sent once however often the
//! desk delivers them.

use async_trait::async_trait;

use super::Result;
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

    /// The last message mirrored into the desk for each of `items` that has one: (item, seq).
    async fn desk_mirrored(&self, items: &[i64]) -> Result<Vec<(i64, i64)>>;

    /// Item `item`'s messages up to `seq` are on the desk.
    async fn set_desk_mirrored(&self, item: i64, seq: i64) -> Result<()>;
}
