//! The broadcasts role: a broadcast and its audience kept at once (once per key, also when the
//! same key is used at once), listed and counted by state, and paused, resumed and cancelled as
//! the rulebook allows.

use std::sync::Arc;

use futures_util::future::join_all;
use sabi::clock::At;
use sabi::store::rules::consent::Source;
use sabi::store::rules::hours::Turn;
use sabi::store::{
    BroadcastState, Choice, Control, Error, Limits, LocalHours, NewBroadcast, NewRecipient,
    Outcome, PausedBy, QuietHours, RecipientClaim, RecipientJob, RecipientState, SkipReason, Store,
    TemplateNews, broadcast_callback,
};

use super::T0;
use super::fixtures::{deliver, preference, status, template_status, with_callback};
use crate::helpers::ms;

fn audience() -> Vec<NewRecipient> {
    let row = |to: &str, params: &[&str], line, skipped: Option<(SkipReason, &str)>| NewRecipient {
        to: to.into(),
        params: params.iter().map(|p| (*p).to_owned()).collect(),
        line: Some(line),
        skipped: skipped.map(|(reason, why)| (reason, why.to_owned())),
        tz: None,
    };
    vec![
        row("2348031234567", &["Ada", "Lagos"], 2, None),
        row(
            "not a number",
            &["Bola", "Ibadan"],
            3,
            Some((SkipReason::Invalid, "not a phone number")),
        ),
        row("2348039999999", &["Chi", "Enugu"], 4, None),
        row(
            "2348031234567",
            &["Ada", "Lagos"],
            5,
            Some((SkipReason::Duplicate, "the same number as line 2")),
        ),
    ]
}

pub(super) fn diwali(key: Option<&str>, start_at: At) -> NewBroadcast {
    NewBroadcast {
        key: key.map(str::to_owned),
        name: "Diwali eve".into(),
        template: "diwali_offer".into(),
        language: "en".into(),
        business: "100000000000001".into(),
        now: T0,
        start_at,
        until: Some(T0 + ms(86_400_000)),
        rate: 20,
        body: Some("Happy Diwali, {{1}}! {{2}} only tonight.".into()),
        hours: None,
        recipients: audience(),
    }
}

pub async fn a_broadcast_is_kept_once_per_key_with_its_audience(store: Arc<dyn Store>) {
    assert_eq!(store.broadcast(1).await.expect("read"), None);
    let attempts = join_all((0..5).map(|_| store.create_broadcast(diwali(Some("k-1"), T0)))).await;
    let made: Vec<_> = attempts.into_iter().map(|a| a.expect("kept")).collect();
    assert_eq!(
        made.iter().filter(|(_, created)| *created).count(),
        1,
        "one made"
    );
    let (b, _) = &made[0];
    assert!(
        made.iter().all(|(other, _)| other.id == b.id),
        "the same for every try"
    );
    assert_eq!(
        (
            b.state,
            b.recipients,
            b.counts["queued"],
            b.counts["skipped"],
            b.counts["accepted"]
        ),
        (BroadcastState::Running, 4, 2, 2, 0)
    );
    assert_eq!(b.key.as_deref(), Some("k-1"));
    assert_eq!(
        b.body.as_deref(),
        Some("Happy Diwali, {{1}}! {{2}} only tonight.")
    );
    assert_eq!((b.created_at, b.start_at, b.rate), (T0, T0, 20));
    assert_eq!(b.until, Some(T0 + ms(86_400_000)));
    let (later, created) = store
        .create_broadcast(diwali(None, T0 + ms(60_000)))
        .await
        .expect("kept");
    assert!(created);
    assert_eq!(later.state, BroadcastState::Scheduled, "it starts later");
    let listed: Vec<i64> = store
        .broadcasts(10)
        .await
        .expect("listed")
        .iter()
        .map(|b| b.id)
        .collect();
    assert_eq!(listed, [later.id, b.id], "the latest first");
    assert_eq!(store.broadcasts(1).await.expect("listed").len(), 1);
    assert_eq!(store.broadcast(b.id).await.expect("read").as_ref(), Some(b));

    let everyone = store
        .broadcast_recipients(b.id, None, 10)
        .await
        .expect("recipients");
    let rows: Vec<(&str, Option<u64>, RecipientState, Option<SkipReason>)> = everyone
        .iter()
        .map(|r| (r.to.as_str(), r.line, r.state, r.skipped))
        .collect();
    assert_eq!(
        rows,
        [
            ("2348031234567", Some(2), RecipientState::Queued, None),
            (
                "not a number",
                Some(3),
                RecipientState::Skipped,
                Some(SkipReason::Invalid)
            ),
            ("2348039999999", Some(4), RecipientState::Queued, None),
            (
                "2348031234567",
                Some(5),
                RecipientState::Skipped,
                Some(SkipReason::Duplicate)
            ),
        ],
        "in audience order"
    );
    assert_eq!(everyone[2].params, ["Chi", "Enugu"]);
    assert_eq!(
        everyone[3].error.as_deref(),
        Some("the same number as line 2")
    );
    let skipped = store
        .broadcast_recipients(b.id, Some(RecipientState::Skipped), 1)
        .await
        .expect("recipients");
    assert_eq!(skipped.len(), 1);
    assert_eq!(skipped[0].line, Some(3));
}

