//! Retention: what is past its horizon goes, by the injected clock, and nothing else; an
//! expired message's key keeps a late retry out until the `dedupe` horizon; a sweep racing
//! ingest and a turn on the same conversation loses and doubles nothing
//! (store/rules/retention.rs).

use std::sync::Arc;
use std::time::Duration;

use sabi::clock::At;
use sabi::domain::{Channel, Horizons, InboundItem, Quarantined, ReplyPart, ReviewReason};
use sabi::store::{
    Ending, Error, InboxQuery, Ingest, Resolution, ReviewQuery, Store, Subject, Submitted, Swept,
};

use super::fixtures::{accept, claim_only, replied_to, status, turn};
use super::{POLICY, T0, ingest, message, question, reply};
use crate::helpers::ms;

const ADA: &str = "2348031234567";
const ADA_BSUID: &str = "NG.4455667788";
const BO: &str = "2348030000002";
const HOUR: Duration = Duration::from_secs(3_600);

/// Short horizons, as tests and trials set them.
const HORIZONS: Horizons = Horizons {
    messages: HOUR,
    statuses: Duration::from_secs(600),
    quarantine: Duration::from_secs(600),
    dedupe: HOUR,
};

/// Sweeps at `now` until nothing more is past its horizon, in batches of two: what went.
async fn sweep(store: &Arc<dyn Store>, now: At) -> Swept {
    let mut total = Swept::default();
    loop {
        let swept = store.sweep(&HORIZONS, now, 2).await.expect("sweep");
        if swept.is_empty() {
            return total;
        }
        total.add(&swept);
    }
}

async fn inbox_keys(store: &Arc<dyn Store>) -> Vec<String> {
    let items = store.inbox(InboxQuery::default()).await.expect("inbox");
    items.into_iter().map(|i| i.item.dedupe_key).collect()
}

/// A message that asks for no turn (a reaction).
fn reaction(id: &str, customer: &str, at: At) -> InboundItem {
    InboundItem {
        item_type: Some("reaction".into()),
        turn: None,
        ..message(id, customer, "👍", at)
    }
}

pub async fn what_is_past_its_horizon_goes_and_its_retry_stays_a_duplicate(store: Arc<dyn Store>) {
    // Ada was answered and her reply delivered; she reacted; a raw part was quarantined; Bo's
    // message still waits for its turn.
    // Meta names her by number and BSUID: the two are linked.
    let mut first = message("wamid.ada-1", ADA, "my PIN is 4321", T0);
    first.facts = serde_json::json!({"id": "wamid.ada-1", "from": ADA, "from_user_id": ADA_BSUID});
    let parts = replied_to(&store, first, &["Never share your PIN."], T0 + ms(20_000)).await;
    let by_bsuid = Subject::parse(Channel::Whatsapp, ADA_BSUID).expect("a BSUID");
    let linked = store.linked_ids(&by_bsuid).await.expect("ids");
    assert_eq!(linked, [ADA, ADA_BSUID]);
    let job = claim_only(&store, parts[0], T0 + ms(21_000)).await;
    accept(&store, &job, "wamid.to-ada", T0 + ms(21_000)).await;
    store
        .ingest(Ingest {
            items: vec![
                status("wamid.to-ada", "delivered", T0 + ms(22_000)),
                reaction("wamid.ada-2", ADA, T0 + ms(22_000)),
                message("wamid.bo-1", BO, "hello", T0 + ms(22_000)),
            ],
            quarantined: vec![Quarantined {
                channel: Channel::Whatsapp,
                reason: "unknown field".into(),
                raw: r#"{"oddity":true}"#.into(),
            }],
            received_at: T0 + ms(22_000),
            policy: POLICY,
            routine: Default::default(),
            pair_spacing: std::time::Duration::ZERO,
            human_hold: std::time::Duration::ZERO,
        })
        .await
        .expect("kept");

    assert!(
        sweep(&store, T0 + ms(300_000)).await.is_empty(),
        "nothing is old yet"
    );
    // Statuses and the quarantine go first.
    let early = sweep(&store, T0 + ms(700_000)).await;
    assert_eq!((early.statuses, early.quarantined, early.turns), (1, 1, 0));

    let later = T0 + HOUR + ms(30_000);
    let swept = sweep(&store, later).await;
    assert_eq!(
        (
            swept.turns,
            swept.messages,
            swept.replies,
            swept.conversations
        ),
        (1, 2, 1, 1),
        "{swept:?}"
    );
    assert_eq!(
        inbox_keys(&store).await,
        ["wamid.bo-1"],
        "a waiting message stays"
    );
    let linked = store.linked_ids(&by_bsuid).await.expect("ids");
    assert_eq!(linked, [ADA_BSUID], "her ids go with her last conversation");
    assert!(store.outbox(None).await.expect("outbox").is_empty());
    assert!(store.quarantine(None).await.expect("quarantine").is_empty());

    // Meta's late retry of the expired message is known: not kept, not answered.
    let retry = ingest(
        &store,
        vec![message("wamid.ada-1", ADA, "my PIN is 4321", T0)],
        later,
    )
    .await;
    assert_eq!((retry.stored, retry.duplicates), (0, 1));
    let claims = store
        .claim(later + POLICY.cap, ms(60_000), 10, None)
        .await
        .expect("claim");
    let customers: Vec<&str> = claims
        .iter()
        .map(|c| c.batch.conversation.customer.as_str())
        .collect();
    assert_eq!(customers, [BO], "only Bo's message is answered");

    // Past `dedupe`, the key goes too.
    let keys = sweep(&store, later + HOUR + ms(1_000)).await;
    assert_eq!(keys.keys, 2, "{keys:?}");
    let retry = ingest(
        &store,
        vec![message("wamid.ada-1", ADA, "my PIN is 4321", T0)],
        later + HOUR + ms(2_000),
    )
    .await;
    assert_eq!(retry.stored, 1, "the configured horizon is over");
}

