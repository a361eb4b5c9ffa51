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
use sabi::testing::graph::FakeGraph;
use serde_json::json;

use crate::helpers::{START_MS, TestApp, text_webhook};

const TOKEN: &str = "cw-api-token-for-tests";
const SECRET: &str = "cw-webhook-secret-for-tests";
const INBOX: i64 = 7;
const CUSTOMER: &str = "2348031234567";

async fn app(chatwoot: &FakeChatwoot) -> (TestApp, Arc<Mirror>) {
    app_with(chatwoot, &[]).await
}

async fn app_with(chatwoot: &FakeChatwoot, more: &[(&str, &str)]) -> (TestApp, Arc<Mirror>) {
    let base = chatwoot.base_url();
    let inbox = INBOX.to_string();
    let mut env = vec![
        ("SABI_BATCH_WINDOW", "0"),
        ("SABI_CHATWOOT_BASE_URL", base.as_str()),
        ("SABI_CHATWOOT_API_TOKEN", TOKEN),
        ("SABI_CHATWOOT_ACCOUNT_ID", "1"),
        ("SABI_CHATWOOT_INBOX_ID", inbox.as_str()),
        ("SABI_CHATWOOT_WEBHOOK_SECRET", SECRET),
    ];
    env.extend_from_slice(more);
    let app = TestApp::spawn_with(None, &env).await;
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
    let sabis = posted
        .iter()
        .find(|m| m.message_type == "outgoing" && !m.private)
        .expect("Sabi's answer")
        .clone();
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

    // Chatwoot's webhook for what Sabi wrote, even without Sabi's mark on it, is not a reply.
    let echo = FakeChatwoot::agent_reply(conversation, sabis.id, &sabis.content);
    assert_eq!(chatwoot_posts(&app, echo, SECRET, 0).await, 200);
    assert_eq!(
        outbox(&app).await.len(),
        before,
        "Sabi's own words not sent again"
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
    assert_eq!(chatwoot_posts(&app, late.clone(), SECRET, 0).await, 200);
    assert_eq!(chatwoot_posts(&app, late, SECRET, 1).await, 200);
    assert_eq!(outbox(&app).await.len(), before, "not sent");
    let notes: Vec<Posted> = chatwoot
        .messages(conversation)
        .into_iter()
        .filter(|m| m.private && m.content.starts_with("Not sent"))
        .collect();
    assert_eq!(notes.len(), 1, "told once: {notes:?}");

    // The customer asks again: the same Chatwoot conversation holds them again.
    writes(&app, "wamid.cl2", "I want to speak to a human agent").await;
    let before = outbox(&app).await.len();
    assert_eq!(mirror.mirror().await.expect("round"), Some(1));
    assert_eq!(chatwoot.conversations(), [conversation]);
    writes(&app, "wamid.cl3", "hello?").await;
    assert_eq!(outbox(&app).await.len(), before, "Sabi stays silent");
    let reply = FakeChatwoot::agent_reply(conversation, 951, "Back with you.");
    assert_eq!(chatwoot_posts(&app, reply, SECRET, 0).await, 200);
    assert_eq!(
        outbox(&app).await.len(),
        before + 1,
        "the agent's reply goes"
    );
}

#[tokio::test]
async fn a_customers_photo_reaches_chatwoot_as_an_attachment() {
    let chatwoot = FakeChatwoot::start(TOKEN, INBOX).await;
    let graph = FakeGraph::start("graph-token").await;
    let photo = b"\xFF\xD8\xFF a receipt".to_vec();
    graph.add_media("media.receipt", "image/jpeg", photo.clone());
    let base = graph.base_url();
    let (app, mirror) = app_with(
        &chatwoot,
        &[
            ("SABI_WHATSAPP_ACCESS_TOKEN", "graph-token"),
            ("SABI_WHATSAPP_API_BASE", base.as_str()),
        ],
    )
    .await;
    writes(&app, "wamid.ph1", "I want to speak to a human agent").await;
    mirror.mirror().await.expect("round");
    let image = json!({"object": "whatsapp_business_account", "entry": [{"id": "WABA", "changes": [{"field": "messages", "value": {
        "messaging_product": "whatsapp",
        "metadata": {"display_phone_number": "15550001111", "phone_number_id": "100000000000001"},
        "contacts": [{"profile": {"name": "Test Customer"}, "wa_id": CUSTOMER}],
        "messages": [{"from": CUSTOMER, "id": "wamid.ph2", "timestamp": (START_MS / 1000).to_string(),
            "type": "image", "image": {"id": "media.receipt", "mime_type": "image/jpeg", "caption": "my receipt"}}]}}]}]});
    let body = sabi::whatsapp::wire::encode(&image).into_bytes();
    assert_eq!(app.post_whatsapp_webhook(body).await.status(), 200);
    app.scheduler.drain().await.expect("turns");
    assert_eq!(mirror.mirror().await.expect("round"), Some(1));
    let conversation = chatwoot.conversations()[0];
    let last = chatwoot.messages(conversation).pop().expect("posted");
    assert_eq!(
        (last.message_type.as_str(), last.content.as_str()),
        ("incoming", "my receipt")
    );
    let (name, kind, bytes) = last.attachment.expect("the photo attached");
    assert_eq!(
        (name.as_str(), kind.as_str()),
        ("image-media.receipt.jpeg", "image/jpeg")
    );
    assert_eq!(bytes, photo);
}

#[tokio::test]
async fn one_customer_on_two_business_numbers_gets_two_chatwoot_conversations() {
    let chatwoot = FakeChatwoot::start(TOKEN, INBOX).await;
    let (app, mirror) = app(&chatwoot).await;
    writes(&app, "wamid.tb1", "I want to speak to a human agent").await;
    let other = sabi::whatsapp::wire::text_webhook(
        "100000000000002",
        CUSTOMER,
        "Test Customer",
        "wamid.tb2",
        u64::try_from(START_MS / 1000).expect("positive"),
        "I want to speak to a human agent",
    );
    let response = app
        .post_whatsapp_webhook(sabi::whatsapp::wire::encode(&other).into_bytes())
        .await;
    assert_eq!(response.status(), 200);
    app.scheduler.drain().await.expect("turns");
    assert_eq!(open_items(&app).await, 2);
    assert_eq!(mirror.mirror().await.expect("round"), Some(2));
    let conversations = chatwoot.conversations();
    assert_eq!(conversations.len(), 2, "{conversations:?}");
    let contacts: Vec<_> = conversations
        .iter()
        .map(|c| chatwoot.contact_of(*c).expect("contact").0)
        .collect();
    assert_eq!(contacts, [CUSTOMER, CUSTOMER], "one contact");
    // Each agent's reply goes from the number the customer wrote to.
    let before = outbox(&app).await.len();
    for (conversation, text) in conversations
        .iter()
        .zip(["From the first", "From the second"])
    {
        let reply = FakeChatwoot::agent_reply(*conversation, 980 + conversation, text);
        assert_eq!(chatwoot_posts(&app, reply, SECRET, 0).await, 200);
    }
    let sent: Vec<(String, String)> = outbox(&app).await[before..]
        .iter()
        .map(|p| (p.conversation.business.clone(), p.text.clone()))
        .collect();
    assert_eq!(
        sent,
        [
            ("100000000000001".to_owned(), "From the first".to_owned()),
            ("100000000000002".to_owned(), "From the second".to_owned()),
        ]
    );
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