pub async fn broadcasts_pause_resume_and_cancel_as_the_rulebook_allows(store: Arc<dyn Store>) {
    let (b, _) = store
        .create_broadcast(diwali(None, T0))
        .await
        .expect("kept");
    let paused = store
        .control_broadcast(b.id, Control::Pause, Some("template paused by Meta".into()))
        .await
        .expect("paused");
    assert_eq!(paused.state, BroadcastState::Paused);
    assert_eq!(
        paused.paused_because.as_deref(),
        Some("template paused by Meta")
    );
    assert!(matches!(
        store.control_broadcast(b.id, Control::Pause, None).await,
        Err(Error::NotFound)
    ));
    let resumed = store
        .control_broadcast(b.id, Control::Resume, None)
        .await
        .expect("resumed");
    assert_eq!(
        (resumed.state, resumed.paused_because),
        (BroadcastState::Running, None)
    );
    let cancelled = store
        .control_broadcast(b.id, Control::Cancel, Some("ignored".into()))
        .await
        .expect("cancelled");
    assert_eq!(cancelled.state, BroadcastState::Cancelled);
    assert_eq!(
        (
            cancelled.counts["cancelled"],
            cancelled.counts["queued"],
            cancelled.counts["skipped"]
        ),
        (2, 0, 2),
        "the waiting recipients are cancelled with it; the skipped stay skipped"
    );
    assert_eq!(cancelled.paused_because, None);
    for control in [Control::Resume, Control::Pause, Control::Cancel] {
        assert!(matches!(
            store.control_broadcast(b.id, control, None).await,
            Err(Error::NotFound)
        ));
    }
    assert!(matches!(
        store.control_broadcast(9_999, Control::Cancel, None).await,
        Err(Error::NotFound)
    ));
}

pub(super) fn sends(now: At, limit: usize) -> RecipientClaim {
    RecipientClaim {
        now,
        lease: ms(10_000),
        limit,
        halted: Vec::new(),
        cooldown: ms(0),
        daily_limit: None,
    }
}

pub(crate) const LIMITS: Limits = Limits {
    max_failures: 3,
    max_holds: 2,
};

async fn record(store: &Arc<dyn Store>, job: &RecipientJob, now: At, outcome: Outcome) {
    store
        .record_recipient(job.id, job.attempt, now, outcome, LIMITS)
        .await
        .expect("recorded");
}

fn accepted(wamid: &str) -> Outcome {
    Outcome::Accepted {
        wamid: wamid.into(),
    }
}

