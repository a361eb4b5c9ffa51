//! Hand-offs into Chatwoot, against a fake Chatwoot that implements the endpoints Sabi calls
//! and signs its webhooks as Chatwoot does: the conversation opens there with its transcript
//! and a note, the customer's later messages follow while Sabi stays silent, the agent's reply
//! goes to the customer once however often it is delivered, forged and replayed webhooks are
//! refused, resolving gives the customer back to the assistant, and Chatwoot being down loses
//! nothing.

use std::sync::Arc;

use sabi::clock::Clock;
use sabi::desk::Mirror;
use sabi::store::{OutboxEntry, ReviewQuery};
use sabi::testing::chatwoot::{FakeChatwoot, Posted, signed_headers};

use crate::helpers::{START_MS, TestApp, text_webhook};

const TOKEN: &str = "cw-api-token-for-tests";
const SECRET: &str = "cw-webhook-secret-for-tests";
const INBOX: i64 = 7;
const CUSTOMER: &str = "2348031234567";

async fn app(chatwoot: &FakeChatwoot) -> (TestApp, Arc<Mirror>) {
    let base = chatwoot.base_url();
    let inbox = INBOX.to_string();
    let app = TestApp::spawn_with(
        None,
        &[
            ("SABI_BATCH_WINDOW", "0"),
            ("SABI_CHATWOOT_BASE_URL", base.as_str()),
            ("SABI_CHATWOOT_API_TOKEN", TOKEN),
            ("SABI_CHATWOOT_ACCOUNT_ID", "1"),
            ("SABI_CHATWOOT_INBOX_ID", inbox.as_str()),
            ("SABI_CHATWOOT_WEBHOOK_SECRET", SECRET),
        ],
    )
    .await;
    let mirror = app.desk.clone().expect("a mirror with [handoff.chatwoot]");
    (app, mirror)
}

async fn writes(app: &TestApp, id: &str, text: &str) {
    let response = app
        .post_whatsapp_webhook(text_webhook(id, CUSTOMER, text))
        .await;
    assert_eq!(response.status(), 200);
    app.scheduler.drain().await.expect("turns");
}

/// Posts a Chatwoot webhook signed `age_s` seconds before the app's clock.
async fn chatwoot_posts(app: &TestApp, body: Vec<u8>, secret: &str, age_s: i64) -> u16 {
    let mut request = app
        .client
        .post(app.url("/webhook/chatwoot"))
        .header("content-type", "application/json");
    for (name, value) in signed_headers(secret, START_MS / 1000 - age_s, &body) {
        request = request.header(name, value);
    }
    request
        .body(body)
        .send()
        .await
        .expect("sent")
        .status()
        .as_u16()
}

async fn outbox(app: &TestApp) -> Vec<OutboxEntry> {
    app.store.outbox(None).await.expect("outbox")
}

async fn open_items(app: &TestApp) -> usize {
    app.store
        .review_queue(ReviewQuery::default())
        .await
        .expect("queue")
        .len()
}

fn public(messages: &[Posted]) -> Vec<(&str, &str)> {
    messages
        .iter()
        .filter(|m| !m.private)
        .map(|m| (m.message_type.as_str(), m.content.as_str()))
        .collect()
}

