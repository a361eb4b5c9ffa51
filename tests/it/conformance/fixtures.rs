//! What the role cases share: a turn that wrote reply parts, a sender's claim and its outcome,
//! a status webhook as the parser gives it, and the outbox row or review item to look at.

use std::sync::Arc;
use std::time::Duration;

use sabi::clock::{At, UnixSeconds};
use sabi::domain::{Channel, ConversationKey, InboundItem, ItemKind, ReplyPart};
use sabi::store::{
    Ending, IngestReceipt, OutboxEntry, ReviewEntry, ReviewQuery, SendClaim, SendJob, SendResult,
    Store,
};

use super::{POLICY, ingest, message};

use crate::helpers::ms;

/// How long a claimed send is held, and how long an unknown outcome waits for a status.
pub const LEASE: Duration = Duration::from_millis(10_000);
pub const WAIT: Duration = Duration::from_millis(60_000);

/// The business number `message` writes to, and a second one, for what is halted or skipped per
/// number.
pub const BUSINESS: &str = "100000000000001";
pub const OTHER_BUSINESS: &str = "100000000000002";

/// A customer's message to `business`, as the parser gives it.
pub fn message_to(business: &str, id: &str, customer: &str, text: &str, at: At) -> InboundItem {
    InboundItem {
        business: Some(business.into()),
        turn: Some(ConversationKey {
            channel: Channel::Whatsapp,
            business: business.into(),
            customer: customer.into(),
        }),
        ..message(id, customer, text, at)
    }
}

/// A voice note: no text until a transcript is kept.
pub fn voice(id: &str, customer: &str, at: At) -> InboundItem {
    InboundItem {
        item_type: Some("audio".into()),
        text: None,
        media_id: Some(format!("media-{id}")),
        ..message(id, customer, "", at)
    }
}

/// `item` written earlier (its message arrived a cap ago), claimed alone and ended with
/// `ending` at `at`: the batch's id.
pub async fn turn(store: &Arc<dyn Store>, item: InboundItem, at: At, ending: Ending) -> i64 {
    ingest(store, vec![item], at - POLICY.cap).await;
    let claims = store.claim(at, ms(60_000), 10, None).await.expect("claim");
    assert_eq!(claims.len(), 1, "one turn due");
    let batch = claims[0].batch.id;
    store
        .finish(batch, claims[0].token, at, ending)
        .await
        .expect("finish");
    batch
}

/// A turn of `customer` that replied with `parts` at `at`, queued for sending: their outbox ids.
pub async fn replied(store: &Arc<dyn Store>, customer: &str, parts: &[&str], at: At) -> Vec<i64> {
    let item = message(&format!("wamid.in-{customer}-{at}"), customer, "hi", at);
    replied_to(store, item, parts, at).await
}

/// A turn that answered `item` with `parts` at `at`: their outbox ids.
pub async fn replied_to(
    store: &Arc<dyn Store>,
    item: InboundItem,
    parts: &[&str],
    at: At,
) -> Vec<i64> {
    let ending = Ending::Replied {
        parts: parts.iter().map(|p| ReplyPart::text(*p)).collect(),
        sandbox: false,
    };
    let batch = turn(store, item, at, ending).await;
    let outbox = store.outbox(None).await.expect("outbox");
    outbox
        .iter()
        .filter(|e| e.batch_id == batch)
        .map(|e| e.id)
        .collect()
}

pub fn sends(now: At) -> SendClaim {
    SendClaim {
        now,
        lease: LEASE,
        unknown_wait: WAIT,
        limit: 100,
        halted: Vec::new(),
    }
}

/// What a sender claims at `now` and sends at once (each part departs), by part id.
pub async fn claim_sends(store: &Arc<dyn Store>, now: At) -> Vec<SendJob> {
    let mut jobs = store
        .claim_sends(sends(now))
        .await
        .expect("claim sends")
        .jobs;
    jobs.sort_by_key(|j| j.id);
    for job in &jobs {
        depart(store, job, now).await;
    }
    jobs
}

/// The claimed `job` took its pacing slot: its request leaves at `now`.
pub async fn depart(store: &Arc<dyn Store>, job: &SendJob, now: At) {
    store
        .depart(job.id, job.attempt, now, LEASE)
        .await
        .expect("departed");
}

/// Claims at `now` and expects exactly part `id`.
pub async fn claim_only(store: &Arc<dyn Store>, id: i64, now: At) -> SendJob {
    let jobs = claim_sends(store, now).await;
    let ids: Vec<i64> = jobs.iter().map(|j| j.id).collect();
    assert_eq!(ids, [id], "claimed at {now}");
    jobs.into_iter().next().expect("one job")
}