pub async fn recipients_are_sent_at_most_once_and_broadcasts_end(store: Arc<dyn Store>) {
    let (b, _) = store
        .create_broadcast(diwali(None, T0))
        .await
        .expect("kept");
    let first = store.claim_recipients(sends(T0, 1)).await.expect("claimed");
    assert_eq!(first.len(), 1);
    let job = &first[0];
    assert_eq!(
        (
            job.broadcast_id,
            job.attempt,
            job.to.as_str(),
            job.template.as_str()
        ),
        (b.id, 1, "2348031234567", "diwali_offer")
    );
    assert_eq!(job.params, ["Ada", "Lagos"]);
    assert_eq!(job.language, "en");
    assert_eq!(job.business, "100000000000001");
    let second = store
        .claim_recipients(sends(T0, 10))
        .await
        .expect("claimed");
    assert_eq!(second.len(), 1, "the other waiting one; nobody twice");
    assert_eq!(second[0].to, "2348039999999");
    assert!(
        store
            .claim_recipients(sends(T0, 10))
            .await
            .expect("claimed")
            .is_empty()
    );

    record(&store, job, T0 + ms(100), accepted("wamid.b1")).await;
    assert!(matches!(
        store
            .record_recipient(job.id, job.attempt, T0, accepted("wamid.b1"), LIMITS)
            .await,
        Err(Error::LeaseLost)
    ));
    let held = Outcome::Held {
        until: T0 + ms(3_600_000),
        code: 131_049,
        error: "marketing limit".into(),
    };
    record(&store, &second[0], T0 + ms(100), held).await;
    assert!(
        store
            .claim_recipients(sends(T0 + ms(60_000), 10))
            .await
            .expect("claimed")
            .is_empty()
    );
    let again = store
        .claim_recipients(sends(T0 + ms(3_600_000), 10))
        .await
        .expect("claimed");
    assert_eq!(
        (again.len(), again[0].attempt),
        (1, 2),
        "after the hold, once more"
    );
    // Its sender dies: at the lease's end the send may have left, so it is never sent again.
    let lapsed = store
        .claim_recipients(sends(T0 + ms(3_610_000), 10))
        .await
        .expect("claimed");
    assert!(lapsed.is_empty());
    assert!(matches!(
        store
            .record_recipient(
                again[0].id,
                2,
                T0 + ms(3_611_000),
                accepted("wamid.late"),
                LIMITS
            )
            .await,
        Err(Error::LeaseLost)
    ));
    let ended = store.broadcast(b.id).await.expect("read").expect("kept");
    assert_eq!(
        ended.state,
        BroadcastState::Finished,
        "nobody left to send to"
    );
    assert_eq!(
        (
            ended.counts["accepted"],
            ended.counts["unknown"],
            ended.counts["skipped"]
        ),
        (1, 1, 2)
    );
}

pub async fn claimers_at_once_never_take_one_recipient_twice(store: Arc<dyn Store>) {
    let mut big = diwali(None, T0);
    big.recipients = (0..40)
        .map(|n| NewRecipient {
            to: format!("23480300000{n:02}"),
            params: vec![format!("customer {n}")],
            line: Some(n + 2),
            skipped: None,
            tz: None,
        })
        .collect();
    store.create_broadcast(big).await.expect("kept");
    let mut taken = Vec::new();
    while taken.len() < 40 {
        let claims = join_all((0..4).map(|_| store.claim_recipients(sends(T0, 7)))).await;
        let round: Vec<i64> = claims
            .into_iter()
            .flat_map(|c| c.expect("claimed"))
            .map(|j| j.id)
            .collect();
        assert!(!round.is_empty(), "every round claims some");
        taken.extend(round);
    }
    let mut distinct = taken.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(distinct.len(), taken.len(), "nobody twice");
    assert_eq!(taken.len(), 40);
}

