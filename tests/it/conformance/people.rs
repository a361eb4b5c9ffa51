//! What people read and settle: review items, open or settled, and a customer's conversations.

use std::sync::Arc;

use sabi::clock::At;
use sabi::domain::{Channel, ConversationKey, ReplyPart, ReviewReason};
use sabi::store::{
    ConversationView, Ending, Error, HistoryEntry, Resolution, ReviewEntry, ReviewQuery,
    ReviewState, SendResult, Speaker, Store,
};

use super::fixtures::{
    BUSINESS, OTHER_BUSINESS, claim_only, message_to, open_reviews, replied, turn,
};
use super::{T0, ingest, message, reply};

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