/// A turn still running, waiting in review, or with a reply on its way keeps everything until
/// it settles, however old.
pub async fn a_turn_not_yet_settled_keeps_everything(store: Arc<dyn Store>) {
    let handed = Ending::Review {
        reason: ReviewReason::HandoffAsked,
        error: None,
    };
    turn(
        &store,
        message("wamid.ada-1", ADA, "agent abeg", T0),
        T0 + ms(20_000),
        handed,
    )
    .await;
    let queued = replied_to(
        &store,
        message("wamid.bo-1", BO, "price?", T0),
        &["It is 5,000 naira."],
        T0 + ms(20_000),
    )
    .await;
    ingest(
        &store,
        vec![message("wamid.cy-1", "2348030000003", "hi", T0)],
        T0,
    )
    .await;
    let running = store
        .claim(T0 + POLICY.cap, ms(10 * 3_600_000), 10, None)
        .await
        .expect("claim");
    assert_eq!(running.len(), 1);

    let much_later = T0 + HOUR * 5;
    assert!(sweep(&store, much_later).await.is_empty());
    assert_eq!(inbox_keys(&store).await.len(), 3);

    // Once settled, each goes.
    let review = store
        .review_queue(ReviewQuery::default())
        .await
        .expect("review");
    store
        .resolve_review(review[0].id, T0 + ms(30_000), Resolution::Close)
        .await
        .expect("closed");
    let job = claim_only(&store, queued[0], T0 + ms(30_000)).await;
    accept(&store, &job, "wamid.to-bo", T0 + ms(30_000)).await;
    let swept = sweep(&store, much_later).await;
    assert_eq!(
        (swept.turns, swept.reviews, swept.replies),
        (2, 1, 1),
        "{swept:?}"
    );
    assert_eq!(
        inbox_keys(&store).await,
        ["wamid.cy-1"],
        "the running turn's message stays"
    );
}

