//! What the help desk's agents do with a conversation Sabi handed over ([`crate::desk`]):
//! `POST /webhook/chatwoot` (Chatwoot's webhooks) and `POST /webhook/desk` (a desk on
//! `[handoff.webhook]`). Each delivery is signed and fresh ([`crate::desk::check`]), or refused
//! 401. An agent's reply goes to the customer through the conversation's open review item, so
//! through the outbox and all its rules (order, pacing, the 24-hour window), once per desk
//! message however often the desk delivers it; resolving the thread closes its items and gives
//! the customer back to the assistant. Private notes, the customer's own messages and what
//! Sabi wrote itself change nothing. A store that cannot be written answers 503, and the desk
//! delivers again.

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};

use super::{ApiError, AppState};
use crate::desk::{self, Event, HelpDesk, Kind, chatwoot, webhook};
use crate::domain::{Channel, ConversationKey};
use crate::metrics::Metrics;
use crate::store::{self, Resolution, ReviewEntry, ReviewQuery};

/// What the agents are told when their reply found nothing to settle.
const NOT_SENT: &str = "Not sent: Sabi holds no open hand-off for this customer any more (it was \
                        settled on Sabi's desk). Hand the customer over again to answer them here.";

/// What the agents are told when they answer in a conversation Sabi did not hand over.
const NOT_HANDED_OVER: &str = "Not sent: Sabi did not hand this conversation over (or is still \
                               opening it), so it cannot reach the customer from here. Answer in \
                               a conversation Sabi opened.";

/// `POST /webhook/chatwoot`.
pub(super) async fn chatwoot(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<StatusCode, ApiError> {
    receive(&state, Kind::Chatwoot, &headers, &body).await
}

/// `POST /webhook/desk`.
pub(super) async fn webhook(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<StatusCode, ApiError> {
    receive(&state, Kind::Webhook, &headers, &body).await
}

/// A delivery from the configured desk of `kind`: checked, read, and acted on.
async fn receive(
    state: &AppState,
    kind: Kind,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<StatusCode, ApiError> {
    let headers_of = match kind {
        Kind::Chatwoot => (chatwoot::TIMESTAMP_HEADER, chatwoot::SIGNATURE_HEADER),
        Kind::Webhook => (webhook::TIMESTAMP_HEADER, webhook::SIGNATURE_HEADER),
    };
    let desk = signed(state, kind, headers, headers_of, body)?;
    // Read only once it is known to come from the desk.
    let event = match kind {
        Kind::Chatwoot => chatwoot::event(body).map_err(|e| format!("not JSON: {e}")),
        Kind::Webhook => webhook::event(body),
    };
    act(state, desk, event.map_err(ApiError::BadRequest)?).await
}

/// The configured desk of `kind`, once the delivery's signature and age are checked.
fn signed<'a>(
    state: &'a AppState,
    kind: Kind,
    headers: &HeaderMap,
    (timestamp, signature): (&str, &str),
    body: &[u8],
) -> Result<&'a HelpDesk, ApiError> {
    let Some(desk) = state.desk.as_ref().filter(|d| d.kind == kind) else {
        return Err(ApiError::NotFound);
    };
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let checked = desk::check(
        &desk.secret,
        header(timestamp),
        header(signature).map(str::as_bytes),
        body,
        state.clock.now(),
    );
    if let Err(refused) = checked {
        Metrics::count(&state.metrics.desk, "refused");
        return Err(refused.into());
    }
    Ok(desk)
}

async fn act(state: &AppState, desk: &HelpDesk, event: Event) -> Result<StatusCode, ApiError> {
    match event {
        Event::Reply {
            thread,
            message,
            text,
        } => reply(state, desk, &thread, message, text).await?,
        Event::Resolved { thread } => resolved(state, &thread).await?,
        Event::Ignored => {}
    }
    Ok(StatusCode::OK)
}

/// The agent's reply, through the conversation's latest open item; when Sabi has none open
/// (a person settled it on Sabi's own desk), the agents are told, once.
async fn reply(
    state: &AppState,
    desk: &HelpDesk,
    thread: &str,
    message: String,
    text: String,
) -> Result<(), ApiError> {
    let Some(key) = state.store.desk_conversation(thread).await? else {
        return unsent(state, desk, thread, &message, NOT_HANDED_OVER).await;
    };
    let resolution = Resolution::Reply {
        text,
        sandbox: state.admin.sandbox && key.channel == Channel::Whatsapp,
        hold: state.admin.human_hold,
        desk: Some(message.clone()),
    };
    // An item settled between the listing and the reply: the next newest takes it.
    for _ in 0..2 {
        let Some(item) = open_items(state, &key).await?.pop() else {
            break;
        };
        match state
            .store
            .resolve_review(item.id, state.clock.now(), resolution.clone())
            .await
        {
            Ok(()) => {
                Metrics::count(&state.metrics.desk, "reply");
                // This node's sender looks at once; other nodes find it at their next poll.
                state.outbox.notify_one();
                return Ok(());
            }
            Err(store::Error::NotFound) => {}
            Err(e) => return Err(e.into()),
        }
    }
    unsent(state, desk, thread, &message, NOT_SENT).await
}

/// The agents are told, once however often the desk delivers it, that `message` was not sent.
async fn unsent(
    state: &AppState,
    desk: &HelpDesk,
    thread: &str,
    message: &str,
    why: &str,
) -> Result<(), ApiError> {
    // Claimed: a reply sent before and delivered again is not reported as unsent.
    if state
        .store
        .claim_desk_message(message, state.clock.now())
        .await?
    {
        Metrics::count(&state.metrics.desk, "reply_unsent");
        if let Err(e) = desk.target.notice(thread, why).await {
            tracing::warn!(error.message = %e, "telling the help desk a reply was not sent failed");
        }
    }
    Ok(())
}

/// Resolved on the desk: the hold goes and the conversation's open items close.
async fn resolved(state: &AppState, thread: &str) -> Result<(), ApiError> {
    let Some(key) = state.store.close_desk_thread(thread).await? else {
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