pub async fn claimers_at_once_never_pass_the_messaging_limit(store: Arc<dyn Store>) {
    let mut big = diwali(None, T0);
    big.recipients = (0..40)
        .map(|n| NewRecipient {
            to: format!("23480300000{n:02}"),
            params: vec![format!("customer {n}")],
            line: Some(n + 2),
            skipped: None,
            tz: None,
        })
        .collect();
    store.create_broadcast(big).await.expect("kept");
    let limited = || RecipientClaim {
        daily_limit: Some(10),
        ..sends(T0, 7)
    };
    for _ in 0..3 {
        let claims = join_all((0..4).map(|_| store.claim_recipients(limited()))).await;
        for claim in claims {
            claim.expect("claimed");
        }
    }
    let b = store.broadcasts(1).await.expect("listed").remove(0);
    assert_eq!(b.counts["sending"], 10, "{b:?}");
}

pub async fn time_starts_and_ends_broadcasts_and_halted_or_paused_ones_wait(store: Arc<dyn Store>) {
    let (later, _) = store
        .create_broadcast(diwali(None, T0 + ms(60_000)))
        .await
        .expect("kept");
    let mut short = diwali(None, T0);
    short.until = Some(T0 + ms(30_000));
    let (short, _) = store.create_broadcast(short).await.expect("kept");
    let mut halted = sends(T0, 10);
    halted.halted = vec!["100000000000001".into()];
    assert!(
        store
            .claim_recipients(halted)
            .await
            .expect("claimed")
            .is_empty()
    );
    store
        .control_broadcast(short.id, Control::Pause, Some("a person".into()))
        .await
        .expect("paused");
    assert!(
        store
            .claim_recipients(sends(T0, 10))
            .await
            .expect("claimed")
            .is_empty(),
        "scheduled, paused"
    );
    let gone = store
        .claim_recipients(sends(T0 + ms(60_000), 10))
        .await
        .expect("claimed");
    assert!(gone.iter().all(|j| j.broadcast_id == later.id), "{gone:?}");
    assert_eq!(gone.len(), 2, "the later one started");
    let short = store
        .broadcast(short.id)
        .await
        .expect("read")
        .expect("kept");
    assert_eq!(short.state, BroadcastState::Cancelled, "past its deadline");
    assert_eq!((short.counts["cancelled"], short.counts["queued"]), (2, 0));
}

pub async fn statuses_move_broadcast_recipients_forward_only(store: Arc<dyn Store>) {
    let (b, _) = store
        .create_broadcast(diwali(None, T0))
        .await
        .expect("kept");
    let jobs = store
        .claim_recipients(sends(T0, 10))
        .await
        .expect("claimed");
    assert_eq!(jobs.len(), 2);
    record(&store, &jobs[0], T0 + ms(100), accepted("wamid.s1")).await;
    for (delivery, at) in [("delivered", 1_000), ("read", 2_000), ("sent", 3_000)] {
        let mut item = status("wamid.s1", delivery, T0 + ms(at));
        if delivery == "sent" {
            // The price comes late, on a status that moves nothing: it is kept all the same.
            item.facts["pricing_type"] = "regular".into();
        }
        deliver(&store, item, T0 + ms(at)).await;
    }
    // The second send's answer was lost: its status names it by the callback Sabi gave it.
    let mut named = with_callback(
        status("wamid.s2", "delivered", T0 + ms(4_000)),
        broadcast_callback(jobs[1].id, jobs[1].attempt),
    );
    named.facts["pricing_type"] = "free_entry_point".into();
    deliver(&store, named, T0 + ms(4_000)).await;
    let stale = with_callback(
        status("wamid.other", "read", T0 + ms(5_000)),
        broadcast_callback(jobs[1].id, jobs[1].attempt + 1),
    );
    deliver(&store, stale, T0 + ms(5_000)).await;
    let everyone = store
        .broadcast_recipients(b.id, None, 10)
        .await
        .expect("recipients");
    let states: Vec<(RecipientState, Option<&str>)> = everyone
        .iter()
        .filter(|r| r.skipped.is_none())
        .map(|r| (r.state, r.wamid.as_deref()))
        .collect();
    assert_eq!(
        states,
        [
            (RecipientState::Read, Some("wamid.s1")),
            (RecipientState::Delivered, Some("wamid.s2")),
        ],
        "a late sent does not undo read; a callback of another attempt names nothing"
    );
    let billed: Vec<Option<bool>> = everyone
        .iter()
        .filter(|r| r.skipped.is_none())
        .map(|r| r.billed)
        .collect();
    assert_eq!(billed, [Some(true), Some(false)], "as Meta priced them");
}

