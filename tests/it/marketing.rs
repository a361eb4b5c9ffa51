//! Meta's Marketing Messages API end to end: Sabi whole against the fake Graph API. With
//! `whatsapp.marketing_messages` on, a MARKETING template goes to `/marketing_messages` (with
//! the configured time-to-live) and Meta prices it `marketing_lite`; off, or for any other
//! category, to `/messages`. The category comes from Meta's template list and moves with its
//! `template_category_update` webhook. On the store `SABI_TEST_STORE` names (SQLite by default).

use std::sync::Arc;

use sabi::clock::{Clock, SystemClock};
use sabi::domain::ItemKind;
use sabi::store::{BroadcastView, InboxQuery, NewBroadcast, NewRecipient, TemplateCategory};
use sabi::testing::graph::Received;

use crate::helpers::{PATIENCE, eventually_seen};
use crate::sender::{Parts, Sending};

const ACCOUNT: &str = "240011223344556";
const TEMPLATE: &str = "diwali_offer";

fn broadcast(key: &str, first: usize, count: usize) -> NewBroadcast {
    let now = SystemClock.now();
    NewBroadcast {
        key: Some(key.into()),
        name: key.into(),
        template: TEMPLATE.into(),
        language: "en".into(),
        business: "100000000000001".into(),
        now,
        start_at: now,
        until: None,
        rate: 50,
        body: None,
        hours: None,
        recipients: (first..first + count)
            .map(|n| NewRecipient {
                to: format!("23480700000{n:02}"),
                params: vec![format!("Customer {n}")],
                line: Some(n as u64 + 2),
                skipped: None,
                tz: None,
            })
            .collect(),
    }
}

/// Sabi sending broadcasts, with the business account set so that it reads template
/// categories from Meta, and `extra` settings.
async fn start(extra: &[(&str, &str)]) -> Sending {
    let mut env = vec![("SABI_WHATSAPP_BUSINESS_ACCOUNT_ID", ACCOUNT)];
    env.extend_from_slice(extra);
    Sending::start(Arc::new(Parts(1)), &env).await
}

const ON: (&str, &str) = ("SABI_WHATSAPP_MARKETING_MESSAGES", "true");

/// Creates the broadcast and waits until none of its recipients waits or is being sent.
async fn send(sabi: &Sending, b: NewBroadcast) -> BroadcastView {
    let (b, _) = sabi.store.create_broadcast(b).await.expect("kept");
    sabi.broadcast_when(b.id, PATIENCE, |now| {
        now.counts["queued"] + now.counts["sending"] == 0
    })
    .await
}

/// The template sends the fake took, for the broadcast's recipients from `first`.
/// The requests `/marketing_messages` refused.
fn refusals(sabi: &Sending) -> usize {
    sabi.fake
        .received()
        .into_iter()
        .filter(|r| r.marketing && r.wamid.is_none())
        .count()
}

fn taken(sabi: &Sending, first: usize, count: usize) -> Vec<Received> {
    let to: Vec<String> = (first..first + count)
        .map(|n| format!("23480700000{n:02}"))
        .collect();
    sabi.fake
        .accepted()
        .into_iter()
        .filter(|r| r.body["type"] == "template")
        .filter(|r| r.recipient().is_some_and(|t| to.iter().any(|x| x == t)))
        .collect()
}

fn category_webhook(previous: &str, new: &str) -> Vec<u8> {
    let body = serde_json::json!({
        "object": "whatsapp_business_account",
        "entry": [{"id": ACCOUNT, "time": SystemClock.now().unix_seconds(),
            "changes": [{"field": "template_category_update", "value": {
                "message_template_id": 1_689_556_908_120_042_i64,
                "message_template_name": TEMPLATE, "message_template_language": "en",
                "previous_category": previous, "new_category": new}}]}],
    });
    sabi::whatsapp::wire::encode(&body).into_bytes()
}

