//! The turn handlers' role beyond claims and endings: when work is next due, what a turn reads
//! (history) and notes on the way (stage, transcript, usage), and the statistics of turns.

use std::sync::Arc;

use futures_util::future::join_all;

use sabi::clock::At;
use sabi::domain::{BatchMessage, Channel, InboundItem, ReplyPart, ReviewReason};
use sabi::store::{
    Ending, HOLD_PART, HistoryEntry, Holding, JobStatus, Resolution, SendClaim, SendResult,
    Speaker, Store, TurnStats, TurnUsage,
};

use super::fixtures::{accept, claim_only, open_reviews, replied_to, turn, voice};
use super::{POLICY, T0, ingest, message, question, reply};

use crate::helpers::ms;

async fn next_due(store: &Arc<dyn Store>) -> Option<At> {
    store.next_due().await.expect("next due")
}

pub async fn next_due_is_the_earliest_window_lease_or_retry(store: Arc<dyn Store>) {
    assert_eq!(next_due(&store).await, None, "nothing waits");
    ingest(&store, vec![message("wamid.n1", "c1", "a", T0)], T0).await;
    assert_eq!(next_due(&store).await, Some(T0 + POLICY.window));
    let at = T0 + ms(5_000);
    ingest(&store, vec![message("wamid.n2", "c1", "b", at)], at).await;
    assert_eq!(next_due(&store).await, Some(T0 + POLICY.cap), "capped");
    let at = T0 + ms(1_000);
    ingest(&store, vec![message("wamid.n3", "c2", "c", at)], at).await;
    assert_eq!(next_due(&store).await, Some(T0 + ms(11_000)), "c2's window");
    // c2 runs under a lease; c1 is still the earliest.
    let c2 = store
        .claim(T0 + ms(11_000), ms(30_000), 10, None)
        .await
        .expect("claim");
    assert_eq!(c2.len(), 1);
    assert_eq!(next_due(&store).await, Some(T0 + ms(12_000)));
    let c1 = store
        .claim(T0 + ms(12_000), ms(60_000), 10, None)
        .await
        .expect("claim");
    assert_eq!(
        next_due(&store).await,
        Some(T0 + ms(41_000)),
        "c2's lease ends"
    );
    // A message during c1's turn waits for it: its window is not due while the turn runs.
    let during = T0 + ms(20_000);
    let late = message("wamid.n4", "c1", "d", during);
    ingest(&store, vec![late], during).await;
    assert_eq!(next_due(&store).await, Some(T0 + ms(41_000)));
    // c2's lease lapsed unnoticed: still the earliest, until it is taken over.
    let c2 = store
        .claim(T0 + ms(45_000), ms(1_000), 10, None)
        .await
        .expect("claim");
    assert_eq!((c2.len(), c2[0].attempt), (1, 2));
    assert_eq!(next_due(&store).await, Some(T0 + ms(46_000)));
    let retry = Ending::RetryAt {
        at: T0 + ms(90_000),
        error: "agent down".into(),
    };
    let c2 = &c2[0];
    store
        .finish(c2.batch.id, c2.token, T0 + ms(45_500), retry)
        .await
        .expect("retry");
    assert_eq!(next_due(&store).await, Some(T0 + ms(72_000)), "c1's lease");
    let c1 = &c1[0];
    store
        .finish(c1.batch.id, c1.token, T0 + ms(50_000), reply("ok"))
        .await
        .expect("finish");
    assert_eq!(next_due(&store).await, Some(during + POLICY.window));
    let third = store
        .claim(T0 + ms(50_000), ms(60_000), 10, None)
        .await
        .expect("claim");
    end(&store, &third, T0 + ms(51_000)).await;
    assert_eq!(next_due(&store).await, Some(T0 + ms(90_000)), "c2's retry");
    let retried = store
        .claim(T0 + ms(90_000), ms(60_000), 10, None)
        .await
        .expect("claim");
    end(&store, &retried, T0 + ms(91_000)).await;
    assert_eq!(next_due(&store).await, None, "idle again");
}

