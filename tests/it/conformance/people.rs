//! What people read and settle: review items, open or settled, and a customer's conversations.

use std::sync::Arc;

use sabi::clock::At;
use sabi::domain::{Channel, ConversationKey, InboundItem, ItemKind, ReplyPart, ReviewReason};
use sabi::store::{
    ConversationView, Ending, Error, HistoryEntry, Holding, Resolution, ReviewEntry, ReviewQuery,
    ReviewState, SendResult, Speaker, Store,
};

use super::fixtures::{
    BUSINESS, OTHER_BUSINESS, claim_only, message_to, open_reviews, replied, turn,
};
use super::{HUMAN_HOLD, POLICY, T0, ingest, message, reply};

use crate::helpers::ms;

async fn queue(store: &Arc<dyn Store>, query: ReviewQuery) -> Vec<i64> {
    let queue = store.review_queue(query).await.expect("queue");
    queue.iter().map(|r| r.id).collect()
}

async fn refuse(store: &Arc<dyn Store>, id: i64, now: At, reason: ReviewReason, error: &str) {
    let job = claim_only(store, id, now).await;
    let refused = SendResult::Review {
        reason,
        code: None,
        error: error.into(),
    };
    store
        .record_send(job.id, job.attempt, now, refused)
        .await
        .expect("recorded");
}

pub async fn review_items_read_alike_open_or_settled(store: Arc<dyn Store>) {
    // A turn too old for a reply, a hand-off, and a send Meta refused.
    let at = T0 + ms(20_000);
    let too_old = Ending::Review {
        reason: ReviewReason::TooOld,
        error: None,
    };
    let b1 = turn(&store, message("wamid.r1", "c1", "help", T0), at, too_old).await;
    // Replies here are kept in sandbox mode: the only part to send is the refused one.
    let handoff = Ending::Handoff {
        parts: vec![ReplyPart::text("A colleague will answer.")],
        sandbox: true,
        note: "asked for a person".into(),
    };
    let asked = message("wamid.r2", "c2", "a person", T0);
    turn(&store, asked, at + ms(1), handoff).await;
    let part = replied(&store, "c3", &["x"], at + ms(2)).await[0];
    refuse(
        &store,
        part,
        at + ms(3),
        ReviewReason::SendFailed,
        "refused",
    )
    .await;
    let open = open_reviews(&store).await;
    let seen: Vec<_> = open
        .iter()
        .map(|r| (r.conversation.customer.as_str(), r.reason, r.outbox_id))
        .collect();
    assert_eq!(
        seen,
        [
            ("c1", ReviewReason::TooOld, None),
            ("c2", ReviewReason::HandoffAsked, None),
            ("c3", ReviewReason::SendFailed, Some(part)),
        ]
    );
    assert_eq!((open[0].batch_id, open[0].created_at), (b1, at));
    assert_eq!(open[0].messages[0].text.as_deref(), Some("help"));
    assert_eq!(open[1].error.as_deref(), Some("asked for a person"));
    assert_eq!(
        (open[2].error.as_deref(), open[2].created_at),
        (Some("refused"), at + ms(3))
    );
    for entry in &open {
        let item = store.review_item(entry.id).await.expect("item");
        assert_eq!(
            item.as_ref(),
            Some(entry),
            "one item reads as the queue lists it"
        );
    }
    settle_each(&store, &open, at + ms(10)).await;
    // The requeued send fails again: the same item opens again, with the new reason.
    refuse(
        &store,
        part,
        at + ms(20),
        ReviewReason::OutOfRetries,
        "out of tries",
    )
    .await;
    let again = store.review_item(open[2].id).await.expect("item");
    let reopened = ReviewEntry {
        state: ReviewState::Open,
        reason: ReviewReason::OutOfRetries,
        error: Some("out of tries".into()),
        created_at: at + ms(20),
        ..open[2].clone()
    };
    assert_eq!(again, Some(reopened.clone()));
    assert_eq!(open_reviews(&store).await, [reopened]);
}