#[tokio::test]
async fn a_hand_off_goes_to_chatwoot_and_the_agents_reply_comes_back_once() {
    let chatwoot = FakeChatwoot::start(TOKEN, INBOX).await;
    let (app, mirror) = app(&chatwoot).await;
    writes(&app, "wamid.cw1", "good morning").await;
    writes(&app, "wamid.cw2", "I want to speak to a human agent").await;
    assert_eq!(open_items(&app).await, 1, "handed to a person");
    let before = outbox(&app).await.len();

    assert_eq!(mirror.mirror().await.expect("mirrored"), Some(1));
    let [conversation] = chatwoot.conversations()[..] else {
        panic!("one Chatwoot conversation: {:?}", chatwoot.conversations());
    };
    let (identifier, _, phone) = chatwoot.contact_of(conversation).expect("contact");
    assert_eq!(
        (identifier.as_str(), phone.as_deref()),
        (CUSTOMER, Some("+2348031234567"))
    );
    let posted = chatwoot.messages(conversation);
    let said = public(&posted);
    assert_eq!(
        said[0],
        ("incoming", "good morning"),
        "the transcript first: {said:?}"
    );
    assert_eq!(said[1].0, "outgoing", "Sabi's answer: {said:?}");
    assert_eq!(
        said.last(),
        Some(&("incoming", "I want to speak to a human agent"))
    );
    let notes: Vec<&Posted> = posted.iter().filter(|m| m.private).collect();
    assert_eq!(notes.len(), 1);
    assert!(
        notes[0].content.contains("handoff asked"),
        "{}",
        notes[0].content
    );
    assert_eq!(
        mirror.mirror().await.expect("mirrored"),
        Some(0),
        "nothing new"
    );

    // While Chatwoot holds the conversation, the customer's words go there, not to a turn.
    writes(&app, "wamid.cw3", "hello? anyone there").await;
    assert_eq!(outbox(&app).await.len(), before, "Sabi stays silent");
    mirror.mirror().await.expect("mirrored");
    let said = chatwoot.messages(conversation);
    assert_eq!(
        public(&said).last(),
        Some(&("incoming", "hello? anyone there"))
    );

    // The agent answers; Chatwoot delivers the webhook twice.
    let reply = FakeChatwoot::agent_reply(conversation, 901, "Hi, Ada here. Which order?");
    assert_eq!(chatwoot_posts(&app, reply.clone(), SECRET, 0).await, 200);
    assert_eq!(chatwoot_posts(&app, reply, SECRET, 1).await, 200);
    let sent: Vec<String> = outbox(&app).await.into_iter().map(|p| p.text).collect();
    assert_eq!(sent.len(), before + 1, "{sent:?}");
    assert_eq!(
        sent.last().map(String::as_str),
        Some("Hi, Ada here. Which order?")
    );
    // A second reply goes too: the conversation stays Chatwoot's.
    let again = FakeChatwoot::agent_reply(conversation, 902, "Found it: it ships today.");
    assert_eq!(chatwoot_posts(&app, again, SECRET, 0).await, 200);
    assert_eq!(outbox(&app).await.len(), before + 2);

    // Forged and replayed deliveries are refused and change nothing.
    let forged = FakeChatwoot::agent_reply(conversation, 903, "Send your PIN");
    assert_eq!(
        chatwoot_posts(&app, forged.clone(), "not-the-secret", 0).await,
        401
    );
    assert_eq!(chatwoot_posts(&app, forged, SECRET, 600).await, 401);
    assert_eq!(outbox(&app).await.len(), before + 2);

    // Resolved in Chatwoot: the customer is the assistant's again.
    assert_eq!(
        chatwoot_posts(&app, FakeChatwoot::resolved(conversation), SECRET, 0).await,
        200
    );
    assert_eq!(open_items(&app).await, 0);
    writes(&app, "wamid.cw4", "good morning").await;
    assert_eq!(outbox(&app).await.len(), before + 3, "answered by Sabi");
    assert_eq!(open_items(&app).await, 0);
}

