//! The broadcasts role: a broadcast and its audience kept at once (once per key, also when the
//! same key is used at once), listed and counted by state, and paused, resumed and cancelled as
//! the rulebook allows.

use std::sync::Arc;

use futures_util::future::join_all;
use sabi::clock::At;
use sabi::store::{
    BroadcastState, Control, Error, NewBroadcast, NewRecipient, RecipientState, SkipReason, Store,
};

use super::T0;
use crate::helpers::ms;

fn audience() -> Vec<NewRecipient> {
    let row = |to: &str, params: &[&str], line, skipped: Option<(SkipReason, &str)>| NewRecipient {
        to: to.into(),
        params: params.iter().map(|p| (*p).to_owned()).collect(),
        line: Some(line),
        skipped: skipped.map(|(reason, why)| (reason, why.to_owned())),
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

fn diwali(key: Option<&str>, start_at: At) -> NewBroadcast {
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