/// Closes, answers and requeues the three open items; each reads back settled, and is gone from
/// the queue and settled once.
async fn settle_each(store: &Arc<dyn Store>, open: &[ReviewEntry], at: At) {
    let c1 = ReviewQuery {
        customer: Some("c1".into()),
        ..ReviewQuery::default()
    };
    assert_eq!(queue(store, c1).await, [open[0].id]);
    let handoffs = ReviewQuery {
        reason: Some(ReviewReason::HandoffAsked),
        ..ReviewQuery::default()
    };
    assert_eq!(queue(store, handoffs).await, [open[1].id]);
    let two = ReviewQuery {
        limit: Some(2),
        ..ReviewQuery::default()
    };
    assert_eq!(queue(store, two).await, [open[0].id, open[1].id]);
    let answer = Resolution::Reply {
        text: "Here I am.".into(),
        sandbox: true,
        hold: HUMAN_HOLD,
        desk: None,
    };
    let settled = [
        (Resolution::Close, ReviewState::Closed),
        (answer, ReviewState::Replied),
        (Resolution::Requeue, ReviewState::Requeued),
    ];
    for (entry, (how, state)) in open.iter().zip(settled) {
        store
            .resolve_review(entry.id, at, how.clone())
            .await
            .expect("settled");
        let item = store.review_item(entry.id).await.expect("item");
        assert_eq!(
            item,
            Some(ReviewEntry {
                state,
                ..entry.clone()
            })
        );
        let twice = store.resolve_review(entry.id, at, how).await;
        assert!(matches!(twice, Err(Error::NotFound)), "settled once");
    }
    assert!(open_reviews(store).await.is_empty());
    let unknown = open.iter().map(|r| r.id).max().unwrap_or(0) + 1_000;
    assert_eq!(store.review_item(unknown).await.expect("item"), None);
}

fn line(at: At, speaker: Speaker, text: &str) -> HistoryEntry {
    HistoryEntry {
        at,
        speaker,
        text: text.into(),
    }
}

pub async fn conversations_list_every_thread_of_a_customer(store: Arc<dyn Store>) {
    // Two turns with the first number; the window opens at the latest message sent.
    let first = message_to(BUSINESS, "wamid.k1", "c1", "first", T0);
    turn(&store, first, T0 + ms(20_000), reply("One.")).await;
    let second = message_to(BUSINESS, "wamid.k2", "c1", "second", T0 + ms(30_000));
    turn(&store, second, T0 + ms(50_000), reply("Two.")).await;
    // Waiting messages: an older one arriving late moves nothing back; one stamped in the
    // future counts from its arrival. Another customer is someone else's.
    let late = message_to(BUSINESS, "wamid.k3", "c1", "late", T0 + ms(1_000));
    let ahead = message_to(OTHER_BUSINESS, "wamid.k4", "c1", "hi", T0 + ms(200_000));
    let other = message_to(BUSINESS, "wamid.k5", "c2", "me too", T0 + ms(60_000));
    ingest(&store, vec![late, ahead, other], T0 + ms(61_000)).await;
    let first_number = |history| ConversationView {
        conversation: key(BUSINESS),
        last_inbound_at: Some(T0 + ms(30_000)),
        history,
    };
    let second_number = ConversationView {
        conversation: key(OTHER_BUSINESS),
        last_inbound_at: Some(T0 + ms(61_000)),
        history: Vec::new(),
    };
    let views = |customer: &'static str, turns| {
        let store = store.clone();
        async move { store.conversations(customer, turns).await.expect("views") }
    };
    let turn2 = vec![
        line(T0 + ms(38_000), Speaker::Customer, "second"),
        line(T0 + ms(50_000), Speaker::Business, "Two."),
    ];
    let all = [
        vec![
            line(T0 + ms(8_000), Speaker::Customer, "first"),
            line(T0 + ms(20_000), Speaker::Business, "One."),
        ],
        turn2.clone(),
    ]
    .concat();
    assert_eq!(
        views("c1", 10).await,
        [first_number(all), second_number.clone()]
    );
    assert_eq!(views("c1", 1).await, [first_number(turn2), second_number]);
    assert_eq!(views("c2", 10).await.len(), 1);
    assert_eq!(views("nobody", 10).await, []);
}

fn key(business: &str) -> ConversationKey {
    ConversationKey {
        channel: Channel::Whatsapp,
        business: business.into(),
        customer: "c1".into(),
    }
}

/// What the business's owner typed in the WhatsApp Business app to `customer`, as the parser
/// gives it.
fn echo(id: &str, customer: &str, text: &str, sent: At) -> InboundItem {
    InboundItem {
        kind: ItemKind::Echo,
        dedupe_key: format!("echo:{id}"),
        turn: None,
        facts: serde_json::json!({"kind": "echo", "id": id}),
        ..message(id, customer, text, sent)
    }
}

/// How the worker ends a turn while a person holds the conversation.
fn to_person() -> Ending {
    Ending::Review {
        reason: ReviewReason::PersonAnswering,
        error: None,
    }
}

