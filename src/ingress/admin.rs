//! The admin API: people take over what Sabi handed them. Everything under `/admin/` needs
//! `Authorization: Bearer <SABI_ADMIN_TOKEN>` (compared in constant time); with no token
//! configured every `/admin/` path and `/desk` answer 404 `admin_disabled`, saying which
//! setting turns the API on. The review desk page (`/desk`) holds no data itself: it asks for
//! the token and calls this API.
//!
//! - `GET /admin/review?reason=&customer=&limit=`: open review items, WhatsApp's first, then
//!   oldest first; an anonymous visitor's open items from one address (any reason) fold into one;
//!   with the intents a person may label messages as;
//! - `GET /admin/review/{id}`: one item with its conversation;
//! - `POST /admin/review/{id}/reply` `{"text": "..."}`: a person's reply, through the outbox
//!   and all its rules (order, pacing, the 24-hour window);
//! - `POST /admin/review/{id}/requeue`: back to the agent (or, for a send, sent again);
//! - `POST /admin/review/{id}/close`;
//! - `POST /admin/review/{id}/label` `{"intent": "..."}`: what the item's messages asked, for
//!   the router to learn from (`sabi route --export-unsure`);
//! - `GET /admin/conversations?customer=`: a customer's conversations and history;
//! - `GET /admin/stats?since=`: who answered, tokens and cost, and what Meta charged;
//! - `GET /admin/customers/{channel}/{id}?limit=&items_after=&replies_after=&country=`:
//!   everything held about a customer (`sabi export`), a page at a time (1,000 items and
//!   replies by default, 5,000 at most; `next` names the following page); a WhatsApp number
//!   as people write it, a local one with `country` (or `whatsapp.default_country`);
//! - `DELETE /admin/customers/{channel}/{id}?country=`: forget them (`sabi forget`); 409 with
//!   Retry-After while a turn or a send for them is under way.

use std::collections::HashMap;

use axum::Json;
use axum::extract::{Path, Query, Request, State};
use axum::http::{HeaderValue, header};
use axum::middleware::Next;
use axum::response::{Html, IntoResponse, Response};
use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::AppState;
use crate::billing;
use crate::clock::At;
use crate::domain::Channel;
use crate::domain::ReviewReason;
use crate::export;
use crate::ingress::ApiError;
use crate::store::{
    ConversationView, ExportPage, Resolution, ReviewEntry, ReviewQuery, ReviewState, Subject,
    forget_linked,
};

/// History turns shown with a review item or a conversation.
const TURNS_SHOWN: usize = 50;

/// Refuses any request without the admin token, before any data is read (its body
/// included: the refusal closes the connection, unread).
pub(super) async fn require_token(
    State(state): State<AppState>,
    request: Request,
    next: Next,
) -> Response {
    let allowed = state
        .admin
        .token
        .as_ref()
        .is_some_and(|expected| token_matches(bearer(&request), expected));
    if !allowed {
        let mut refused = ApiError::Unauthorized.into_response();
        refused
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
        return refused;
    }
    next.run(request).await
}

/// `/metrics` (volumes, spend, backlog) for the holder of `admin.metrics_token` only, when one
/// is set.
pub(super) async fn require_metrics_token(
    State(state): State<AppState>,
    request: Request,
    next: Next,
) -> Result<Response, ApiError> {
    if let Some(expected) = &state.admin.metrics_token
        && !token_matches(bearer(&request), expected)
    {
        return Err(ApiError::Unauthorized);
    }
    Ok(next.run(request).await)
}

fn bearer(request: &Request) -> &str {
    request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or_default()
}

/// Constant time whatever the lengths: the digests are compared, not the tokens.
fn token_matches(given: &str, expected: &SecretString) -> bool {
    let given = Sha256::digest(given.as_bytes());
    let expected = Sha256::digest(expected.expose_secret().as_bytes());
    bool::from(given.ct_eq(&expected))
}

#[derive(Debug, Deserialize)]
pub(super) struct ListQuery {
    reason: Option<String>,
    customer: Option<String>,
    limit: Option<usize>,
}