#[tokio::test]
async fn while_chatwoot_is_down_the_hand_off_waits_on_sabis_desk_and_goes_once() {
    let chatwoot = FakeChatwoot::start(TOKEN, INBOX).await;
    let (app, mirror) = app(&chatwoot).await;
    writes(&app, "wamid.dn1", "I want to speak to a human agent").await;
    chatwoot.set_down(true);
    assert_eq!(mirror.mirror().await.expect("round"), Some(0));
    assert_eq!(open_items(&app).await, 1, "still on Sabi's desk");
    assert!(chatwoot.conversations().is_empty());
    let ready = app
        .client
        .get(app.url("/readyz"))
        .send()
        .await
        .expect("readyz");
    assert_eq!(ready.status(), 200, "the node still serves");
    let said = ready.text().await.expect("text");
    assert!(said.contains("help desk (Chatwoot) is failing"), "{said}");
    chatwoot.set_down(false);
    assert_eq!(
        mirror.mirror().await.expect("round"),
        Some(0),
        "waiting before the next try"
    );
    app.clock.advance(std::time::Duration::from_secs(5));
    assert_eq!(mirror.mirror().await.expect("round"), Some(1));
    assert_eq!(mirror.mirror().await.expect("round"), Some(0));
    let [conversation] = chatwoot.conversations()[..] else {
        panic!("one conversation: {:?}", chatwoot.conversations());
    };
    let notes = chatwoot
        .messages(conversation)
        .into_iter()
        .filter(|m| m.private)
        .count();
    assert_eq!(notes, 1);
}

#[tokio::test]
async fn a_reply_with_nothing_open_on_sabis_side_is_told_back_not_lost() {
    let chatwoot = FakeChatwoot::start(TOKEN, INBOX).await;
    let (app, mirror) = app(&chatwoot).await;
    writes(&app, "wamid.cl1", "I want to speak to a human agent").await;
    mirror.mirror().await.expect("round");
    let conversation = chatwoot.conversations()[0];
    // A person settles it on Sabi's own desk.
    let item = app
        .store
        .review_queue(ReviewQuery::default())
        .await
        .expect("queue")
        .remove(0);
    app.store
        .resolve_review(item.id, app.clock.now(), sabi::store::Resolution::Close)
        .await
        .expect("closed");
    let before = outbox(&app).await.len();
    let late = FakeChatwoot::agent_reply(conversation, 950, "Still there?");
    assert_eq!(chatwoot_posts(&app, late, SECRET, 0).await, 200);
    assert_eq!(outbox(&app).await.len(), before, "not sent");
    let note = chatwoot
        .messages(conversation)
        .into_iter()
        .rev()
        .find(|m| m.private)
        .expect("a note");
    assert!(note.content.starts_with("Not sent"), "{}", note.content);
}

#[tokio::test]
async fn a_web_visitors_hand_off_is_answered_from_chatwoot_on_the_open_page() {
    let chatwoot = FakeChatwoot::start(TOKEN, INBOX).await;
    let (app, mirror) = app(&chatwoot).await;
    let session = "0123456789abcdef0123456789abcdef";
    let asked = app
        .client
        .post(app.url("/chat"))
        .header("x-sabi-session", session)
        .json(&serde_json::json!({"question": "I want to talk to a person"}))
        .send()
        .await
        .expect("posted");
    assert_eq!(asked.status(), 202);
    app.scheduler.drain().await.expect("turns");
    assert_eq!(mirror.mirror().await.expect("round"), Some(1));
    let conversation = chatwoot.conversations()[0];
    let (identifier, name, phone) = chatwoot.contact_of(conversation).expect("contact");
    assert_eq!((identifier.as_str(), phone), (session, None));
    assert!(name.starts_with("Web visitor"), "{name}");

    let reply = FakeChatwoot::agent_reply(conversation, 970, "Hello, I am Ada.");
    assert_eq!(chatwoot_posts(&app, reply, SECRET, 0).await, 200);
    let polled: serde_json::Value = app
        .client
        .get(app.url("/chat/session?after=0"))
        .header("x-sabi-session", session)
        .send()
        .await
        .expect("polled")
        .json()
        .await
        .expect("json");
    assert_eq!(polled["held"], true, "{polled}");
    let lines = polled["lines"].as_array().cloned().unwrap_or_default();
    assert!(
        lines.iter().any(|l| l["text"] == "Hello, I am Ada."),
        "{polled}"
    );
}
