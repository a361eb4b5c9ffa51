//! What operators read (the inbox, the quarantine, the pipeline's gauges) and whether the store
//! can serve at all.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use sabi::clock::At;
use sabi::domain::{Channel, Claim, InboundItem, ItemKind, LeaseToken, Quarantined, ReviewReason};
use sabi::store::{
    Ending, Error, Gauges, InboxQuery, Ingest, Resolution, SendResult, Store, StoredItem,
    TurnStats, TurnUsage,
};

use super::fixtures::{WAIT, claim_sends, status};
use super::{POLICY, T0, ingest, message, question, reply};

use crate::helpers::ms;

pub async fn a_fresh_store_is_ready_and_holds_nothing(store: Arc<dyn Store>) {
    store.ready().await.expect("ready");
    reads_find_nothing(&store).await;
    // Writes that name nothing are refused, or change nothing.
    let token = LeaseToken(1);
    let lost = |r: Result<(), Error>| matches!(r, Err(Error::LeaseLost));
    assert!(lost(store.renew(1, token, T0, ms(1_000)).await));
    assert!(lost(store.finish(1, token, T0, reply("no")).await));
    assert!(lost(store.record_send(1, 1, T0, SendResult::Untried).await));
    let settled = store.resolve_review(1, T0, Resolution::Close).await;
    assert!(matches!(settled, Err(Error::NotFound)));
    store.set_stage(1, "nowhere").await.expect("stage");
    store
        .add_usage(1, TurnUsage::default())
        .await
        .expect("usage");
    store
        .set_transcript(Channel::Whatsapp, "wamid.none", "nothing")
        .await
        .expect("transcript");
    reads_find_nothing(&store).await;
    ingest(&store, vec![message("wamid.e1", "c1", "hi", T0)], T0).await;
    store.ready().await.expect("still ready");
}

async fn reads_find_nothing(store: &Arc<dyn Store>) {
    assert_eq!(store.next_due().await.expect("due"), None);
    assert_eq!(store.next_send_due(Vec::new()).await.expect("due"), None);
    assert_eq!(store.gauges(T0).await.expect("gauges"), Gauges::default());
    assert_eq!(
        store.turn_stats(At::default()).await.expect("stats"),
        TurnStats::default()
    );
    assert!(
        store
            .inbox(InboxQuery::default())
            .await
            .expect("inbox")
            .is_empty()
    );
    assert!(store.quarantine(None).await.expect("quarantine").is_empty());
    assert!(store.outbox(None).await.expect("outbox").is_empty());
    assert!(
        store
            .review_queue(Default::default())
            .await
            .expect("queue")
            .is_empty()
    );
    assert_eq!(store.review_item(1).await.expect("item"), None);
    assert!(
        store
            .conversations("c1", 10)
            .await
            .expect("views")
            .is_empty()
    );
    assert!(store.history(1, 10).await.expect("history").is_empty());
    assert_eq!(store.chat_job("job-1", T0).await.expect("job"), None);
    assert_eq!(
        store.chat_job_for_message("s1", "m1").await.expect("job"),
        None
    );
    assert!(
        store
            .chat_history("s1", None, 10)
            .await
            .expect("history")
            .is_empty()
    );
    assert_eq!(store.chat_queue_depth().await.expect("depth"), 0);
    assert!(
        store
            .claim(T0, ms(1_000), 10, None)
            .await
            .expect("claim")
            .is_empty()
    );
    assert!(claim_sends(store, T0).await.is_empty());
}

