//! The web chat: a browser's questions as jobs, their progress, and the conversation it reads back.

use std::time::Duration;

use async_trait::async_trait;

use super::Result;
use super::rules::item::JobStatus;
use crate::clock::At;
use crate::domain::BatchPolicy;

/// A web-chat question to keep, with its job.
#[derive(Debug, Clone)]
pub struct ChatSubmission {
    pub session_id: String,
    /// The browser's idempotency key: the same (session, message id) always gives the same job.
    pub message_id: Option<String>,
    pub question: String,
    /// The visitor's user id, when their site vouched for it (`user_hash`).
    pub user_id: Option<String>,
    /// The client address of an anonymous visitor (none for a vouched one): the desk folds
    /// repeated hand-offs from one address into one.
    pub address: Option<String>,
    /// The site the chat runs on: the conversation's business side.
    pub business: String,
    /// A fresh unguessable id, used when this is a new job.
    pub job_id: String,
    pub now: At,
    pub policy: BatchPolicy,
    /// How long the job's result can be fetched.
    pub keep: Duration,
    /// At most this many new questions from one session in the minute before `now`; counted
    /// and stored in one atomic step, so a burst cannot slip past the limit.
    pub per_minute: u64,
    /// At most this many web-chat questions waiting in all; counted in the same step.
    pub max_queue: u64,
}

/// What became of a web-chat question.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Submitted {
    /// Stored (or stored before, for a resend): its job.
    Job(ChatReceipt),
    /// The session asked too often in the last minute: nothing stored. `retry_after`: when
    /// its oldest counted question leaves the minute, so that one more may come.
    TooFast { retry_after: Duration },
    /// The web-chat queue is full: nothing stored.
    QueueFull,
    /// The session is bound to another verified user than the one asking (or the one asking
    /// is anonymous): nothing stored, and no job of the session named.
    NotYours,
}

/// The job a submission gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatReceipt {
    pub job_id: String,
    /// False when the same message was submitted before: nothing new was stored.
    pub created: bool,
    pub earliest_due: Option<At>,
}

/// A web-chat job as its browser sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatJob {
    pub job_id: String,
    pub session_id: String,
    pub status: JobStatus,
    /// What its turn is doing, once started, if the turn said.
    pub stage: Option<String>,
    /// Questions ahead of this one, while queued.
    pub position: Option<u64>,
    pub answer: Option<String>,
    /// The choices the answer offers (its last part's quick replies): the page shows them as
    /// buttons, and a tap asks the choice as the next question.
    pub options: Vec<String>,
    pub created_at: At,
}

/// One question of a session's history, and its answer once there is one.
#[derive(Debug, Clone, PartialEq, serde::Serialize, utoipa::ToSchema)]
pub struct ChatExchange {
    /// Where the exchange stands in its session's order: ask for the history `before` it for
    /// the ones asked earlier.
    #[serde(skip)]
    pub cursor: i64,
    pub job_id: String,
    pub question: String,
    pub answer: Option<String>,
    pub status: JobStatus,
    /// Milliseconds since the epoch.
    #[serde(rename = "asked_at_ms")]
    #[schema(value_type = i64)]
    pub asked_at: At,
}

/// What people wrote to a web-chat session, and whether one holds its conversation now.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ChatFeed {
    /// A review item of the session is open: a person holds the conversation, and what the
    /// visitor writes goes to them ([`rules::review::destination`](super::rules::review::destination)).
    pub held: bool,
    /// People's replies after the id asked for, oldest first.
    pub lines: Vec<PersonLine>,
}

/// A person's reply to a web-chat session.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
pub struct PersonLine {
    /// Increases with every reply in the store: resume after it.
    pub id: i64,
    pub text: String,
    /// Milliseconds since the epoch.
    #[serde(rename = "at_ms")]
    #[schema(value_type = i64)]
    pub at: At,
}

/// What the web chat keeps and serves: questions, their jobs, a session's history.
#[async_trait]
pub trait WebChat: Send + Sync + 'static {
    /// Keeps a web-chat question and its job in one atomic step; the same (session, message
    /// id) always gives the same job, also when two submissions race. While a review item of
    /// the session is open, the question joins that item's batch for the person and no turn is
    /// scheduled ([`rules::review::destination`](super::rules::review::destination)). The session's
    /// `per_minute` limit and the queue's `max_queue` are counted in the same step, so no burst
    /// slips past either. A session is bound to the first verified user whose question it
    /// keeps; from then on anyone else's submission (an anonymous one too, and a resend of one
    /// of its message ids) is [`Submitted::NotYours`], decided in the same step.
    async fn submit_chat(&self, submission: ChatSubmission) -> Result<Submitted>;

    /// The verified user the session is bound to: the first whose question it kept
    /// ([`ChatSubmission::user_id`]); `None` while only anonymous visitors used it.
    async fn chat_session_owner(&self, session_id: &str) -> Result<Option<String>>;

    /// The job already made for this (session, message id), if any.
    async fn chat_job_for_message(
        &self,
        session_id: &str,
        message_id: &str,
    ) -> Result<Option<String>>;

    /// A job, unless it is unknown or expired at `now`.
    async fn chat_job(&self, job_id: &str, now: At) -> Result<Option<ChatJob>>;

    /// A session's questions and answers in the order they arrived, the last `limit` of them
    /// asked before the exchange whose cursor is `before` (`None`: the latest): the clocks of
    /// the nodes that took them (each question's `now`) do not reorder them.
    async fn chat_history(
        &self,
        session_id: &str,
        before: Option<i64>,
        limit: usize,
    ) -> Result<Vec<ChatExchange>>;

    /// Web-chat questions waiting for a turn. Counts them: callers keep the figure a moment.
    async fn chat_queue_depth(&self) -> Result<u64>;

    /// People's replies to the session after reply `after` (at most `limit`, oldest first),
    /// and whether a person holds it now. One cheap read: event streams ask it every second.
    async fn chat_feed(&self, session_id: &str, after: i64, limit: usize) -> Result<ChatFeed>;
}
