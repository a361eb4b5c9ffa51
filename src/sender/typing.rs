//! Read receipts with the typing indicator, around any turn handler.
//!
//! A turn only reaches its handler once the engine decided it will be answered (not too old,
//! not out of tries), so the indicator never shows for a batch that goes to review. Meta hides
//! it after 25 s, so it is sent again every 20 s while the turn runs. The indicator is best
//! effort: when the number has no budget to spare this instant it is skipped, so a turn never
//! holds its slot waiting for Meta's rate and replies keep the number's budget. The read receipt
//! it carries is not: a first indicator that did not go leaves the message owed to the sender's
//! receipts, which mark it read as soon as the number has room.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use super::Sender;
use crate::domain::{Batch, Channel};
use crate::turn::{TurnError, TurnHandler, TurnOutcome};

/// How often the indicator is shown again while a turn runs.
const REFRESH: Duration = Duration::from_secs(20);
/// The longest a turn waits for its first indicator to go out.
const FIRST_WAIT: Duration = Duration::from_secs(2);

pub struct Typing {
    inner: Arc<dyn TurnHandler>,
    sender: Arc<Sender>,
    /// Whether the indicator shows; without it the message is only marked read.
    indicator: bool,
}

impl Typing {
    pub fn new(inner: Arc<dyn TurnHandler>, sender: Arc<Sender>, indicator: bool) -> Arc<Typing> {
        Arc::new(Typing {
            inner,
            sender,
            indicator,
        })
    }

    /// Shows the indicator, marking `message_id` read; whether it went.
    async fn show(&self, business: &str, message_id: &str) -> bool {
        if !self.sender.pacer().try_acquire(business) {
            tracing::debug!("the number's rate is spent: no typing indicator this time");
            return false;
        }
        match self
            .sender
            .graph()
            .mark_read(business, message_id, true)
            .await
        {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(error.message = %e, "could not show the typing indicator");
                false
            }
        }
    }

    /// The first indicator, which also marks the batch's latest message read, or leaves it
    /// owed.
    async fn show_first(&self, business: &str, customer: &str, message_id: &str) {
        let receipts = self.sender.receipts();
        if self.show(business, message_id).await {
            receipts.paid(&self.sender, business, customer);
        } else {
            receipts.owe(&self.sender, business, customer, message_id);
        }
    }

    async fn keep_showing(&self, business: &str, message_id: &str) -> Infallible {
        loop {
            self.after(REFRESH).await;
            self.show(business, message_id).await;
        }
    }

    /// Completes `wait` from now on the sender's clock.
    fn after(&self, wait: Duration) -> crate::clock::Sleep {
        let clock = self.sender.clock();
        clock.sleep_until(clock.now() + wait)
    }
}

#[async_trait]
impl TurnHandler for Typing {
    async fn handle(&self, batch: &Batch) -> Result<TurnOutcome, TurnError> {
        let last = batch.messages.last().map(|m| m.external_id.as_str());
        let (Channel::Whatsapp, Some(message_id)) = (batch.conversation.channel, last) else {
            return self.inner.handle(batch).await;
        };
        let business = batch.conversation.business.as_str();
        let customer = batch.conversation.customer.as_str();
        if !self.indicator {
            let receipts = self.sender.receipts();
            receipts.owe(&self.sender, business, customer, message_id);
            return self.inner.handle(batch).await;
        }
        // The turn ends only once the first indicator went out (or gave up), so it comes
        // before the reply; a slow Graph API holds the turn back by no more than FIRST_WAIT.
        let first = async {
            tokio::select! {
                () = self.show_first(business, customer, message_id) => {}
                () = self.after(FIRST_WAIT) => {}
            }
        };
        let work = async {
            let (outcome, ()) = tokio::join!(self.inner.handle(batch), first);
            outcome
        };
        tokio::select! {
            outcome = work => outcome,
            never = self.keep_showing(business, message_id) => match never {},
        }
    }
}