/// Three conversations due (two at T0 + 10 s, one at T0 + 15 s), claimed in two steps, with
/// the gauges at each: their claims.
async fn three_running(store: &Arc<dyn Store>) -> Vec<Claim> {
    let gauges = |now| async move { store.gauges(now).await.expect("gauges") };
    for (c, at) in [("c1", T0), ("c2", T0), ("c3", T0 + ms(5_000))] {
        let item = message(&format!("wamid.g-{c}"), c, "hi", T0);
        ingest(store, vec![item], at).await;
    }
    assert_eq!(gauges(T0 + ms(9_999)).await, Gauges::default());
    let due = Gauges {
        due: 2,
        ..Gauges::default()
    };
    assert_eq!(gauges(T0 + ms(10_000)).await, due);
    let first = store.claim(T0 + ms(10_000), ms(60_000), 1, None).await;
    let mut claims = first.expect("claim");
    let running = Gauges {
        due: 1,
        running: 1,
        ..Gauges::default()
    };
    assert_eq!(gauges(T0 + ms(10_000)).await, running);
    let rest = store.claim(T0 + ms(15_000), ms(60_000), 10, None).await;
    claims.extend(rest.expect("claim"));
    let all_running = Gauges {
        running: 3,
        ..Gauges::default()
    };
    assert_eq!(gauges(T0 + ms(15_000)).await, all_running);
    claims
}

pub async fn gauges_count_the_pipeline_as_it_moves(store: Arc<dyn Store>) {
    let gauges = |now| {
        let store = store.clone();
        async move { store.gauges(now).await.expect("gauges") }
    };
    let claims = three_running(&store).await;
    assert_eq!(claims.len(), 3);
    // One turn waits for its retry, one for a person, one replied in two parts.
    let endings = [
        Ending::RetryAt {
            at: T0 + ms(90_000),
            error: "agent down".into(),
        },
        Ending::Review {
            reason: ReviewReason::TooOld,
            error: None,
        },
        Ending::Replied {
            parts: vec![Default::default(), Default::default()],
            sandbox: false,
        },
    ];
    for (claim, ending) in claims.iter().zip(endings) {
        let (batch, token) = (claim.batch.id, claim.token);
        store
            .finish(batch, token, T0 + ms(16_000), ending)
            .await
            .expect("finish");
    }
    let ended = Gauges {
        waiting: 1,
        review: 1,
        queued_sends: 2,
        ..Gauges::default()
    };
    assert_eq!(gauges(T0 + ms(16_000)).await, ended);
    // A message for the conversation waiting on its retry is not due while its batch is open.
    let waiting = &claims[0].batch.conversation.customer;
    let again = message("wamid.g-again", waiting, "hello?", T0 + ms(16_000));
    ingest(&store, vec![again], T0 + ms(16_000)).await;
    assert_eq!(gauges(T0 + ms(60_000)).await, ended);
    sends_in_gauges(&store, ended, T0 + ms(16_000)).await;
}

/// The replied turn's first part sent with an unknown outcome, and then past its wait.
async fn sends_in_gauges(store: &Arc<dyn Store>, before: Gauges, at: At) {
    let jobs = claim_sends(store, at).await;
    assert_eq!(jobs.len(), 1, "the head part");
    let sending = Gauges {
        queued_sends: 1,
        ..before
    };
    assert_eq!(store.gauges(at).await.expect("gauges"), sending);
    let unknown = SendResult::Unknown {
        error: "timed out".into(),
        wait_until: at + WAIT,
    };
    let job = &jobs[0];
    store
        .record_send(job.id, job.attempt, at, unknown)
        .await
        .expect("recorded");
    let unsure = Gauges {
        unknown_sends: 1,
        ..sending
    };
    assert_eq!(store.gauges(at).await.expect("gauges"), unsure);
    // Past the wait: to a person, and the second part is claimed in the same step.
    let over = at + WAIT;
    assert_eq!(claim_sends(store, over).await.len(), 1);
    let reviewed = Gauges {
        review: before.review + 1,
        queued_sends: 0,
        unknown_sends: 0,
        ..before
    };
    assert_eq!(store.gauges(over).await.expect("gauges"), reviewed);
}