/// Ends each claimed turn with a reply.
async fn end(store: &Arc<dyn Store>, claims: &[sabi::domain::Claim], at: At) {
    assert_eq!(claims.len(), 1, "one turn due");
    for claim in claims {
        store
            .finish(claim.batch.id, claim.token, at, reply("ok"))
            .await
            .expect("finish");
    }
}

fn usage(prompt_tokens: u64, completion_tokens: u64, cost: f64) -> TurnUsage {
    TurnUsage {
        prompt_tokens,
        completion_tokens,
        cost,
    }
}

/// Five turns of c1..c5 claimed together and ended one by one at T0 + 21..25 s: a local reply,
/// an agent's (two model calls), a review, a hand-off with a model call, and a retry (not ended,
/// with a model call). The batch of c1's local reply.
async fn five_turns(store: &Arc<dyn Store>) -> i64 {
    for c in ["c1", "c2", "c3", "c4", "c5"] {
        let item = message(&format!("wamid.st-{c}"), c, "hi", T0);
        ingest(store, vec![item], T0).await;
    }
    let mut claims = store
        .claim(T0 + ms(20_000), ms(60_000), 10, None)
        .await
        .expect("claim");
    assert_eq!(claims.len(), 5);
    claims.sort_by_key(|c| c.batch.conversation.customer.clone());
    let retry = Ending::RetryAt {
        at: T0 + ms(99_000),
        error: "not ended".into(),
    };
    let ends: [(&[TurnUsage], Ending); 5] = [
        (&[], reply("local")),
        (&[usage(100, 20, 0.25), usage(50, 5, 0.5)], reply("agent")),
        (&[], review_ending()),
        (&[usage(10, 1, 0.125)], handoff_ending()),
        (&[usage(7, 7, 1.0)], retry),
    ];
    for (n, (claim, (used, ending))) in claims.iter().zip(ends).enumerate() {
        for u in used {
            store.add_usage(claim.batch.id, *u).await.expect("usage");
        }
        let at = T0 + ms(21_000) + ms(1_000 * n as u64);
        store
            .finish(claim.batch.id, claim.token, at, ending)
            .await
            .expect("finish");
    }
    claims[0].batch.id
}

pub async fn turn_stats_tell_local_agent_and_people_turns_apart(store: Arc<dyn Store>) {
    let local = five_turns(&store).await;
    // Costs exact in binary: the backends add in other precisions (Redis in long double), so
    // that other costs may differ in their last bit.
    let stats = |since| {
        let store = store.clone();
        async move { store.turn_stats(since).await.expect("stats") }
    };
    let all = TurnStats {
        local: 1,
        agent: 1,
        people: 2,
        prompt_tokens: 160,
        completion_tokens: 26,
        cost: 0.875,
    };
    assert_eq!(stats(At::default()).await, all);
    assert_eq!(
        stats(T0 + ms(22_000)).await,
        TurnStats { local: 0, ..all },
        "ended at the cut-off counts"
    );
    let people_only = TurnStats {
        people: 2,
        prompt_tokens: 10,
        completion_tokens: 1,
        cost: 0.125,
        ..TurnStats::default()
    };
    assert_eq!(stats(T0 + ms(22_001)).await, people_only);
    assert_eq!(stats(T0 + ms(24_001)).await, TurnStats::default());
    // Usage written after its turn ended (the worker lost the lease) still counts: the turn
    // was the agent's.
    store
        .add_usage(local, usage(1, 1, 0.0625))
        .await
        .expect("usage");
    let later = TurnStats {
        local: 0,
        agent: 2,
        prompt_tokens: 161,
        completion_tokens: 27,
        cost: 0.9375,
        ..all
    };
    assert_eq!(stats(At::default()).await, later);
    assert_eq!(stats(T0 + ms(22_001)).await, people_only);
}

