//! A help desk's hold on a conversation handed to it (`store::Desk`): the thread holds the
//! conversation until the desk resolves it, the desk's replies keep the item open and go once
//! however often the desk delivers them, and mirroring only moves forward.

use std::sync::Arc;

use sabi::domain::{ConversationKey, ReviewReason};
use sabi::store::{DeskThread, Ending, Resolution, ReviewState, Store, rules::review::DESK_HOLD};

use super::fixtures::{deliver, open_reviews, turn};
use super::{HUMAN_HOLD, T0, message};

use crate::helpers::ms;

const THREAD: &str = "chatwoot:17";

fn desk_reply(text: &str, id: &str) -> Resolution {
    Resolution::Reply {
        text: text.into(),
        sandbox: true,
        hold: HUMAN_HOLD,
        desk: Some(id.into()),
    }
}

pub async fn a_desk_holds_its_conversation_and_its_replies_go_once(store: Arc<dyn Store>) {
    let asked = Ending::Review {
        reason: ReviewReason::HandoffAsked,
        error: None,
    };
    let at = T0 + ms(60_000);
    turn(
        &store,
        message("wamid.d1", "c7", "a person please", T0),
        at,
        asked,
    )
    .await;
    let item = open_reviews(&store).await.remove(0);
    let conversation: ConversationKey = item.conversation.clone();
    assert_eq!(
        store.desk_thread(&conversation).await.expect("thread"),
        None
    );
    store
        .open_desk_thread(&conversation, THREAD)
        .await
        .expect("opened");
    let open = DeskThread {
        thread: THREAD.into(),
        open: true,
    };
    assert_eq!(
        store.desk_thread(&conversation).await.expect("thread"),
        Some(open)
    );
    assert_eq!(
        store.desk_conversation(THREAD).await.expect("lookup"),
        Some(conversation.clone())
    );

    // The desk's agent answers twice; Chatwoot delivers the first answer twice.
    for (text, id) in [
        ("Hello, Ada here.", "m1"),
        ("Hello, Ada here.", "m1"),
        ("Which order?", "m2"),
    ] {
        store
            .resolve_review(item.id, at + ms(1), desk_reply(text, id))
            .await
            .expect("sent or known");
    }
    let parts: Vec<String> = store
        .outbox(None)
        .await
        .expect("outbox")
        .into_iter()
        .filter(|p| p.batch_id == item.batch_id)
        .map(|p| p.text)
        .collect();
    assert_eq!(parts, ["Hello, Ada here.", "Which order?"]);
    let still = store
        .review_item(item.id)
        .await
        .expect("item")
        .expect("kept");
    assert_eq!(still.state, ReviewState::Open, "the desk holds it");

    // The customer writes meanwhile: their batch carries the desk's hold.
    let later = at + ms(120_000);
    deliver(
        &store,
        message("wamid.d2", "c7", "order 48213", later),
        later,
    )
    .await;
    let claims = store
        .claim(later + ms(60_000), ms(60_000), 10, None)
        .await
        .expect("claim");
    assert_eq!(claims[0].batch.held_until, Some(DESK_HOLD));
    store
        .finish(
            claims[0].batch.id,
            claims[0].token,
            later + ms(60_000),
            Ending::Review {
                reason: ReviewReason::PersonAnswering,
                error: None,
            },
        )
        .await
        .expect("to the desk");

    // Every open item is behind on the desk until it is mirrored whole; mirroring moves
    // forward only.
    let open: Vec<(i64, Option<i64>)> = open_reviews(&store)
        .await
        .iter()
        .map(|i| (i.id, None))
        .collect();
    assert_eq!(open.len(), 2, "the hand-off and the customer's later words");
    assert_eq!(store.desk_pending(10).await.expect("pending"), open);
    assert_eq!(store.desk_pending(1).await.expect("pending"), open[..1]);
    let seq = item.messages.last().expect("a message").seq;
    store
        .set_desk_mirrored(item.id, seq - 1)
        .await
        .expect("set");
    assert_eq!(
        store.desk_pending(10).await.expect("pending")[0],
        (item.id, Some(seq - 1))
    );
    store.set_desk_mirrored(item.id, seq).await.expect("set");
    store
        .set_desk_mirrored(item.id, seq - 1)
        .await
        .expect("set");
    assert_eq!(store.desk_pending(10).await.expect("pending"), open[1..]);

    // A message Sabi wrote into the desk is claimed: it never goes out as an agent's reply.
    assert!(store.claim_desk_message("m3", at).await.expect("claim"));
    assert!(!store.claim_desk_message("m3", at).await.expect("claim"));
    store
        .resolve_review(item.id, at + ms(2), desk_reply("echo", "m3"))
        .await
        .expect("known");
    let echoed = store.outbox(None).await.expect("outbox");
    assert!(echoed.iter().all(|p| p.text != "echo"), "{echoed:?}");

    // The desk resolves it: the hold goes, and the next turn is the assistant's.
    assert_eq!(
        store.close_desk_thread(THREAD).await.expect("closed"),
        Some(conversation.clone())
    );
    let closed = store.desk_thread(&conversation).await.expect("thread");
    assert_eq!(closed.map(|t| t.open), Some(false));
    let last = later + ms(200_000);
    deliver(&store, message("wamid.d3", "c7", "thanks", last), last).await;
    let claims = store
        .claim(last + ms(60_000), ms(60_000), 10, None)
        .await
        .expect("claim");
    assert_eq!(claims[0].batch.held_until, None);
    assert_eq!(
        store
            .close_desk_thread("chatwoot:404")
            .await
            .expect("closed"),
        None
    );
}