/// Records that Meta took the send as `wamid`; the recipient's next part may go at once.
pub async fn accept(store: &Arc<dyn Store>, job: &SendJob, wamid: &str, now: At) {
    let accepted = SendResult::Accepted {
        wamid: wamid.into(),
        template: job.window_closed,
        next_send_at: now,
    };
    store
        .record_send(job.id, job.attempt, now, accepted)
        .await
        .expect("accepted");
}

/// Meta's status `delivery` of the message `wamid`, as the parser gives it (its dedupe key is
/// `<wamid>:<status>`, its facts what the store reads).
pub fn status(wamid: &str, delivery: &str, at: At) -> InboundItem {
    InboundItem {
        kind: ItemKind::Status,
        channel: Channel::Whatsapp,
        dedupe_key: format!("{wamid}:{delivery}"),
        business: Some(BUSINESS.into()),
        customer: None,
        item_type: Some(delivery.into()),
        text: None,
        media_id: None,
        provider_ts: Some(UnixSeconds(at.unix_seconds())),
        turn: None,
        facts: serde_json::json!({
            "kind": "status",
            "id": wamid,
            "status": delivery,
            "timestamp": at,
            "error_codes": [],
            "biz_opaque_callback_data": null,
        }),
    }
}

/// Meta's `user_preferences` webhook, as the parser gives it: `customer` stopped (`"stop"`) or
/// resumed (`"resume"`) marketing messages at `at`.
pub fn preference(customer: &str, value: &str, at: At) -> InboundItem {
    let value = serde_json::json!({
        "messaging_product": "whatsapp",
        "user_preferences": [{
            "wa_id": customer,
            "detail": "User requested to change marketing messages",
            "category": "marketing_messages",
            "value": value,
            "timestamp": at.unix_seconds(),
        }],
    });
    InboundItem {
        kind: ItemKind::FieldEvent,
        channel: Channel::Whatsapp,
        dedupe_key: format!("field:{customer}:{value}:{}", at.millis()),
        business: None,
        customer: None,
        item_type: Some("user_preferences".into()),
        text: None,
        media_id: None,
        provider_ts: None,
        turn: None,
        facts: serde_json::json!({
            "kind": "field_event",
            "field": "user_preferences",
            "event": null,
            "value": value,
        }),
    }
}

/// Meta's `message_template_status_update` webhook for a template, as the parser gives it.
pub fn template_status(name: &str, language: &str, event: &str, at: At) -> InboundItem {
    let value = serde_json::json!({
        "event": event,
        "message_template_id": 1_689_556_908_120_042_i64,
        "message_template_name": name,
        "message_template_language": language,
        "reason": "NONE",
        "message_template_category": "MARKETING",
    });
    InboundItem {
        kind: ItemKind::FieldEvent,
        channel: Channel::Whatsapp,
        dedupe_key: format!("field:{name}:{language}:{event}:{}", at.millis()),
        business: None,
        customer: None,
        item_type: Some("message_template_status_update".into()),
        text: None,
        media_id: None,
        provider_ts: Some(UnixSeconds(at.unix_seconds())),
        turn: None,
        facts: serde_json::json!({
            "kind": "field_event",
            "field": "message_template_status_update",
            "event": event,
            "value": value,
        }),
    }
}

/// The status naming a send by its callback data (the send's answer was lost).
pub fn with_callback(mut item: InboundItem, callback: String) -> InboundItem {
    item.facts["biz_opaque_callback_data"] = callback.into();
    item
}

/// A failure status with Meta's error code.
pub fn with_code(mut item: InboundItem, code: i64) -> InboundItem {
    item.facts["error_codes"] = serde_json::json!([code]);
    item
}

/// The same status delivered again under a key of its own.
pub fn rekeyed(mut item: InboundItem, key: &str) -> InboundItem {
    item.dedupe_key = key.into();
    item
}

pub async fn deliver(store: &Arc<dyn Store>, item: InboundItem, at: At) -> IngestReceipt {
    ingest(store, vec![item], at).await
}

/// Outbox row `id` as the store has it now.
pub async fn part(store: &Arc<dyn Store>, id: i64) -> OutboxEntry {
    let outbox = store.outbox(None).await.expect("outbox");
    outbox
        .into_iter()
        .find(|e| e.id == id)
        .expect("the part is in the outbox")
}

/// Open review items, oldest first.
pub async fn open_reviews(store: &Arc<dyn Store>) -> Vec<ReviewEntry> {
    store
        .review_queue(ReviewQuery::default())
        .await
        .expect("review queue")
}