fn review_ending() -> Ending {
    Ending::Review {
        reason: ReviewReason::OutOfRetries,
        error: Some("agent down".into()),
    }
}

fn handoff_ending() -> Ending {
    Ending::Handoff {
        parts: vec![ReplyPart::text("A colleague will answer.")],
        sandbox: false,
        note: "asked for a person".into(),
    }
}

pub async fn a_running_turns_stage_shows_in_its_chat_job(store: Arc<dyn Store>) {
    store
        .submit_chat(question("s1", "job-1"))
        .await
        .expect("submitted");
    let job = |now| {
        let store = store.clone();
        async move {
            let job = store.chat_job("job-1", now).await.expect("job");
            let job = job.expect("the job is kept");
            (job.status, job.stage, job.answer)
        }
    };
    assert_eq!(job(T0).await, (JobStatus::Queued, None, None));
    let claim = store
        .claim(T0, ms(60_000), 10, None)
        .await
        .expect("claim")
        .remove(0);
    let batch = claim.batch.id;
    assert_eq!(job(T0).await, (JobStatus::Started, None, None));
    for stage in ["reading your question", "looking it up"] {
        store.set_stage(batch, stage).await.expect("stage");
        assert_eq!(
            job(T0).await,
            (JobStatus::Started, Some(stage.into()), None)
        );
    }
    store
        .finish(batch, claim.token, T0 + ms(1), reply("Here it is."))
        .await
        .expect("finish");
    let answered = (JobStatus::Finished, None, Some("Here it is.".into()));
    assert_eq!(job(T0 + ms(1)).await, answered);
    // A stage noted after the turn ended (a late tool) changes nothing.
    store.set_stage(batch, "too late").await.expect("stage");
    assert_eq!(job(T0 + ms(2)).await, answered);
}

pub async fn a_transcript_fills_in_only_a_message_without_text(store: Arc<dyn Store>) {
    let typed = message("wamid.v2", "c1", "typed", T0 + ms(1_000));
    ingest(&store, vec![voice("wamid.v1", "c1", T0), typed], T0).await;
    let claim = store
        .claim(T0 + ms(20_000), ms(60_000), 10, None)
        .await
        .expect("claim");
    let texts: Vec<_> = claim[0]
        .batch
        .messages
        .iter()
        .map(|m| m.text.clone())
        .collect();
    assert_eq!(texts, [None, Some("typed".into())]);
    // The turn transcribes the voice note; a second transcript, or one for a message with
    // text, or for another channel's message of that id, changes nothing.
    let keep = |channel, key: &'static str, text: &'static str| {
        let store = store.clone();
        async move {
            store
                .set_transcript(channel, key, text)
                .await
                .expect("kept")
        }
    };
    keep(Channel::Whatsapp, "wamid.v1", "I need a refund").await;
    keep(Channel::Whatsapp, "wamid.v1", "a second hearing").await;
    keep(Channel::Whatsapp, "wamid.v2", "not what was typed").await;
    keep(Channel::Webchat, "wamid.v1", "another channel").await;
    keep(Channel::Whatsapp, "wamid.none", "nothing to fill").await;
    let inbox = store.inbox(Default::default()).await.expect("inbox");
    let texts: Vec<_> = inbox.iter().map(|i| i.item.text.as_deref()).collect();
    assert_eq!(texts, [Some("I need a refund"), Some("typed")]);
    let (batch, token) = (claim[0].batch.id, claim[0].token);
    store
        .finish(batch, token, T0 + ms(21_000), reply("Refund started."))
        .await
        .expect("finish");
    let next = turn(
        &store,
        message("wamid.v3", "c1", "thanks", T0 + ms(30_000)),
        T0 + ms(42_000),
        reply("You're welcome."),
    )
    .await;
    let said: Vec<_> = store
        .history(next, 5)
        .await
        .expect("history")
        .into_iter()
        .map(|h| h.text)
        .collect();
    assert_eq!(said, ["I need a refund", "typed", "Refund started."]);
}

