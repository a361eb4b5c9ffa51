//! The engine's settings: how the scheduler runs turns, and its rules for retries and age.

use std::time::Duration;

/// How the scheduler runs, typed once from configuration.
#[derive(Debug, Clone)]
pub struct EngineSettings {
    /// Turns at once on this node.
    pub turns: usize,
    pub lease: Duration,
    /// How often the store is asked for work that other nodes stored.
    pub poll_interval: Duration,
    /// How long running turns may take to finish at shutdown.
    pub shutdown_grace: Duration,
    /// Replies are kept in the outbox, never sent.
    pub sandbox: bool,
    /// A WhatsApp reply's first part quotes the customer's latest message.
    pub quote_replies: bool,
    /// A WhatsApp reply in more parts than this is packed into as few messages as fit.
    pub max_reply_parts: usize,
    /// The turn's log line names the customer and quotes their words (off: a short hash).
    pub log_customer_data: bool,
    pub policy: EnginePolicy,
}

/// Of a node's `turns` slots, those the turns outside the routine lane may hold at once: all
/// but a fifth (at least one), which stay for turns the router answers alone, however deep the
/// queue of model turns. A node with one slot shares it. (`sabi plan` sizes with it too.)
pub fn queue_slots(turns: usize) -> usize {
    all_but_a_fifth(turns)
}

/// Of a node's `turns` slots, those web chat may hold at once: all but a fifth of the queue's
/// slots stay for WhatsApp, whose customers are answered in normal time however full the
/// web-chat queue is.
pub fn web_chat_slots(turns: usize) -> usize {
    all_but_a_fifth(queue_slots(turns))
}

/// All but a fifth (at least one) of `slots`; one slot is shared.
fn all_but_a_fifth(slots: usize) -> usize {
    if slots < 2 {
        slots
    } else {
        slots - (slots / 5).max(1)
    }
}

/// The engine's rules, typed once from configuration.
#[derive(Debug, Clone)]
pub struct EnginePolicy {
    /// Turns tried before the batch goes to review.
    pub max_attempts: u32,
    /// The wait after the first failure; doubled after each further one.
    pub retry_base: Duration,
    /// A batch whose first message reached Sabi this late goes to review.
    pub review_after: Duration,
    /// A batch that waited in Sabi's own queue this long goes to review (`None`: never).
    pub queued_review_after: Option<Duration>,
}

/// When customers far back in the queue are told to wait, and what they are told.
#[derive(Debug, Clone)]
pub struct HoldSettings {
    /// Customers expected to wait longer are told; zero: never.
    pub after: Duration,
    /// The message; `{wait}` becomes the expected wait.
    pub message: String,
    pub sandbox: bool,
}