fn by_keyword(opted_out: bool, at: At) -> Choice {
    Choice {
        opted_out,
        source: Source::Keyword,
        at,
    }
}

async fn opted_out(store: &Arc<dyn Store>) -> Vec<String> {
    let asked = ["2348031234567", "2348039999999", "2348030000001"].map(str::to_owned);
    let mut out: Vec<String> = store
        .opted_out(&asked)
        .await
        .expect("read")
        .into_iter()
        .collect();
    out.sort();
    out
}

pub async fn opt_outs_keep_the_latest_choice_and_claims_skip_them(store: Arc<dyn Store>) {
    let ada = "2348031234567";
    assert!(store.choose(ada, by_keyword(true, T0)).await.expect("kept"));
    assert!(
        !store
            .choose(ada, by_keyword(true, T0 + ms(5)))
            .await
            .expect("kept"),
        "a repeat changes nothing"
    );
    assert!(
        !store
            .choose(ada, by_keyword(false, T0 - ms(1_000)))
            .await
            .expect("kept"),
        "an older choice changes nothing"
    );
    assert_eq!(opted_out(&store).await, [ada]);

    // Ada opted out after her broadcast was made: the claim skips her.
    let (b, _) = store
        .create_broadcast(diwali(None, T0))
        .await
        .expect("kept");
    let jobs = store
        .claim_recipients(sends(T0, 10))
        .await
        .expect("claimed");
    let to: Vec<&str> = jobs.iter().map(|j| j.to.as_str()).collect();
    assert_eq!(to, ["2348039999999"]);
    let ada_row = store
        .broadcast_recipients(b.id, Some(RecipientState::Skipped), 10)
        .await
        .expect("recipients")
        .into_iter()
        .find(|r| r.to == ada)
        .expect("skipped");
    assert_eq!(ada_row.skipped, Some(SkipReason::OptedOut));

    // Meta refuses Chi's with 131050: she opted out in WhatsApp, and it is kept.
    let refused = Outcome::Failed {
        code: Some(131_050),
        error: "the user stopped marketing messages".into(),
    };
    record(&store, &jobs[0], T0 + ms(10), refused).await;
    assert_eq!(opted_out(&store).await, [ada, "2348039999999"]);

    // Meta's user_preferences webhook: Ada resumes, a third customer stops.
    deliver(
        &store,
        preference(ada, "resume", T0 + ms(60_000)),
        T0 + ms(61_000),
    )
    .await;
    deliver(
        &store,
        preference("2348030000001", "stop", T0 + ms(60_000)),
        T0 + ms(61_000),
    )
    .await;
    assert_eq!(opted_out(&store).await, ["2348030000001", "2348039999999"]);
    // A START from Chi, after Meta's word: she is in again.
    assert!(
        store
            .choose("2348039999999", by_keyword(false, T0 + ms(120_000)))
            .await
            .expect("kept")
    );
    assert_eq!(opted_out(&store).await, ["2348030000001"]);
}