/// A message that asks for no turn (a reaction), and an error Meta reported, as the parser gives
/// them.
fn quiet_items() -> [InboundItem; 2] {
    let reaction = InboundItem {
        item_type: Some("reaction".into()),
        turn: None,
        ..message("wamid.i3", "c1", "👍", T0)
    };
    let error = InboundItem {
        kind: ItemKind::ValueError,
        dedupe_key: "error:abc:0".into(),
        customer: None,
        item_type: Some("131000".into()),
        text: Some("Something went wrong".into()),
        provider_ts: None,
        turn: None,
        facts: serde_json::json!({"kind": "value_error", "code": 131_000}),
        ..message("error", "c1", "", At::default())
    };
    [reaction, error]
}

/// Seven items of every kind and both channels, over three deliveries: all of them, as listed
/// with no filter.
async fn seven_items(store: &Arc<dyn Store>) -> Vec<StoredItem> {
    let [reaction, error] = quiet_items();
    let first = vec![
        message("wamid.i1", "c1", "one", T0),
        status("wamid.out", "sent", T0),
        error,
        message("wamid.i2", "c2", "two", T0),
        reaction,
    ];
    ingest(store, first, T0).await;
    let asked = store.submit_chat(question("s1", "job-1")).await;
    asked.expect("submitted");
    let last = message("wamid.i4", "c1", "three", T0);
    ingest(store, vec![last], T0 + ms(2)).await;
    let all = store.inbox(InboxQuery::default()).await.expect("inbox");
    let states: Vec<_> = all.iter().map(|i| i.state.as_str()).collect();
    let expected = [
        "pending", "recorded", "recorded", "pending", "skipped", "pending", "pending",
    ];
    assert_eq!(states, expected);
    assert!(all.windows(2).all(|w| w[0].seq < w[1].seq));
    all
}

fn query(
    kind: Option<ItemKind>,
    channel: Option<Channel>,
    after: Option<i64>,
    limit: Option<usize>,
) -> InboxQuery {
    InboxQuery {
        kind,
        channel,
        after,
        limit,
    }
}

/// What `query` lists, as places in `all`.
async fn listed(store: &Arc<dyn Store>, all: &[StoredItem], query: InboxQuery) -> Vec<usize> {
    let found = store.inbox(query).await.expect("inbox");
    let place = |seq| all.iter().position(|i| i.seq == seq).expect("in all");
    found.iter().map(|i| place(i.seq)).collect()
}

pub async fn the_inbox_filters_by_kind_channel_position_and_limit(store: Arc<dyn Store>) {
    let all = seven_items(&store).await;
    let (message, wa) = (Some(ItemKind::Message), Some(Channel::Whatsapp));
    let filters: [(InboxQuery, &[usize]); 11] = [
        (query(message, None, None, None), &[0, 3, 4, 5, 6]),
        (query(message, wa, None, None), &[0, 3, 4, 6]),
        (query(None, Some(Channel::Webchat), None, None), &[5]),
        (query(Some(ItemKind::Status), None, None, None), &[1]),
        (query(Some(ItemKind::ValueError), None, None, None), &[2]),
        (query(Some(ItemKind::FieldEvent), None, None, None), &[]),
        (query(None, None, Some(all[3].seq), None), &[4, 5, 6]),
        (query(message, None, Some(all[0].seq), Some(2)), &[3, 4]),
        (query(None, wa, Some(all[4].seq), Some(1)), &[6]),
        (query(None, None, None, Some(0)), &[]),
        (query(None, None, Some(all[6].seq), None), &[]),
    ];
    for (filter, places) in filters {
        let what = format!("{filter:?}");
        assert_eq!(listed(&store, &all, filter).await, places, "{what}");
    }
    filters_reach_past_a_long_run(&store, all[6].seq).await;
}