/// The sweep of a customer's old turn meets her new message, Meta's retry of the old one, and
/// her new turn, all at once: the new message is kept and answered once, the retry is not,
/// and the new turn's reply is written.
pub async fn a_sweep_racing_ingest_and_a_turn_loses_and_doubles_nothing(store: Arc<dyn Store>) {
    let sandboxed = Ending::Replied {
        parts: vec![ReplyPart::text("Hello Ada")],
        sandbox: true,
    };
    turn(
        &store,
        message("wamid.ada-1", ADA, "hi", T0),
        T0 + ms(20_000),
        sandboxed,
    )
    .await;
    let now = T0 + HOUR * 2;
    ingest(
        &store,
        vec![message("wamid.ada-2", ADA, "price?", now)],
        now,
    )
    .await;
    let claims = store
        .claim(now + POLICY.cap, ms(60_000), 10, None)
        .await
        .expect("claim");
    assert_eq!(claims.len(), 1);
    let running = &claims[0];

    let newer = now + POLICY.cap + ms(1_000);
    let retry = || ingest(&store, vec![message("wamid.ada-1", ADA, "hi", T0)], newer);
    let third = || {
        ingest(
            &store,
            vec![message("wamid.ada-3", ADA, "and delivery?", newer)],
            newer,
        )
    };
    let finish = || store.finish(running.batch.id, running.token, newer, reply("5,000 naira"));
    let (swept, retried, _, finished) =
        tokio::join!(sweep(&store, newer), retry(), third(), finish());
    finished.expect("the turn's write is kept");
    assert_eq!(retried.stored, 0, "the old message is never taken in again");
    assert_eq!(swept.turns, 1, "only the old turn: {swept:?}");

    let keys = inbox_keys(&store).await;
    assert_eq!(keys, ["wamid.ada-2", "wamid.ada-3"]);
    let replies: Vec<String> = store
        .outbox(None)
        .await
        .expect("outbox")
        .into_iter()
        .map(|e| e.text)
        .collect();
    assert_eq!(replies, ["5,000 naira"]);
    let next = store
        .claim(newer + POLICY.cap, ms(60_000), 10, None)
        .await
        .expect("claim");
    assert_eq!(next.len(), 1, "her third message has its turn");
    let ids: Vec<&str> = next[0]
        .batch
        .messages
        .iter()
        .map(|m| m.external_id.as_str())
        .collect();
    assert_eq!(ids, ["wamid.ada-3"]);
    // The agent's history goes on, with less: the turn before, not the swept one.
    let history: Vec<String> = store
        .history(next[0].batch.id, 10)
        .await
        .expect("history")
        .into_iter()
        .map(|h| h.text)
        .collect();
    assert_eq!(history, ["price?", "5,000 naira"]);
}

/// A web-chat question and its answer go with their turn; the browser sending it again is
/// refused, as after an erasure.
pub async fn an_expired_chat_question_goes_with_its_job(store: Arc<dyn Store>) {
    let Submitted::Job(receipt) = store
        .submit_chat(question("s-ada", "job-1"))
        .await
        .expect("kept")
    else {
        panic!("a job");
    };
    let claims = store
        .claim(T0 + ms(1_000), ms(60_000), 10, Some(Channel::Webchat))
        .await
        .expect("claim");
    store
        .finish(
            claims[0].batch.id,
            claims[0].token,
            T0 + ms(2_000),
            reply("Hello"),
        )
        .await
        .expect("answered");
    assert_eq!(
        store
            .chat_history("s-ada", None, 10)
            .await
            .expect("history")
            .len(),
        1
    );

    let later = T0 + HOUR + ms(5_000);
    let swept = sweep(&store, later).await;
    assert_eq!(
        (swept.chat_jobs, swept.messages, swept.replies),
        (1, 1, 1),
        "{swept:?}"
    );
    assert!(
        store
            .chat_history("s-ada", None, 10)
            .await
            .expect("history")
            .is_empty()
    );
    assert_eq!(
        store
            .chat_job(&receipt.job_id, T0 + ms(3_000))
            .await
            .expect("job"),
        None
    );
    let again = store.submit_chat(question("s-ada", "job-1")).await;
    assert!(matches!(again, Err(Error::NotFound)), "{again:?}");
}

/// The sweeper's lease: one holder until its time is up, renewed by that holder alone.
pub async fn one_node_holds_the_sweepers_lease_at_a_time(store: Arc<dyn Store>) {
    let lease = ms(10_000);
    let hold = |holder: &'static str, at: At| {
        let store = store.clone();
        async move {
            store
                .hold_lease("sweeper", holder, at, lease)
                .await
                .expect("lease")
        }
    };
    assert!(hold("a", T0).await);
    assert!(!hold("b", T0 + ms(1_000)).await);
    assert!(hold("a", T0 + ms(5_000)).await, "renewed");
    assert!(!hold("b", T0 + ms(14_000)).await, "the renewal counts");
    assert!(hold("b", T0 + ms(15_000)).await, "taken over once lapsed");
    assert!(!hold("a", T0 + ms(16_000)).await);
    // A node that stops lets it go: held until now.
    let let_go = store
        .hold_lease("sweeper", "b", T0 + ms(17_000), Duration::ZERO)
        .await
        .expect("lease");
    assert!(let_go);
    assert!(hold("a", T0 + ms(17_000)).await, "free at once");
}
