//! How a turn ends: the event that closes a batch's lease (see [`super::batch`]) and writes its
//! reply to the outbox, its failure, or its hand-over to a person.

use crate::clock::At;
use crate::domain::{ReplyPart, ReviewReason};

/// How a turn ends. Written with the lease's token, atomically.
#[derive(Debug, Clone, PartialEq)]
pub enum Ending {
    /// The reply goes to the outbox: held there in sandbox mode, queued for sending otherwise.
    Replied {
        parts: Vec<ReplyPart>,
        sandbox: bool,
    },
    /// The turn failed; the batch may be claimed again from `at`.
    RetryAt { at: At, error: String },
    /// A person takes it from here.
    Review {
        reason: ReviewReason,
        error: Option<String>,
    },
    /// A person takes it from here, and the customer is told so with `parts`.
    Handoff {
        parts: Vec<ReplyPart>,
        sandbox: bool,
        note: String,
    },
}