pub(super) async fn list(
    State(state): State<AppState>,
    Query(query): Query<ListQuery>,
) -> Result<Json<Value>, ApiError> {
    let limit = query.limit.unwrap_or(100).min(1000);
    // Read further than the page: folded repeats must not take the place of other items.
    let items = state
        .store
        .review_queue(ReviewQuery {
            reason: query.reason.as_deref().map(reason).transpose()?,
            customer: query.customer,
            limit: Some(limit.saturating_mul(FOLD_READ_AHEAD).min(5000)),
        })
        .await?;
    let mut shown = fold_repeats(&items);
    shown.truncate(limit);
    name_every_id(&state, &mut shown).await?;
    Ok(Json(
        json!({ "items": shown, "intents": state.admin.intents }),
    ))
}

/// Each WhatsApp item shown gains `ids`, every id Meta names its customer by (a number and a
/// BSUID): a person may know the customer by either. One read per customer shown.
async fn name_every_id(state: &AppState, shown: &mut [Value]) -> Result<(), ApiError> {
    let mut known: HashMap<String, Value> = HashMap::new();
    for entry in shown.iter_mut() {
        let (Some("whatsapp"), Some(customer)) =
            (entry["channel"].as_str(), entry["customer"].as_str())
        else {
            continue;
        };
        if !known.contains_key(customer) {
            let subject = Subject {
                channel: Channel::Whatsapp,
                customer: customer.to_owned(),
            };
            let ids = state.store.linked_ids(&subject).await?;
            known.insert(customer.to_owned(), json!(ids));
        }
        entry["ids"] = known[customer].clone();
    }
    Ok(())
}

fn reason(name: &str) -> Result<ReviewReason, ApiError> {
    ReviewReason::parse(name).ok_or_else(|| ApiError::Invalid {
        field: "reason",
        why: format!("no review reason is called {name:?}"),
    })
}

/// How many items are read per item shown, so that a flood folded into one leaves room.
const FOLD_READ_AHEAD: usize = 5;

/// The queue as the desk shows it: an anonymous visitor's open items from one address (an IPv6
/// client's /64), whatever their reason, fold into the first of them, which lists the others' ids in `repeats`, so that a flood of "a
/// person, please" from one script reads as one item. Each repeat stays open until a person
/// settles it: one address may be many people (a carrier's NAT, an office).
fn fold_repeats(items: &[ReviewEntry]) -> Vec<Value> {
    let mut shown: Vec<Value> = Vec::with_capacity(items.len());
    let mut first_of: HashMap<String, usize> = HashMap::new();
    for item in items {
        // Any reason: a script's questions that a model answers unfitly are a flood too.
        let address = (item.state == ReviewState::Open)
            .then(|| item.messages.first().and_then(|m| m.address.as_deref()))
            .flatten();
        // An IPv6 subscriber's whole /64 is one address, as for the buckets.
        let key = address.map(|a| {
            a.parse::<std::net::IpAddr>().map_or_else(
                |_| a.to_owned(),
                |ip| super::webchat::network(ip).to_string(),
            )
        });
        match key
            .as_ref()
            .and_then(|k| first_of.get(k).map(|&at| (k, at)))
        {
            Some((_, at)) => {
                if let Some(repeats) = shown[at]["repeats"].as_array_mut() {
                    repeats.push(json!(item.id));
                }
            }
            None => {
                let mut entry = review_json(item);
                if let (Some(address), Some(key)) = (address, key) {
                    entry["address"] = json!(address);
                    entry["repeats"] = json!([]);
                    first_of.insert(key, shown.len());
                }
                shown.push(entry);
            }
        }
    }
    shown
}

pub(super) async fn show(
    State(state): State<AppState>,
    Path(id): Path<i64>,
) -> Result<Json<Value>, ApiError> {
    let item = state
        .store
        .review_item(id)
        .await?
        .ok_or(ApiError::NotFound)?;
    let conversations = state
        .store
        .conversations(&item.conversation.customer, TURNS_SHOWN)
        .await?;
    let conversation = conversations
        .iter()
        .find(|c| c.conversation == item.conversation)
        .map(conversation_json);
    // Every id Meta names the customer by: a person may know them by another.
    let customer = Subject {
        channel: item.conversation.channel,
        customer: item.conversation.customer.clone(),
    };
    let ids = state.store.linked_ids(&customer).await?;
    Ok(Json(
        json!({ "item": review_json(&item), "conversation": conversation, "ids": ids }),
    ))
}

#[derive(Debug, Deserialize)]
pub(super) struct Reply {
    text: String,
}