pub async fn a_stopped_template_pauses_its_broadcasts_and_its_approval_resumes_them(
    store: Arc<dyn Store>,
) {
    let (by_meta, _) = store
        .create_broadcast(diwali(None, T0))
        .await
        .expect("kept");
    let (by_person, _) = store
        .create_broadcast(diwali(None, T0))
        .await
        .expect("kept");
    let (french, _) = store
        .create_broadcast(NewBroadcast {
            language: "fr".into(),
            ..diwali(None, T0)
        })
        .await
        .expect("kept");
    store
        .control_broadcast(by_person.id, Control::Pause, Some("wrong price".into()))
        .await
        .expect("paused");
    let state = |id| {
        let store = store.clone();
        async move {
            let b = store.broadcast(id).await.expect("read").expect("kept");
            (b.state, b.paused_by)
        }
    };

    deliver(
        &store,
        template_status("diwali_offer", "en", "PAUSED", T0),
        T0,
    )
    .await;
    assert_eq!(
        state(by_meta.id).await,
        (BroadcastState::Paused, Some(PausedBy::Template))
    );
    let paused = store
        .broadcast(by_meta.id)
        .await
        .expect("read")
        .expect("kept");
    assert!(
        paused
            .paused_because
            .as_deref()
            .is_some_and(|why| why.contains("PAUSED")),
        "{paused:?}"
    );
    assert_eq!(
        state(by_person.id).await,
        (BroadcastState::Paused, Some(PausedBy::Person))
    );
    assert_eq!(
        state(french.id).await,
        (BroadcastState::Running, None),
        "another language"
    );
    let jobs = store
        .claim_recipients(sends(T0, 10))
        .await
        .expect("claimed");
    assert!(
        jobs.iter().all(|j| j.broadcast_id == french.id),
        "only the French one sends"
    );

    deliver(
        &store,
        template_status("diwali_offer", "en", "APPROVED", T0 + ms(1_000)),
        T0,
    )
    .await;
    assert_eq!(state(by_meta.id).await, (BroadcastState::Running, None));
    assert_eq!(
        state(by_person.id).await,
        (BroadcastState::Paused, Some(PausedBy::Person)),
        "a person's pause is theirs to end"
    );

    // A send's refusal (132016) says the same for every language when none is named.
    let moved = store
        .hear_template(TemplateNews {
            name: "diwali_offer".into(),
            language: None,
            approved: false,
            why: "Meta refused template diwali_offer: 132016".into(),
        })
        .await
        .expect("heard");
    let mut moved = moved;
    moved.sort_unstable();
    assert_eq!(moved, [by_meta.id, french.id]);
    assert_eq!(
        state(french.id).await,
        (BroadcastState::Paused, Some(PausedBy::Template))
    );
}