/// Claims the one batch due at `at` and hands it to a person as the worker does while a person
/// holds the conversation: the hold it carried, and the review item it opened.
async fn held_turn(store: &Arc<dyn Store>, at: At) -> (Option<At>, ReviewEntry) {
    let claims = store.claim(at, ms(60_000), 10, None).await.expect("claim");
    assert_eq!(claims.len(), 1, "one turn due");
    let claim = &claims[0];
    store
        .finish(claim.batch.id, claim.token, at, to_person())
        .await
        .expect("finish");
    let open = open_reviews(store).await;
    let item = open
        .into_iter()
        .find(|r| r.batch_id == claim.batch.id)
        .expect("the person's item");
    (claim.batch.held_until, item)
}

pub async fn a_persons_reply_holds_the_conversation_until_they_let_it_go(store: Arc<dyn Store>) {
    // The owner writes first, from the app; the echo reaches Sabi a second later, twice.
    let from_app = echo("wamid.app-1", "c9", "Your order is ready: come by 4pm", T0);
    let first = ingest(&store, vec![from_app.clone()], T0 + ms(1_000)).await;
    assert_eq!((first.stored, first.earliest_due), (1, None), "no turn");
    let again = ingest(&store, vec![from_app], T0 + ms(2_000)).await;
    assert_eq!(again.duplicates, 1);
    // The owner's own words are no turn: `sabi stats` counts none.
    let stats = store.turn_stats(At::default()).await.expect("stats");
    assert_eq!((stats.local, stats.agent, stats.people), (0, 0, 0));

    // The customer answers: their batch carries the hold from the owner's message, and the
    // owner's words are in its history as the business's, never among the customer's.
    let sent = T0 + ms(60_000);
    let answer = message("wamid.c9-1", "c9", "Thank you! Can I come at 5?", sent);
    ingest(&store, vec![answer], sent).await;
    let at = sent + POLICY.cap;
    // A surge: the holder tells the model's waiting customers to wait, but not one a person
    // answers (their batch still waits for its claim).
    let holding = Holding {
        skip: 0,
        limit: 10,
        parts: vec![ReplyPart::text("We will answer you soon.")],
        sandbox: true,
    };
    assert_eq!(store.hold(at, holding).await.expect("hold").len(), 1);
    assert_eq!(store.outbox(None).await.expect("outbox"), []);
    let claims = store.claim(at, ms(60_000), 10, None).await.expect("claim");
    let batch = &claims[0].batch;
    assert_eq!(batch.held_until, Some(T0 + HUMAN_HOLD));
    assert_eq!(batch.messages.len(), 1);
    let history = store.history(batch.id, 10).await.expect("history");
    assert_eq!(
        history,
        [line(
            T0 + ms(1_000),
            Speaker::Business,
            "Your order is ready: come by 4pm"
        )]
    );
    store
        .finish(batch.id, claims[0].token, at, to_person())
        .await
        .expect("finish");
    let item = open_reviews(&store).await.remove(0);
    assert_eq!(item.reason, ReviewReason::PersonAnswering);

    // A person's reply from the desk renews the hold from its own time.
    let replied_at = at + ms(5_000);
    let desk = Resolution::Reply {
        text: "5 is fine".into(),
        sandbox: true,
        hold: HUMAN_HOLD,
        desk: None,
    };
    store
        .resolve_review(item.id, replied_at, desk)
        .await
        .expect("replied");
    let next = replied_at + ms(1_000);
    ingest(
        &store,
        vec![message("wamid.c9-2", "c9", "Great", next)],
        next,
    )
    .await;
    let (held, item) = held_turn(&store, next + POLICY.cap).await;
    assert_eq!(held, Some(replied_at + HUMAN_HOLD));

    // Closing the item gives the customer back to the assistant.
    store
        .resolve_review(item.id, next + POLICY.cap, Resolution::Close)
        .await
        .expect("closed");
    let last = next + POLICY.cap + ms(1_000);
    ingest(
        &store,
        vec![message("wamid.c9-3", "c9", "Hello?", last)],
        last,
    )
    .await;
    let claims = store
        .claim(last + POLICY.cap, ms(60_000), 10, None)
        .await
        .expect("claim");
    assert_eq!(claims[0].batch.held_until, None);

    // Another customer of the same number was never held.
    let other = T0 + ms(3_000);
    ingest(
        &store,
        vec![message("wamid.c8-1", "c8", "Hi", other)],
        other,
    )
    .await;
    let claims = store
        .claim(other + POLICY.cap, ms(60_000), 10, None)
        .await
        .expect("claim");
    assert!(claims.iter().all(|c| c.batch.held_until.is_none()));
}