pub(super) async fn reply(
    State(state): State<AppState>,
    Path(id): Path<i64>,
    Json(reply): Json<Reply>,
) -> Result<Json<Value>, ApiError> {
    let text = reply.text.trim();
    if text.is_empty() {
        return Err(ApiError::Invalid {
            field: "text",
            why: "must not be empty".into(),
        });
    }
    let resolution = Resolution::Reply {
        text: text.to_owned(),
        sandbox: state.admin.sandbox,
        hold: state.admin.human_hold,
        desk: None,
    };
    settle(&state, id, resolution).await
}

pub(super) async fn requeue(
    State(state): State<AppState>,
    Path(id): Path<i64>,
) -> Result<Json<Value>, ApiError> {
    settle(&state, id, Resolution::Requeue).await
}

pub(super) async fn close(
    State(state): State<AppState>,
    Path(id): Path<i64>,
) -> Result<Json<Value>, ApiError> {
    settle(&state, id, Resolution::Close).await
}

#[derive(Debug, Deserialize)]
pub(super) struct Label {
    intent: String,
}

/// A person's word on what the item's messages asked: kept with the turn, for
/// `sabi route --export-unsure` to hand to the router's next calibration. Settles nothing.
pub(super) async fn label(
    State(state): State<AppState>,
    Path(id): Path<i64>,
    Json(label): Json<Label>,
) -> Result<Json<Value>, ApiError> {
    if !state.admin.intents.contains(&label.intent) {
        return Err(ApiError::Invalid {
            field: "intent",
            why: match state.admin.intents.is_empty() {
                true => "cannot be given: the router is off".into(),
                false => format!("must be one of {}", state.admin.intents.join(", ")),
            },
        });
    }
    let item = state
        .store
        .review_item(id)
        .await?
        .ok_or(ApiError::NotFound)?;
    state.store.label_turn(item.batch_id, &label.intent).await?;
    Ok(Json(
        json!({ "id": id, "batch": item.batch_id, "label": label.intent }),
    ))
}

async fn settle(
    state: &AppState,
    id: i64,
    resolution: Resolution,
) -> Result<Json<Value>, ApiError> {
    let requeued = resolution == Resolution::Requeue;
    let now = state.clock.now();
    state.store.resolve_review(id, now, resolution).await?;
    // This node's workers look at once; other nodes find it at their next poll.
    state.outbox.notify_one();
    if requeued {
        state.wakeup.due_at(now);
    }
    let item = state
        .store
        .review_item(id)
        .await?
        .ok_or(ApiError::NotFound)?;
    Ok(Json(review_json(&item)))
}

#[derive(Debug, Deserialize)]
pub(super) struct CustomerQuery {
    customer: String,
}

pub(super) async fn conversations(
    State(state): State<AppState>,
    Query(query): Query<CustomerQuery>,
) -> Result<Json<Value>, ApiError> {
    let found = state
        .store
        .conversations(&query.customer, TURNS_SHOWN)
        .await?;
    Ok(Json(json!({
        "conversations": found.iter().map(conversation_json).collect::<Vec<_>>()
    })))
}

/// The customer a path names: `/admin/customers/{channel}/{id}`, a local number with
/// `?country=` or `whatsapp.default_country`.
fn subject(
    state: &AppState,
    channel: &str,
    id: &str,
    country: Option<&str>,
) -> Result<Subject, ApiError> {
    let channel = Channel::parse(channel).ok_or_else(|| ApiError::Invalid {
        field: "channel",
        why: "must be whatsapp or webchat".into(),
    })?;
    let country = country
        .map(country_code)
        .transpose()?
        .or_else(|| state.admin.default_country.clone());
    export::subject(channel, id, country.as_deref(), "?country=").map_err(|why| ApiError::Invalid {
        field: "customer",
        why,
    })
}

fn country_code(written: &str) -> Result<String, ApiError> {
    crate::phone::country_code(written).map_err(|why| ApiError::Invalid {
        field: "country",
        why,
    })
}

#[derive(Debug, Deserialize)]
pub(super) struct ExportQuery {
    limit: Option<usize>,
    items_after: Option<i64>,
    replies_after: Option<i64>,
    country: Option<String>,
}

#[derive(Debug, Deserialize)]
pub(super) struct ForgetQuery {
    country: Option<String>,
}