/// Messages behind hundreds of statuses: a backend that reads the inbox a page at a time must
/// still find them, and stop at the limit.
async fn filters_reach_past_a_long_run(store: &Arc<dyn Store>, after: i64) {
    let mut items: Vec<_> = (0..600)
        .map(|n| status(&format!("wamid.bulk{n}"), "sent", T0))
        .collect();
    for n in 5..8 {
        let text = format!("m{n}");
        items.push(message(
            &format!("wamid.i{n}"),
            "c3",
            &text,
            T0 + Duration::from_secs(n),
        ));
    }
    ingest(store, items, T0 + ms(3)).await;
    let page = InboxQuery {
        kind: Some(ItemKind::Message),
        after: Some(after),
        limit: Some(2),
        ..InboxQuery::default()
    };
    let found = store.inbox(page).await.expect("inbox");
    let texts: Vec<_> = found.iter().map(|i| i.item.text.as_deref()).collect();
    assert_eq!(texts, [Some("m5"), Some("m6")]);
    let whatsapp = InboxQuery {
        kind: Some(ItemKind::Message),
        channel: Some(Channel::Whatsapp),
        ..InboxQuery::default()
    };
    assert_eq!(store.inbox(whatsapp).await.expect("inbox").len(), 7);
    let rest = InboxQuery {
        after: Some(after),
        ..InboxQuery::default()
    };
    assert_eq!(store.inbox(rest).await.expect("inbox").len(), 603);
}

fn raw(channel: Channel, raw: &str, reason: &str) -> Quarantined {
    Quarantined {
        channel,
        reason: reason.into(),
        raw: raw.into(),
    }
}

async fn keep(store: &Arc<dyn Store>, quarantined: Vec<Quarantined>, at: At) -> usize {
    let delivery = Ingest {
        routine: Default::default(),
        items: Vec::new(),
        quarantined,
        received_at: at,
        policy: POLICY,
        pair_spacing: std::time::Duration::ZERO,
        human_hold: std::time::Duration::ZERO,
    };
    store.ingest(delivery).await.expect("ingest").quarantined
}

pub async fn quarantine_keeps_each_raw_part_once_in_arrival_order(store: Arc<dyn Store>) {
    let wa = Channel::Whatsapp;
    let first = vec![
        raw(wa, "{not json", "unparsable"),
        raw(wa, "{\"odd\":1}", "unknown shape"),
        raw(wa, "{not json", "the same bytes, another reason"),
    ];
    assert_eq!(keep(&store, first, T0).await, 2);
    // Redelivered at once, five times over, with one new part.
    let again = || {
        vec![
            raw(wa, "{\"odd\":1}", "unknown shape"),
            raw(wa, "[]", "empty"),
        ]
    };
    let kept = join_all((0..5).map(|n| keep(&store, again(), T0 + ms(1 + n)))).await;
    assert_eq!(kept.iter().sum::<usize>(), 1, "each part once");
    // The same bytes on another channel are that channel's.
    assert_eq!(
        keep(
            &store,
            vec![raw(Channel::Webchat, "{not json", "bad")],
            T0 + ms(10)
        )
        .await,
        1
    );
    let listed = store.quarantine(None).await.expect("quarantine");
    let seen: Vec<_> = listed
        .iter()
        .map(|q| {
            (
                q.quarantined.channel,
                q.quarantined.raw.as_str(),
                q.quarantined.reason.as_str(),
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            (wa, "{not json", "unparsable"),
            (wa, "{\"odd\":1}", "unknown shape"),
            (wa, "[]", "empty"),
            (Channel::Webchat, "{not json", "bad"),
        ]
    );
    assert_eq!(listed[0].received_at, T0);
    assert_eq!(listed[3].received_at, T0 + ms(10));
    assert_eq!(
        store.quarantine(Some(2)).await.expect("quarantine"),
        listed[..2]
    );
    // Many at once: all kept, listed in the order they came, however the backend pages.
    let bulk = (0..600)
        .map(|n| raw(wa, &format!("junk {n}"), "bulk"))
        .collect();
    assert_eq!(keep(&store, bulk, T0 + ms(20)).await, 600);
    let listed = store.quarantine(None).await.expect("quarantine");
    assert_eq!(listed.len(), 604);
    assert!(listed.windows(2).all(|w| w[0].id < w[1].id));
    let last = listed.last().map(|q| q.quarantined.raw.as_str());
    assert_eq!(last, Some("junk 599"));
    assert!(
        store
            .quarantine(Some(0))
            .await
            .expect("quarantine")
            .is_empty()
    );
}
