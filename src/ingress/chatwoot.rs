//! `POST /webhook/chatwoot`: what Chatwoot's agents do with a conversation Sabi handed over
//! ([`crate::desk`]). Each delivery is signed and fresh ([`chatwoot::check`]), or refused 401.
//! An agent's public reply goes to the customer through the conversation's open review item,
//! so through the outbox and all its rules (order, pacing, the 24-hour window), once per
//! Chatwoot message however often Chatwoot delivers it; resolving the conversation closes its
//! items and gives the customer back to the assistant. Private notes, the customer's own
//! messages and what Sabi posted itself change nothing. A store that cannot be written
//! answers 503, and Chatwoot delivers again.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use secrecy::SecretString;

use super::{ApiError, AppState};
use crate::desk::chatwoot::{self, Chatwoot, Event, Posted};
use crate::desk::thread_of;
use crate::domain::{Channel, ConversationKey};
use crate::metrics::Metrics;
use crate::store::{self, Resolution, ReviewEntry, ReviewQuery};

/// The ingress's side of the help desk.
pub struct DeskLink {
    pub chatwoot: Arc<Chatwoot>,
    pub webhook_secret: SecretString,
}

pub(super) async fn receive(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<StatusCode, ApiError> {
    let Some(desk) = &state.desk else {
        return Err(ApiError::NotFound);
    };
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let checked = chatwoot::check(
        &desk.webhook_secret,
        header(chatwoot::TIMESTAMP_HEADER),
        header(chatwoot::SIGNATURE_HEADER).map(str::as_bytes),
        &body,
        state.clock.now(),
    );
    if let Err(refused) = checked {
        Metrics::count(&state.metrics.desk, "refused");
        return Err(refused.into());
    }
    let event =
        chatwoot::event(&body).map_err(|e| ApiError::BadRequest(format!("not JSON: {e}")))?;
    match event {
        Event::Reply {
            conversation,
            message,
            text,
        } => reply(&state, desk, conversation, message, text).await?,
        Event::Resolved { conversation } => resolved(&state, conversation).await?,
        Event::Ignored => {}
    }
    Ok(StatusCode::OK)
}

/// The agent's reply, through the conversation's latest open item; when Sabi has none open
/// (a person closed it on Sabi's own desk), the agent is told in a private note.
async fn reply(
    state: &AppState,
    desk: &DeskLink,
    conversation: i64,
    message: i64,
    text: String,
) -> Result<(), ApiError> {
    let Some(key) = state
        .store
        .desk_conversation(&thread_of(conversation))
        .await?
    else {
        return Ok(());
    };
    let Some(item) = open_items(state, &key).await?.pop() else {
        Metrics::count(&state.metrics.desk, "reply_unsent");
        let note = "Not sent: Sabi holds no open hand-off for this customer any more (it was \
                    settled on Sabi's desk). Hand the customer over again to answer them here.";
        if let Err(e) = desk.chatwoot.post(conversation, note, Posted::Note).await {
            tracing::warn!(error.message = %e, "telling Chatwoot a reply was not sent failed");
        }
        return Ok(());
    };
    let resolution = Resolution::Reply {
        text,
        sandbox: state.admin.sandbox && key.channel == Channel::Whatsapp,
        hold: state.admin.human_hold,
        desk: Some(format!("chatwoot:{message}")),
    };
    state
        .store
        .resolve_review(item.id, state.clock.now(), resolution)
        .await?;
    Metrics::count(&state.metrics.desk, "reply");
    // This node's sender looks at once; other nodes find it at their next poll.
    state.outbox.notify_one();
    Ok(())
}

/// Resolved in Chatwoot: the hold goes and the conversation's open items close.
async fn resolved(state: &AppState, conversation: i64) -> Result<(), ApiError> {
    let Some(key) = state
        .store
        .close_desk_thread(&thread_of(conversation))
        .await?
    else {
        return Ok(());
    };
    for item in open_items(state, &key).await? {
        match state
            .store
            .resolve_review(item.id, state.clock.now(), Resolution::Close)
            .await
        {
            Ok(()) | Err(store::Error::NotFound) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Metrics::count(&state.metrics.desk, "resolved");
    Ok(())
}

/// The conversation's open review items, oldest first.
async fn open_items(state: &AppState, key: &ConversationKey) -> store::Result<Vec<ReviewEntry>> {
    let query = ReviewQuery {
        customer: Some(key.customer.clone()),
        ..ReviewQuery::default()
    };
    let mut items = state.store.review_queue(query).await?;
    items.retain(|i| i.conversation == *key);
    items.sort_by_key(|i| i.id);
    Ok(items)
}