pub async fn the_cooldown_skips_and_the_messaging_limit_holds_back(store: Arc<dyn Store>) {
    const DAY: u64 = 86_400_000;
    let two = |name: &str| NewBroadcast {
        name: name.into(),
        until: None,
        ..diwali(None, T0)
    };
    let within = |now: At, limit: usize, daily: u64| RecipientClaim {
        cooldown: ms(DAY),
        daily_limit: Some(daily),
        ..sends(now, limit)
    };
    let (first, _) = store.create_broadcast(two("first")).await.expect("kept");
    // Meta lets the business reach one customer a day: the other waits.
    let jobs = store
        .claim_recipients(within(T0, 10, 1))
        .await
        .expect("claimed");
    assert_eq!(jobs.len(), 1, "one customer of headroom");
    let first_reached = |now: At| {
        let store = store.clone();
        async move {
            store
                .first_reached(now - ms(DAY))
                .await
                .expect("first reached")
        }
    };
    assert_eq!(first_reached(T0).await, None, "being sent has no time yet");
    assert!(
        store
            .claim_recipients(within(T0, 10, 1))
            .await
            .expect("claimed")
            .is_empty(),
        "the one being sent counts"
    );
    record(&store, &jobs[0], T0 + ms(10), accepted("wamid.c1")).await;
    // The place it took frees a day after the send.
    assert_eq!(first_reached(T0 + ms(DAY - 1_000)).await, Some(T0 + ms(10)));
    assert!(
        store
            .claim_recipients(within(T0 + ms(DAY - 1_000), 10, 1))
            .await
            .expect("claimed")
            .is_empty(),
        "no headroom within the day"
    );
    let next_day = store
        .claim_recipients(within(T0 + ms(DAY + 1_000), 10, 1))
        .await
        .expect("claimed");
    assert_eq!(next_day.len(), 1, "headroom again a day later");
    record(
        &store,
        &next_day[0],
        T0 + ms(DAY + 1_100),
        accepted("wamid.c2"),
    )
    .await;
    assert_eq!(
        first_reached(T0 + ms(DAY + 2_000)).await,
        Some(T0 + ms(DAY + 1_100)),
        "the first send's day is over"
    );
    assert_eq!(
        store
            .broadcast(first.id)
            .await
            .expect("read")
            .expect("kept")
            .counts["accepted"],
        2
    );

    // A second broadcast within the day skips the customer sent one; the first customer's day
    // is over.
    let (second, _) = store.create_broadcast(two("second")).await.expect("kept");
    let jobs = store
        .claim_recipients(within(T0 + ms(DAY + 2_000), 10, 100))
        .await
        .expect("claimed");
    let to: Vec<&str> = jobs.iter().map(|j| j.to.as_str()).collect();
    assert_eq!(to, [jobs_first_to(&first, &store).await.as_str()]);
    let skipped = store
        .broadcast_recipients(second.id, Some(RecipientState::Skipped), 10)
        .await
        .expect("recipients");
    let cooled: Vec<&str> = skipped
        .iter()
        .filter(|r| r.skipped == Some(SkipReason::Cooldown))
        .map(|r| r.to.as_str())
        .collect();
    assert_eq!(cooled.len(), 1, "{skipped:?}");
    assert_ne!(cooled[0], to[0]);
}

/// The customer the first broadcast reached first.
async fn jobs_first_to(b: &sabi::store::BroadcastView, store: &Arc<dyn Store>) -> String {
    let sent = store
        .broadcast_recipients(b.id, Some(RecipientState::Accepted), 10)
        .await
        .expect("recipients");
    sent.iter()
        .min_by_key(|r| r.id)
        .map(|r| r.to.clone())
        .expect("one sent")
}