/// A line of history.
fn line(at: At, speaker: Speaker, text: &str) -> HistoryEntry {
    HistoryEntry {
        at,
        speaker,
        text: text.into(),
    }
}

/// Three ended turns of c1: a reply in two parts whose second failed for good (so it is not
/// history), a hand-off with a reply, and a turn too old to answer with a voice note in it.
/// Turn 2's batch, and each turn's lines of history.
async fn three_turns(store: &Arc<dyn Store>) -> (i64, [Vec<HistoryEntry>; 3]) {
    use Speaker::{Business, Customer, Note};
    let at1 = T0 + ms(20_000);
    let hello = message("wamid.y1", "c1", "hello", T0);
    let parts = replied_to(store, hello, &["Hi!", "How can I help?"], at1).await;
    let first = claim_only(store, parts[0], at1).await;
    accept(store, &first, "wamid.y-out1", at1).await;
    let second = claim_only(store, parts[1], at1 + ms(1)).await;
    let refused = SendResult::Review {
        reason: ReviewReason::SendFailed,
        code: Some(131_026),
        error: "refused".into(),
    };
    store
        .record_send(second.id, second.attempt, at1 + ms(1), refused)
        .await
        .expect("recorded");
    let at2 = T0 + ms(40_000);
    let asked = message("wamid.y2", "c1", "a person please", at2 - ms(12_000));
    let b2 = turn(store, asked, at2, handoff_ending()).await;
    let at3 = T0 + ms(60_000);
    let anyone = message("wamid.y3", "c1", "anyone?", at3 - ms(12_000));
    let heard = voice("wamid.y4", "c1", at3 - ms(11_000));
    ingest(store, vec![heard], at3 - ms(12_000)).await;
    turn(store, anyone, at3, too_old_ending()).await;
    let handed = "handed to a person (handoff_asked): asked for a person";
    let lines = [
        vec![
            line(at1 - ms(12_000), Customer, "hello"),
            line(at1, Business, "Hi!"),
        ],
        vec![
            line(at2 - ms(12_000), Customer, "a person please"),
            line(at2, Business, "A colleague will answer."),
            line(at2, Note, handed),
        ],
        vec![
            line(at3 - ms(12_000), Customer, "anyone?"),
            line(at3 - ms(12_000), Customer, "[audio]"),
            line(at3, Note, "handed to a person (too_old)"),
        ],
    ];
    (b2, lines)
}

pub async fn history_holds_the_turns_before_the_batch_with_notes(store: Arc<dyn Store>) {
    let (b2, [turn1, turn2, turn3]) = three_turns(&store).await;
    let at4 = T0 + ms(80_000);
    let still = message("wamid.y5", "c1", "still there?", at4 - ms(12_000));
    ingest(&store, vec![still], at4 - ms(12_000)).await;
    let b4 = store
        .claim(at4, ms(60_000), 10, None)
        .await
        .expect("claim")
        .remove(0);
    let history = |batch, turns| {
        let store = store.clone();
        async move { store.history(batch, turns).await.expect("history") }
    };
    let all = [turn1.clone(), turn2.clone(), turn3.clone()].concat();
    assert_eq!(history(b4.batch.id, 10).await, all);
    assert_eq!(history(b4.batch.id, 2).await, [turn2, turn3].concat());
    assert_eq!(history(b4.batch.id, 0).await, []);
    assert_eq!(history(b2, 10).await, turn1, "only what came before");
    // Its own turn's reply (kept in sandbox mode) is history for the next turn only.
    let kept = Ending::Replied {
        parts: vec![ReplyPart::text("Yes.")],
        sandbox: true,
    };
    store
        .finish(b4.batch.id, b4.token, at4 + ms(1), kept)
        .await
        .expect("finish");
    let ok = message("wamid.y6", "c1", "ok", at4);
    let b5 = turn(&store, ok, at4 + ms(20_000), reply("Bye.")).await;
    assert_eq!(history(b4.batch.id, 10).await, all);
    let last = [
        line(at4 - ms(12_000), Speaker::Customer, "still there?"),
        line(at4 + ms(1), Speaker::Business, "Yes."),
    ];
    assert_eq!(history(b5, 1).await, last);
}