/// Items and replies in one page of an export, unless asked otherwise...
const EXPORT_PAGE: usize = 1000;
/// ...and at most: a customer with years of messages is read page by page, never whole.
const EXPORT_MAX_PAGE: usize = 5000;

/// A page of everything held about a customer; `next` names the following page's query
/// (`items_after`, `replies_after`), or is null on the last.
pub(super) async fn export_customer(
    State(state): State<AppState>,
    Path((channel, id)): Path<(String, String)>,
    Query(query): Query<ExportQuery>,
) -> Result<Json<Value>, ApiError> {
    let who = subject(&state, &channel, &id, query.country.as_deref())?;
    let page = ExportPage {
        items_after: query.items_after.unwrap_or(0),
        replies_after: query.replies_after.unwrap_or(0),
        limit: query.limit.unwrap_or(EXPORT_PAGE).clamp(1, EXPORT_MAX_PAGE),
    };
    // Paged under the customer's key, however the request named them.
    let ids = state.store.linked_ids(&who).await?;
    let keyed = Subject {
        channel: who.channel,
        customer: ids[0].clone(),
    };
    let record = state.store.export_page(&keyed, page).await?;
    let mut document = export::record_json(&keyed, &record);
    document["ids"] = json!(ids);
    document["next"] = page.next(&record).map_or(Value::Null, |next| {
        json!({
            "items_after": next.items_after,
            "replies_after": next.replies_after,
            "limit": next.limit,
        })
    });
    Ok(Json(document))
}

pub(super) async fn forget_customer(
    State(state): State<AppState>,
    Path((channel, id)): Path<(String, String)>,
    Query(query): Query<ForgetQuery>,
) -> Result<Json<Value>, ApiError> {
    let who = subject(&state, &channel, &id, query.country.as_deref())?;
    let erased = forget_linked(state.store.as_ref(), &who, state.clock.now()).await?;
    tracing::info!(
        channel = who.channel.as_str(),
        removed = erased.total(),
        "a customer was forgotten"
    );
    Ok(Json(json!({"customer": who.customer, "erased": erased})))
}

#[derive(Debug, Deserialize)]
pub(super) struct StatsQuery {
    #[serde(rename = "since_ms")]
    since: Option<At>,
}

pub(super) async fn stats(
    State(state): State<AppState>,
    Query(query): Query<StatsQuery>,
) -> Result<Json<Value>, ApiError> {
    let since = query.since.unwrap_or_default();
    let s = state.store.turn_stats(since).await?;
    let priced = state.store.price_counts(since).await?;
    Ok(Json(json!({
        "local": s.local,
        "agent": s.agent,
        "people": s.people,
        "prompt_tokens": s.prompt_tokens,
        "completion_tokens": s.completion_tokens,
        "cost": s.cost,
        "whatsapp": billing::bill(&priced, &state.admin.message_prices),
    })))
}

/// Every admin path while no token is configured: the API is off, and the answer says how to
/// turn it on.
pub(super) async fn disabled() -> ApiError {
    ApiError::AdminDisabled
}

/// The review desk: a page that lists the queue with a reply box.
pub(super) async fn desk() -> Html<&'static str> {
    Html(include_str!("desk.html"))
}

/// A review item as people read it (the admin API and `sabi review --json`).
pub fn review_json(item: &ReviewEntry) -> Value {
    let c = &item.conversation;
    json!({
        "id": item.id,
        "state": item.state,
        "reason": item.reason,
        "error": item.error,
        "channel": c.channel.as_str(),
        "business_number": c.business,
        "customer": c.customer,
        "batch": item.batch_id,
        "outbox_id": item.outbox_id,
        "created_at_ms": item.created_at,
        "messages": item.messages.iter().map(|m| json!({
            "id": m.external_id,
            "type": m.item_type,
            "text": m.text,
            "sent_at_ms": m.sent_at(),
        })).collect::<Vec<_>>(),
    })
}

/// A conversation and its history as people read it.
pub fn conversation_json(view: &ConversationView) -> Value {
    let c = &view.conversation;
    json!({
        "channel": c.channel.as_str(),
        "business_number": c.business,
        "customer": c.customer,
        "last_inbound_at_ms": view.last_inbound_at,
        "history": view.history.iter().map(|h| json!({
            "speaker": h.speaker.as_str(),
            "text": h.text,
            "at_ms": h.at,
        })).collect::<Vec<_>>(),
    })
}