/// With the setting on, a MARKETING template goes to `/marketing_messages` with its
/// time-to-live, Meta prices it `marketing_lite`, and the report counts it so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_marketing_broadcast_goes_to_the_marketing_messages_api_priced_marketing_lite() {
    let sabi = start(&[ON, ("SABI_WHATSAPP_MESSAGE_SEND_TTL_SECONDS", "86400")]).await;
    sabi.fake.send_statuses(true);
    sabi.fake.add_template_of(
        "MARKETING",
        TEMPLATE,
        "en",
        "APPROVED",
        "Happy Diwali, {{1}}!",
    );
    let b = send(&sabi, broadcast("diwali-eve", 0, 6)).await;
    let took = b.counts["accepted"] + b.counts["delivered"] + b.counts["read"];
    assert_eq!(took, 6, "{b:?}");
    let sent = taken(&sabi, 0, 6);
    assert_eq!(sent.len(), 6, "each once");
    for r in &sent {
        assert!(r.marketing, "to /marketing_messages: {:?}", r.body);
        assert_eq!(r.body["message_send_ttl_seconds"], 86_400);
    }
    let kept = sabi
        .store
        .template_category(TEMPLATE, "en")
        .await
        .expect("read");
    assert_eq!(kept.as_deref(), Some("MARKETING"), "kept from Meta's list");

    // Meta's delivered statuses price each message marketing_lite.
    let report = eventually_seen("every message priced", PATIENCE, || async {
        let prices = sabi::broadcast::report::Prices {
            by_prefix: &[("234".to_owned(), 0.05)].into_iter().collect(),
            currency: "USD",
        };
        let report = sabi::broadcast::report::report(sabi.store.as_ref(), b.id, &prices)
            .await
            .expect("read")
            .expect("kept");
        if report.cost.awaiting_pricing == 0 {
            Ok(report)
        } else {
            Err(format!("{report:?}"))
        }
    })
    .await;
    let lite = &report.cost.by_category["marketing_lite"];
    assert_eq!(lite.messages, 6, "{:?}", report.cost);
    assert!((lite.cost - 0.30).abs() < 1e-9, "{:?}", report.cost);
    assert!(!report.cost.by_category.contains_key("marketing"));
    let recipients = sabi
        .store
        .broadcast_recipients(b.id, None, 10)
        .await
        .expect("read");
    assert!(
        recipients
            .iter()
            .all(|r| r.pricing.as_deref() == Some("marketing_lite")),
        "{recipients:?}"
    );
}

/// Off (the default, until a business accepts Meta's terms), the same template goes to
/// `/messages` and is priced `marketing`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_setting_off_a_marketing_broadcast_goes_to_messages() {
    let sabi = start(&[]).await;
    sabi.fake.add_template_of(
        "MARKETING",
        TEMPLATE,
        "en",
        "APPROVED",
        "Happy Diwali, {{1}}!",
    );
    let b = send(&sabi, broadcast("diwali-eve", 0, 4)).await;
    assert_eq!(b.counts["accepted"], 4, "{b:?}");
    let sent = taken(&sabi, 0, 4);
    assert_eq!(sent.len(), 4);
    assert!(sent.iter().all(|r| !r.marketing), "all to /messages");
    assert!(
        sent.iter()
            .all(|r| r.body.get("message_send_ttl_seconds").is_none())
    );
}

/// With the setting on, a UTILITY template goes to `/messages`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_utility_template_goes_to_messages() {
    let sabi = start(&[ON]).await;
    sabi.fake.add_template_of(
        "UTILITY",
        TEMPLATE,
        "en",
        "APPROVED",
        "Your order {{1}} ships today",
    );
    let b = send(&sabi, broadcast("orders", 0, 4)).await;
    assert_eq!(b.counts["accepted"], 4, "{b:?}");
    let sent = taken(&sabi, 0, 4);
    assert_eq!(sent.len(), 4);
    assert!(sent.iter().all(|r| !r.marketing), "all to /messages");
    let kept = sabi
        .store
        .template_category(TEMPLATE, "en")
        .await
        .expect("read");
    assert_eq!(kept.as_deref(), Some("UTILITY"));
}