pub async fn quiet_hours_and_wall_clock_times_hold_each_recipient_on_its_own_clock(
    store: Arc<dyn Store>,
) {
    let quiet = QuietHours::parse("21:00-08:00").ok();
    let hours = LocalHours::new("Africa/Lagos", quiet, None, None).expect("valid");
    let mut b = diwali(None, T0);
    b.until = None;
    b.hours = Some(hours.clone());
    // Ada reads the broadcast's zone; Chi is in Kolkata, 4 h 30 min ahead.
    b.recipients[2].tz = Some("Asia/Kolkata".into());
    // A minute when Lagos may be sent to and Kolkata is in its quiet hours (20:00 in Lagos is
    // 00:30 in Kolkata), and when the quiet hours end there.
    let minutes = (0..2 * 24 * 60).map(|m| T0 + ms(m * 60_000));
    let evening = minutes
        .clone()
        .find(|at| {
            hours.turn(None, *at) == Turn::Go
                && matches!(hours.turn(Some("Asia/Kolkata"), *at), Turn::Wait(_))
        })
        .expect("an evening");
    let Turn::Wait(kolkata_morning) = hours.turn(Some("Asia/Kolkata"), evening) else {
        unreachable!()
    };
    let (b, _) = store.create_broadcast(b).await.expect("kept");
    assert_eq!(
        (b.quiet_hours.as_deref(), b.tz.as_deref()),
        (Some("21:00-08:00"), Some("Africa/Lagos"))
    );
    let zones: Vec<Option<String>> = store
        .broadcast_recipients(b.id, None, 10)
        .await
        .expect("recipients")
        .into_iter()
        .map(|r| r.tz)
        .collect();
    assert_eq!(zones[2].as_deref(), Some("Asia/Kolkata"), "kept");
    let first = store
        .claim_recipients(sends(evening, 10))
        .await
        .expect("claimed");
    let to: Vec<&str> = first.iter().map(|j| j.to.as_str()).collect();
    assert_eq!(to, ["2348031234567"], "Lagos goes, Kolkata sleeps");
    assert!(
        store
            .claim_recipients(sends(kolkata_morning - ms(60_000), 10))
            .await
            .expect("claimed")
            .is_empty(),
        "nothing before the quiet hours end in Kolkata"
    );
    let later = store
        .claim_recipients(sends(kolkata_morning, 10))
        .await
        .expect("claimed");
    let to: Vec<&str> = later.iter().map(|j| j.to.as_str()).collect();
    assert_eq!(
        to,
        ["2348039999999"],
        "Kolkata goes once its quiet hours end"
    );

    // Those who wait never hold back one who may go: one claim passes over eight asleep.
    let mut crowd = diwali(None, T0);
    crowd.until = None;
    crowd.hours = Some(hours.clone());
    crowd.recipients = (0..9)
        .map(|n| NewRecipient {
            to: format!("23480400000{n:02}"),
            params: vec!["Ada".into(), "Lagos".into()],
            line: None,
            skipped: None,
            tz: (n < 8).then(|| "Asia/Kolkata".to_owned()),
        })
        .collect();
    store.create_broadcast(crowd).await.expect("kept");
    let next_evening = evening + ms(86_400_000);
    let one = store
        .claim_recipients(sends(next_evening, 1))
        .await
        .expect("claimed");
    let to: Vec<&str> = one.iter().map(|j| j.to.as_str()).collect();
    assert_eq!(to, ["2348040000008"]);

    // Nine to ten in the morning, on each recipient's clock: Accra goes an hour after Lagos,
    // and Kolkata's hour has passed by then.
    let nine = "2026-06-10T09:00".parse().expect("valid");
    let ten = "2026-06-10T10:00".parse().expect("valid");
    let hours = LocalHours::new("Africa/Lagos", None, Some(nine), Some(ten)).expect("valid");
    let mut morning = diwali(None, T0);
    morning.recipients = ["2348030000001", "233200000001", "919800000001"]
        .iter()
        .zip([None, Some("Africa/Accra"), Some("Asia/Kolkata")])
        .map(|(to, tz)| NewRecipient {
            to: (*to).into(),
            params: vec!["Ada".into(), "Lagos".into()],
            line: None,
            skipped: None,
            tz: tz.map(str::to_owned),
        })
        .collect();
    let span = hours.span([None, Some("Africa/Accra"), Some("Asia/Kolkata")]);
    (morning.start_at, morning.until) = (span.start.expect("a start"), span.until);
    morning.hours = Some(hours.clone());
    let (morning, _) = store.create_broadcast(morning).await.expect("kept");
    let Turn::Wait(lagos_nine) = hours.turn(None, span.start.expect("a start")) else {
        unreachable!()
    };
    let mut sent = Vec::new();
    for at in [lagos_nine, lagos_nine + ms(3_600_000)] {
        let jobs = store
            .claim_recipients(sends(at, 10))
            .await
            .expect("claimed");
        sent.push(jobs.into_iter().map(|j| j.to).collect::<Vec<_>>());
    }
    assert_eq!(sent, [vec!["2348030000001"], vec!["233200000001"]]);
    let cancelled = store
        .broadcast_recipients(morning.id, Some(RecipientState::Cancelled), 10)
        .await
        .expect("recipients");
    assert_eq!(cancelled.len(), 1, "Kolkata's hour passed");
    assert_eq!(cancelled[0].to, "919800000001");
}
