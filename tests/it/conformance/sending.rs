//! The sender's role beyond claims and outcomes (the walk's ground): when a reply part is next
//! due, per number, and which numbers a claim leaves alone.

use std::sync::Arc;

use sabi::clock::At;
use sabi::store::{SendClaim, SendResult, Store};

use super::T0;
use super::fixtures::{
    BUSINESS, LEASE, OTHER_BUSINESS, WAIT, claim_only, claim_sends, depart, message_to, replied,
    replied_to, sends,
};

use crate::helpers::ms;

async fn due(store: &Arc<dyn Store>, skip: &[&str]) -> Option<At> {
    let skip = skip.iter().map(|s| (*s).to_owned()).collect();
    store.next_send_due(skip).await.expect("next send due")
}

async fn record(store: &Arc<dyn Store>, id: i64, attempt: u32, now: At, result: SendResult) {
    store
        .record_send(id, attempt, now, result)
        .await
        .expect("recorded");
}

pub async fn next_send_due_is_the_earliest_head_hold_retry_or_wait(store: Arc<dyn Store>) {
    assert_eq!(due(&store, &[]).await, None, "nothing to send");
    let at = T0 + ms(20_000);
    let ours = replied(&store, "c1", &["one", "two"], at).await;
    assert!(
        due(&store, &[]).await.is_some_and(|t| t <= at),
        "due at once"
    );
    let first = claim_only(&store, ours[0], at).await;
    assert_eq!(
        due(&store, &[]).await,
        Some(at + LEASE),
        "the send under way"
    );
    // Accepted, with the recipient's pacing holding the second part back.
    let paced = SendResult::Accepted {
        wamid: "wamid.d1".into(),
        template: false,
        next_send_at: at + ms(5_000),
    };
    record(&store, first.id, first.attempt, at + ms(100), paced).await;
    assert_eq!(due(&store, &[]).await, Some(at + ms(5_000)));
    assert!(claim_sends(&store, at + ms(4_999)).await.is_empty());
    let second = claim_only(&store, ours[1], at + ms(5_000)).await;
    let retry = SendResult::Retry {
        at: at + ms(8_000),
        failure: true,
        code: Some(131_000),
        error: "try again".into(),
        recipient_after: None,
    };
    record(&store, second.id, second.attempt, at + ms(5_000), retry).await;
    assert_eq!(due(&store, &[]).await, Some(at + ms(8_000)));
    // Another number's customer: due at once, unless that number is skipped.
    let theirs = message_to(OTHER_BUSINESS, "wamid.d-c2", "c2", "hi", at);
    let theirs = replied_to(&store, theirs, &["three"], at + ms(6_000)).await;
    assert!(due(&store, &[]).await.is_some_and(|t| t <= at + ms(6_000)));
    assert_eq!(due(&store, &[OTHER_BUSINESS]).await, Some(at + ms(8_000)));
    assert_eq!(due(&store, &[BUSINESS, OTHER_BUSINESS]).await, None);
    // A claim leaves the halted number's parts where they are.
    let halted = |now| SendClaim {
        halted: vec![OTHER_BUSINESS.into()],
        ..sends(now)
    };
    let jobs = store
        .claim_sends(halted(at + ms(8_000)))
        .await
        .expect("claim")
        .jobs;
    let claimed: Vec<_> = jobs.iter().map(|j| (j.id, j.attempt)).collect();
    assert_eq!(claimed, [(ours[1], 2)]);
    depart(&store, &jobs[0], at + ms(8_000)).await;
    // A send under way, or waiting for its status, counts whatever number is skipped.
    let both = [BUSINESS, OTHER_BUSINESS];
    assert_eq!(due(&store, &both).await, Some(at + ms(8_000) + LEASE));
    let unknown = SendResult::Unknown {
        error: "timed out".into(),
        wait_until: at + ms(8_000) + WAIT,
    };
    record(&store, ours[1], 2, at + ms(8_000), unknown).await;
    assert_eq!(due(&store, &both).await, Some(at + ms(8_000) + WAIT));
    let over = at + ms(8_000) + WAIT;
    let jobs = store.claim_sends(halted(over)).await.expect("claim").jobs;
    assert!(jobs.is_empty(), "to a person, and the halted number waits");
    assert_eq!(due(&store, &[OTHER_BUSINESS]).await, None);
    claim_only(&store, theirs[0], over).await;
}

/// A claim only holds a part while it waits for its pacing slot: one that lapses there goes
/// again (nothing left). Once departed, a lapse leaves it unknown, and an unknown part holds
/// back the rest of its own reply but not the customer's next reply.
pub async fn a_lapsed_claim_goes_again_and_an_unknown_part_holds_only_its_own_reply(
    store: Arc<dyn Store>,
) {
    let at = T0 + ms(20_000);
    let first = replied(&store, "c1", &["one", "two"], at).await;
    let claimed = store.claim_sends(sends(at)).await.expect("claim").jobs;
    assert_eq!(claimed.iter().map(|j| j.id).collect::<Vec<_>>(), [first[0]]);

    // Its sender died before the slot came: the claim lapses and the part goes again.
    let lapsed = at + LEASE + ms(1);
    let again = store.claim_sends(sends(lapsed)).await.expect("claim");
    assert!(again.unknown.is_empty(), "nothing had left");
    let ids: Vec<(i64, u32)> = again.jobs.iter().map(|j| (j.id, j.attempt)).collect();
    assert_eq!(ids, [(first[0], 2)], "claimed again, with a new attempt");
    let stale = store.depart(first[0], 1, lapsed, LEASE).await;
    assert!(
        matches!(stale, Err(sabi::store::Error::LeaseLost)),
        "the first claim may no longer send"
    );

    // This time it departs, and its sender dies mid-request: unknown, reported once.
    depart(&store, &again.jobs[0], lapsed).await;
    let dead = lapsed + LEASE + ms(1);
    let settled = store.claim_sends(sends(dead)).await.expect("claim");
    assert_eq!(settled.unknown, [first[0]]);
    assert!(settled.jobs.is_empty(), "the rest of its reply waits");

    // The customer writes again and is answered: that reply does not wait.
    let next = message_to(BUSINESS, "wamid.c1-again", "c1", "hello?", dead);
    let answered = dead + ms(1_000);
    let second = replied_to(&store, next, &["three"], answered).await;
    let jobs = claim_sends(&store, answered).await;
    assert_eq!(jobs.iter().map(|j| j.id).collect::<Vec<_>>(), second);
    assert!(
        store
            .claim_sends(sends(answered))
            .await
            .expect("claim")
            .unknown
            .is_empty()
    );
}