/// Meta recategorises the template: an impending change moves nothing, the completed one moves
/// the next broadcast's sends to `/marketing_messages`, and back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_template_category_update_changes_where_the_next_send_goes() {
    let sabi = start(&[ON]).await;
    sabi.fake.add_template_of(
        "UTILITY",
        TEMPLATE,
        "en",
        "APPROVED",
        "Your order {{1}} ships today",
    );
    send(&sabi, broadcast("first", 0, 3)).await;
    assert!(taken(&sabi, 0, 3).iter().all(|r| !r.marketing));

    let impending = serde_json::json!({
        "object": "whatsapp_business_account",
        "entry": [{"id": ACCOUNT, "time": SystemClock.now().unix_seconds(),
            "changes": [{"field": "template_category_update", "value": {
                "message_template_name": TEMPLATE, "message_template_language": "en",
                "correct_category": "MARKETING", "new_category": "UTILITY",
                "category_update_timestamp": SystemClock.now().unix_seconds() + 86_400}}]}],
    });
    sabi.post_webhook(sabi::whatsapp::wire::encode(&impending).into_bytes())
        .await;
    let kept = sabi
        .store
        .template_category(TEMPLATE, "en")
        .await
        .expect("read");
    assert_eq!(
        kept.as_deref(),
        Some("UTILITY"),
        "an impending change moves nothing"
    );

    sabi.fake.recategorise(TEMPLATE, "MARKETING");
    sabi.post_webhook(category_webhook("UTILITY", "MARKETING"))
        .await;
    let kept = sabi
        .store
        .template_category(TEMPLATE, "en")
        .await
        .expect("read");
    assert_eq!(kept.as_deref(), Some("MARKETING"));
    let messages = InboxQuery {
        kind: Some(ItemKind::Message),
        ..InboxQuery::default()
    };
    let messages = sabi.store.inbox(messages).await.expect("inbox");
    assert!(
        messages.is_empty(),
        "a category change is no customer's message: {messages:?}"
    );
    let b = send(&sabi, broadcast("second", 10, 3)).await;
    assert_eq!(b.counts["accepted"], 3, "{b:?}");
    let sent = taken(&sabi, 10, 3);
    assert_eq!(sent.len(), 3);
    assert!(
        sent.iter().all(|r| r.marketing),
        "now to /marketing_messages"
    );

    sabi.fake.recategorise(TEMPLATE, "UTILITY");
    sabi.post_webhook(category_webhook("MARKETING", "UTILITY"))
        .await;
    send(&sabi, broadcast("third", 20, 3)).await;
    assert!(
        taken(&sabi, 20, 3).iter().all(|r| !r.marketing),
        "back to /messages"
    );
}

/// Sabi believes a template MARKETING but Meta does not take it there (131055): nothing was
/// sent, so each goes through `/messages` at once, and nobody is lost or sent twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_template_the_marketing_messages_api_refuses_goes_through_messages() {
    let sabi = start(&[ON]).await;
    sabi.fake.add_template_of(
        "UTILITY",
        TEMPLATE,
        "en",
        "APPROVED",
        "Your order {{1}} ships today",
    );
    let stale = TemplateCategory::new(TEMPLATE, "en", "MARKETING", SystemClock.now());
    sabi.store.keep_category(stale).await.expect("kept");
    let b = send(&sabi, broadcast("stale", 0, 12)).await;
    assert_eq!(b.counts["accepted"], 12, "{b:?}");
    let refused = refusals(&sabi);
    // The refusal is remembered: only sends already under way when it came are refused too.
    assert!((1..12).contains(&refused), "{refused} refusals");
    let sent = taken(&sabi, 0, 12);
    assert_eq!(sent.len(), 12, "each once");
    assert!(sent.iter().all(|r| !r.marketing));
}

/// Meta has not finished syncing a new marketing template (131009 on `/marketing_messages`):
/// the recipient is tried again after the usual wait, and gets it once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_template_not_yet_synced_for_marketing_is_tried_again() {
    let sabi = start(&[ON]).await;
    sabi.fake.add_template_of(
        "MARKETING",
        TEMPLATE,
        "en",
        "APPROVED",
        "Happy Diwali, {{1}}!",
    );
    sabi.fake.fail_next(&[(400, 131_009)]);
    let b = send(&sabi, broadcast("new-template", 0, 3)).await;
    assert_eq!(b.counts["accepted"], 3, "{b:?}");
    let refused = refusals(&sabi);
    assert_eq!(refused, 1, "one refusal");
    let sent = taken(&sabi, 0, 3);
    assert_eq!(sent.len(), 3, "each once");
    assert!(sent.iter().all(|r| r.marketing));
}
