//! The sender's role beyond claims and outcomes (the walk's ground): when a reply part is next
//! due, per number, and which numbers a claim leaves alone.

use std::sync::Arc;

use sabi::clock::At;
use sabi::store::{SendClaim, SendResult, Store};

use super::T0;
use super::fixtures::{
    BUSINESS, LEASE, OTHER_BUSINESS, WAIT, claim_only, claim_sends, message_to, replied,
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
        .expect("claim");
    let claimed: Vec<_> = jobs.iter().map(|j| (j.id, j.attempt)).collect();
    assert_eq!(claimed, [(ours[1], 2)]);
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
    let jobs = store.claim_sends(halted(over)).await.expect("claim");
    assert!(jobs.is_empty(), "to a person, and the halted number waits");
    assert_eq!(due(&store, &[OTHER_BUSINESS]).await, None);
    claim_only(&store, theirs[0], over).await;
}