fn too_old_ending() -> Ending {
    Ending::Review {
        reason: ReviewReason::TooOld,
        error: None,
    }
}

pub async fn a_batch_puts_messages_of_unknown_time_first(store: Arc<dyn Store>) {
    // Sent at +5 s, at an unknown time, and at +1 s, arriving in that order.
    let unknown = InboundItem {
        provider_ts: None,
        ..message("wamid.o2", "c1", "unknown", At::default())
    };
    let items = vec![
        message("wamid.o1", "c1", "late", T0 + ms(5_000)),
        unknown,
        message("wamid.o3", "c1", "early", T0 + ms(1_000)),
    ];
    ingest(&store, items, T0).await;
    let order = ["unknown", "early", "late"];
    let claim = store
        .claim(T0 + ms(20_000), ms(60_000), 10, None)
        .await
        .expect("claim");
    let texts = |messages: &[BatchMessage]| {
        messages
            .iter()
            .filter_map(|m| m.text.clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(texts(&claim[0].batch.messages), order, "the claimed batch");
    let (batch, token) = (claim[0].batch.id, claim[0].token);
    store
        .finish(batch, token, T0 + ms(21_000), too_old_ending())
        .await
        .expect("finish");
    let item = store
        .review_queue(Default::default())
        .await
        .expect("queue")
        .remove(0);
    assert_eq!(texts(&item.messages), order, "the review item");
    let next = message("wamid.o4", "c1", "hello?", T0 + ms(30_000));
    let next = turn(&store, next, T0 + ms(42_000), reply("Hi.")).await;
    let said: Vec<_> = store
        .history(next, 1)
        .await
        .expect("history")
        .into_iter()
        .map(|h| h.text)
        .collect();
    assert_eq!(
        said,
        [&order[..], &["handed to a person (too_old)"]].concat(),
        "its history"
    );
}

/// A surge: customers far back in the queue are told so. A held conversation's batch keeps its
/// messages and its place, is held once, loses no attempt, and its holding message leaves before
/// its reply; web chat is never held.
pub async fn a_held_batch_keeps_its_place_and_its_holding_message_goes_first(
    store: Arc<dyn Store>,
) {
    for (n, customer) in ["h1", "h2", "h3"].iter().enumerate() {
        let at = T0 + ms(n as u64 * 1_000);
        let item = message(&format!("wamid.h{n}"), customer, "how far?", at);
        ingest(&store, vec![item], at).await;
    }
    store
        .submit_chat(question("sess-hold", "q1"))
        .await
        .expect("submitted");
    let now = T0 + ms(60_000);
    // The longest due will be answered soon: the next one is held first.
    let second = store.hold(now, holding(1, 1)).await.expect("held");
    assert_eq!(second.len(), 1);
    let rest = store.hold(now, holding(0, 10)).await.expect("held");
    assert_eq!(rest.len(), 2, "a batch is held once; web chat never");
    let outbox = store.outbox(None).await.expect("outbox");
    assert_eq!(outbox.len(), 3);
    assert!(outbox.iter().all(|p| p.part == HOLD_PART));
    // What h1 writes while held joins its batch when it runs: answered together, not held again.
    let more = message("wamid.h9", "h1", "the blue one", now);
    ingest(&store, vec![more], now).await;
    let none = store.hold(now + ms(60_000), holding(0, 10)).await;
    assert_eq!(none.expect("held"), Vec::<i64>::new());
    // The held batches are claimed in their order, their first attempt, messages kept.
    let mut claims = Vec::new();
    for _ in 0..3 {
        let one = store
            .claim(now, ms(30_000), 1, Some(Channel::Whatsapp))
            .await;
        claims.extend(one.expect("claim"));
    }
    let customers: Vec<&str> = claims
        .iter()
        .map(|c| c.batch.conversation.customer.as_str())
        .collect();
    assert_eq!(customers, ["h1", "h2", "h3"]);
    assert!(claims.iter().all(|c| c.attempt == 1));
    let messages: Vec<usize> = claims.iter().map(|c| c.batch.messages.len()).collect();
    assert_eq!(messages, [2, 1, 1]);
    let ids: Vec<i64> = claims.iter().map(|c| c.batch.id).collect();
    assert_eq!(ids, [rest[0], second[0], rest[1]]);
    for c in &claims {
        store
            .finish(c.batch.id, c.token, now, reply("Your order left today."))
            .await
            .expect("finished");
    }
    // Per customer the holding message leaves first, then the reply.
    let first = store
        .claim_sends(SendClaim {
            now,
            lease: ms(10_000),
            limit: 10,
            halted: Vec::new(),
            unknown_wait: ms(60_000),
        })
        .await
        .expect("sends")
        .jobs;
    assert_eq!(first.len(), 3, "one head per customer");
    assert!(first.iter().all(|job| job.part == HOLD_PART), "{first:?}");
}

/// The routine lane: a conversation whose pending messages the router answers alone is claimed
/// by `claim_routine` ahead of model conversations due before it, and never held; one message
/// for the model puts its conversation in the model's lane until a batch takes it.
pub async fn routine_turns_are_claimed_first_and_never_held(store: Arc<dyn Store>) {
    let routine = |keys: &[&str]| keys.iter().map(|k| (*k).to_owned()).collect();
    let at = |s: u64| T0 + ms(s * 1_000);
    // Due first: a model conversation; then one of routine and model messages; then routine.
    ingest_lanes(
        &store,
        vec![message("wamid.l1", "m1", "my loan?", at(0))],
        at(0),
        routine(&[]),
    )
    .await;
    let mixed = vec![
        message("wamid.l2", "x1", "hello", at(1)),
        message("wamid.l3", "x1", "and my loan?", at(1)),
    ];
    ingest_lanes(&store, mixed, at(1), routine(&["wamid.l2"])).await;
    let quick = message("wamid.l4", "r1", "thanks", at(2));
    ingest_lanes(&store, vec![quick], at(2), routine(&["wamid.l4"])).await;
    let quick = message("wamid.l5", "r2", "hi", at(3));
    ingest_lanes(&store, vec![quick], at(3), routine(&["wamid.l5"])).await;
    let now = at(60);
    let held = store.hold(now, holding(0, 10)).await.expect("held");
    assert_eq!(
        held.len(),
        2,
        "the model's lane is held, the routine one is not"
    );
    let first = store
        .claim_routine(now, ms(30_000), 1)
        .await
        .expect("claim");
    let second = store
        .claim_routine(now, ms(30_000), 10)
        .await
        .expect("claim");
    let customers: Vec<&str> = first
        .iter()
        .chain(&second)
        .map(|c| c.batch.conversation.customer.as_str())
        .collect();
    assert_eq!(
        customers,
        ["r1", "r2"],
        "routine ones, the longest due first"
    );
    // r1 is answered; r2's turn goes to a person, who sends it back for another turn.
    let (r1, r2) = (&first[0], &second[0]);
    store
        .finish(r1.batch.id, r1.token, now, reply("You're welcome!"))
        .await
        .expect("finished");
    let review = Ending::Review {
        reason: ReviewReason::OutOfRetries,
        error: None,
    };
    store
        .finish(r2.batch.id, r2.token, now, review)
        .await
        .expect("finished");
    // r1 writes for the model now: its next turn waits in the model's lane.
    let later = at(70);
    ingest_lanes(
        &store,
        vec![message("wamid.l6", "r1", "my loan?", later)],
        later,
        routine(&[]),
    )
    .await;
    let after = at(120);
    let requeued = open_reviews(&store).await;
    assert_eq!(requeued.len(), 1, "{requeued:?}");
    store
        .resolve_review(requeued[0].id, after, Resolution::Requeue)
        .await
        .expect("requeued");
    let none = store
        .claim_routine(after, ms(30_000), 10)
        .await
        .expect("claim");
    assert!(none.is_empty(), "a turn sent back is the model's: {none:?}");
    let rest = store
        .claim(after, ms(30_000), 10, Some(Channel::Whatsapp))
        .await
        .expect("claim");
    let customers: Vec<&str> = rest
        .iter()
        .map(|c| c.batch.conversation.customer.as_str())
        .collect();
    assert_eq!(customers, ["m1", "x1", "r1", "r2"]);
}

async fn ingest_lanes(
    store: &Arc<dyn Store>,
    items: Vec<InboundItem>,
    at: At,
    routine: std::collections::HashSet<String>,
) {
    let delivery = sabi::store::Ingest {
        routine,
        items,
        quarantined: Vec::new(),
        received_at: at,
        policy: POLICY,
        pair_spacing: std::time::Duration::ZERO,
        human_hold: std::time::Duration::ZERO,
    };
    store.ingest(delivery).await.expect("ingest");
}

/// Claimers, routine claimers and holders at once (several nodes in a surge) never open two
/// batches for one customer, never claim a batch twice, and hold a batch once; every customer's
/// turn is claimed in the end.
pub async fn holders_and_claimers_at_once_take_each_customer_once(store: Arc<dyn Store>) {
    let customers: Vec<String> = (0..40).map(|n| format!("23480310000{n:02}")).collect();
    for (n, customer) in customers.iter().enumerate() {
        let item = message(&format!("wamid.race{n}"), customer, "my loan?", T0);
        // A quarter of them the router answers alone.
        let routine = match n % 4 {
            0 => [format!("wamid.race{n}")].into_iter().collect(),
            _ => Default::default(),
        };
        ingest_lanes(&store, vec![item], T0, routine).await;
    }
    let now = T0 + ms(60_000);
    let lease = ms(30_000);
    let (mut claimed, mut held) = (Vec::new(), Vec::new());
    for _ in 0..40 {
        if claimed.len() == customers.len() {
            break;
        }
        let claims = join_all((0..3).map(|_| store.claim(now, lease, 3, Some(Channel::Whatsapp))));
        let routine = join_all((0..2).map(|_| store.claim_routine(now, lease, 2)));
        let holds = join_all((0..2).map(|_| store.hold(now, holding(1, 4))));
        let (claims, routine, holds) = tokio::join!(claims, routine, holds);
        for c in claims.into_iter().chain(routine) {
            claimed.extend(c.expect("claimed"));
        }
        for h in holds {
            held.extend(h.expect("held"));
        }
    }
    let mut batches: Vec<i64> = claimed.iter().map(|c| c.batch.id).collect();
    batches.sort_unstable();
    batches.dedup();
    assert_eq!(batches.len(), claimed.len(), "no batch claimed twice");
    let mut who: Vec<&str> = claimed
        .iter()
        .map(|c| c.batch.conversation.customer.as_str())
        .collect();
    who.sort_unstable();
    who.dedup();
    assert_eq!(
        who.len(),
        customers.len(),
        "each customer once, and all of them"
    );
    assert!(claimed.iter().all(|c| c.batch.messages.len() == 1));
    let mut distinct = held.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(distinct.len(), held.len(), "a batch is held once");
}

/// A holding message for the `limit` due conversations after the `skip` longest due.
fn holding(skip: usize, limit: usize) -> Holding {
    let parts = vec![ReplyPart::text("We will answer you in about 5 minutes.")];
    Holding {
        skip,
        limit,
        parts,
        sandbox: false,
    }
}
