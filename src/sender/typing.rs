//! Read receipts with the typing indicator, around any turn handler.
//!
//! A turn only reaches its handler once the engine decided it will be answered (not too old,
//! not out of tries), so the indicator never shows for a batch that goes to review. Meta hides
//! it after 25 s, so it is sent again every 20 s while the turn runs. It is best effort: a
//! failure is logged and the turn goes on.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use super::Sender;
use crate::domain::{Batch, Channel};
use crate::worker::{TurnError, TurnHandler, TurnOutcome};

/// How often the indicator is shown again while a turn runs.
const REFRESH: Duration = Duration::from_secs(20);

pub struct Typing {
    inner: Arc<dyn TurnHandler>,
    sender: Arc<Sender>,
}

impl Typing {
    pub fn new(inner: Arc<dyn TurnHandler>, sender: Arc<Sender>) -> Arc<Typing> {
        Arc::new(Typing { inner, sender })
    }

    async fn show(sender: Arc<Sender>, business: String, message_id: String) {
        loop {
            sender.pacer().acquire(&business).await;
            if let Err(e) = sender.graph().mark_read(&business, &message_id, true).await {
                tracing::warn!(error.message = %e, "could not show the typing indicator");
            }
            tokio::time::sleep(REFRESH).await;
        }
    }
}

#[async_trait]
impl TurnHandler for Typing {
    async fn handle(&self, batch: &Batch) -> Result<TurnOutcome, TurnError> {
        let last = batch.messages.last().map(|m| m.external_id.clone());
        let indicator = match (batch.conversation.channel, last) {
            (Channel::Whatsapp, Some(message_id)) => Some(tokio::spawn(Typing::show(
                self.sender.clone(),
                batch.conversation.business.clone(),
                message_id,
            ))),
            _ => None,
        };
        let outcome = self.inner.handle(batch).await;
        if let Some(indicator) = indicator {
            indicator.abort();
        }
        outcome
    }
}
