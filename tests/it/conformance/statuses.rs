//! Intake of Meta's status webhooks: each settles the reply part it names, by Meta's id or by
//! the callback data of a send whose answer was lost, in whatever order, however late, and
//! however often they come. The walk (`walk.rs`) tries one status on a part in each state;
//! these cases send whole sequences, as Meta does.

use std::sync::Arc;

use sabi::clock::At;
use sabi::store::{Delivery, PartKind, PartState, ReviewState, SendResult, Store, send_callback};

use super::fixtures::{
    LEASE, WAIT, accept, claim_only, claim_sends, deliver, open_reviews, part, rekeyed, replied,
    status, with_callback, with_code,
};
use super::{PAIR_SPACING, T0};

use crate::helpers::ms;

/// (state, delivery) of part `id` now.
async fn seen(store: &Arc<dyn Store>, id: i64) -> (PartState, Option<Delivery>) {
    let entry = part(store, id).await;
    (entry.state, entry.delivery)
}

pub async fn statuses_only_move_a_delivery_forward(store: Arc<dyn Store>) {
    let at = T0 + ms(20_000);
    let id = replied(&store, "c1", &["hello"], at).await[0];
    let job = claim_only(&store, id, at).await;
    // Meta's "delivered" overtakes the sender's answer: it names the send by its callback.
    let early = with_callback(
        status("wamid.s1", "delivered", at),
        send_callback(id, job.attempt),
    );
    deliver(&store, early, at + ms(1)).await;
    accept(&store, &job, "wamid.s1", at + ms(2)).await;
    let accepted = |d| (PartState::Accepted, Some(d));
    assert_eq!(seen(&store, id).await, accepted(Delivery::Delivered));
    // A late "sent" and a "failed" after delivery never take it back.
    let failed = with_code(status("wamid.s1", "failed", at), 131_026);
    for (late, when) in [
        (status("wamid.s1", "sent", at), at + ms(10)),
        (failed, at + ms(11)),
    ] {
        let what = late.dedupe_key.clone();
        deliver(&store, late, when).await;
        assert_eq!(
            seen(&store, id).await,
            accepted(Delivery::Delivered),
            "{what}"
        );
    }
    deliver(&store, status("wamid.s1", "read", at), at + ms(20)).await;
    assert_eq!(seen(&store, id).await, accepted(Delivery::Read));
    // The same status again: under its own key (a duplicate), under a new key, with other
    // content under the old key (an anomaly), and an older one under a new key.
    let again = deliver(&store, status("wamid.s1", "read", at), at + ms(30)).await;
    assert_eq!((again.stored, again.duplicates), (0, 1));
    let rekeyed_read = rekeyed(status("wamid.s1", "read", at), "wamid.s1:read:2");
    assert_eq!(deliver(&store, rekeyed_read, at + ms(31)).await.stored, 1);
    let changed = deliver(
        &store,
        status("wamid.s1", "read", at + ms(5_000)),
        at + ms(32),
    )
    .await;
    assert_eq!(changed.anomalies, 1);
    let older = rekeyed(status("wamid.s1", "delivered", at), "wamid.s1:delivered:2");
    deliver(&store, older, at + ms(33)).await;
    assert_eq!(seen(&store, id).await, accepted(Delivery::Read));
    // Another message's status carrying this send's callback names nothing of ours.
    let stray = with_callback(status("wamid.other", "failed", at), send_callback(id, 1));
    deliver(&store, with_code(stray, 131_026), at + ms(40)).await;
    assert_eq!(seen(&store, id).await, accepted(Delivery::Read));
    assert!(
        open_reviews(&store).await.is_empty(),
        "nothing for a person"
    );
    assert!(
        claim_sends(&store, at + WAIT * 2).await.is_empty(),
        "sent once"
    );
}

pub async fn a_failure_after_sent_goes_to_a_person_once(store: Arc<dyn Store>) {
    let at = T0 + ms(20_000);
    let ids = replied(&store, "c1", &["one", "two"], at).await;
    let job = claim_only(&store, ids[0], at).await;
    accept(&store, &job, "wamid.f1", at).await;
    deliver(&store, status("wamid.f1", "sent", at), at + ms(1)).await;
    // Failed in one delivery with its own duplicate: one review item, opened once.
    let failed = with_code(status("wamid.f1", "failed", at), 131_026);
    super::ingest(&store, vec![failed.clone(), failed], at + ms(2)).await;
    let entry = part(&store, ids[0]).await;
    assert_eq!(
        (entry.state, entry.delivery, entry.error_code),
        (PartState::Failed, Some(Delivery::Failed), Some(131_026))
    );
    let open = open_reviews(&store).await;
    assert_eq!(open.len(), 1);
    assert_eq!(
        (open[0].reason.as_str(), open[0].outbox_id, open[0].batch_id),
        ("send_failed", Some(ids[0]), entry.batch_id)
    );
    // A late "delivered" is noted, but the part stays with the person.
    deliver(&store, status("wamid.f1", "delivered", at), at + ms(3)).await;
    assert_eq!(
        seen(&store, ids[0]).await,
        (PartState::Failed, Some(Delivery::Delivered))
    );
    let item = store.review_item(open[0].id).await.expect("item");
    assert_eq!(item.map(|i| i.state), Some(ReviewState::Open));
    // A failed part is never sent again; the next one goes.
    let next = claim_sends(&store, at + ms(4)).await;
    assert_eq!(next.iter().map(|j| j.id).collect::<Vec<_>>(), [ids[1]]);
}

pub async fn a_closed_window_sends_the_template_once(store: Arc<dyn Store>) {
    let at = T0 + ms(20_000);
    let id = replied(&store, "c1", &["hello"], at).await[0];
    let text = claim_only(&store, id, at).await;
    accept(&store, &text, "wamid.w1", at).await;
    let closed = with_code(status("wamid.w1", "failed", at), 131_047);
    deliver(&store, closed, at + ms(1)).await;
    let entry = part(&store, id).await;
    assert_eq!(
        (entry.state, entry.kind, entry.wamid, entry.delivery),
        (PartState::WindowClosed, PartKind::Text, None, None)
    );
    assert_eq!(entry.error_code, Some(131_047));
    assert!(open_reviews(&store).await.is_empty());
    assert_eq!(
        store.gauges(at + ms(1)).await.expect("gauges").queued_sends,
        1
    );
    // The old text's late statuses name nothing now.
    deliver(&store, status("wamid.w1", "read", at), at + ms(2)).await;
    assert_eq!(seen(&store, id).await, (PartState::WindowClosed, None));
    // The template goes at once, as a new message with statuses of its own.
    let template = claim_only(&store, id, at + ms(3)).await;
    assert!(template.window_closed);
    assert_eq!(template.attempt, text.attempt + 1);
    accept(&store, &template, "wamid.w2", at + ms(3)).await;
    let entry = part(&store, id).await;
    assert_eq!(
        (entry.state, entry.kind, entry.wamid.as_deref()),
        (PartState::Accepted, PartKind::Template, Some("wamid.w2"))
    );
    let again = rekeyed(closed_again("wamid.w1", at), "wamid.w1:failed:2");
    deliver(&store, again, at + ms(4)).await;
    assert_eq!(part(&store, id).await.state, PartState::Accepted);
    // The template failing for the same reason goes to a person, not round again.
    deliver(&store, closed_again("wamid.w2", at), at + ms(5)).await;
    assert_eq!(part(&store, id).await.state, PartState::Failed);
    let open = open_reviews(&store).await;
    assert_eq!(
        open.iter().map(|r| r.reason.as_str()).collect::<Vec<_>>(),
        ["send_failed"]
    );
    assert!(claim_sends(&store, at + ms(6)).await.is_empty());
}

fn closed_again(wamid: &str, at: At) -> sabi::domain::InboundItem {
    with_code(status(wamid, "failed", at), 131_047)
}

pub async fn a_status_naming_an_unknown_send_settles_it(store: Arc<dyn Store>) {
    let at = T0 + ms(20_000);
    let ids = replied(&store, "c1", &["one", "two"], at).await;
    let job = claim_only(&store, ids[0], at).await;
    // A status that says nothing of delivery (Meta's "deleted") settles nothing, not even
    // when it names the send under way, nor later the unknown one.
    let deleted = || {
        let item = status("wamid.u1", "deleted", at);
        with_callback(item, send_callback(job.id, job.attempt))
    };
    deliver(&store, deleted(), at).await;
    let unknown = SendResult::Unknown {
        error: "timed out".into(),
        wait_until: at + WAIT,
    };
    store
        .record_send(job.id, job.attempt, at, unknown)
        .await
        .expect("recorded");
    deliver(&store, rekeyed(deleted(), "wamid.u1:deleted:2"), at + ms(1)).await;
    let entry = part(&store, ids[0]).await;
    assert_eq!((entry.state, entry.wamid), (PartState::Unknown, None));
    assert_eq!(store.gauges(at).await.expect("gauges").unknown_sends, 1);
    assert!(
        claim_sends(&store, at + ms(1)).await.is_empty(),
        "never sent again, and the next part waits behind it"
    );
    // A callback of another attempt names some other send.
    let stale = with_callback(status("wamid.u1", "sent", at), send_callback(job.id, 2));
    deliver(&store, stale, at + ms(2)).await;
    assert_eq!(part(&store, ids[0]).await.state, PartState::Unknown);
    let named = with_callback(
        status("wamid.u1", "delivered", at),
        send_callback(job.id, job.attempt),
    );
    deliver(&store, named, at + ms(3)).await;
    let entry = part(&store, ids[0]).await;
    assert_eq!(
        (entry.state, entry.wamid.as_deref(), entry.delivery),
        (
            PartState::Accepted,
            Some("wamid.u1"),
            Some(Delivery::Delivered)
        )
    );
    assert_eq!(entry.sent_at, Some(at + ms(3)));
    assert_eq!(
        store
            .gauges(at + ms(3))
            .await
            .expect("gauges")
            .unknown_sends,
        0
    );
    // From now on Meta's id names it; and the queue moves on.
    deliver(&store, status("wamid.u1", "read", at), at + ms(4)).await;
    assert_eq!(part(&store, ids[0]).await.delivery, Some(Delivery::Read));
    let next = claim_sends(&store, at + ms(5)).await;
    assert_eq!(next.iter().map(|j| j.id).collect::<Vec<_>>(), [ids[1]]);
    claim_sends(&store, at + WAIT + LEASE + ms(1)).await;
    assert!(
        open_reviews(&store).await.is_empty(),
        "settled, not waiting"
    );
}

pub async fn a_lapsed_send_with_no_status_goes_to_a_person(store: Arc<dyn Store>) {
    let at = T0 + ms(20_000);
    let ids = replied(&store, "c1", &["one", "two"], at).await;
    let job = claim_only(&store, ids[0], at).await;
    // The sender vanished mid-request: at its lease's end the send may have left.
    assert!(claim_sends(&store, at + LEASE - ms(1)).await.is_empty());
    assert_eq!(part(&store, ids[0]).await.state, PartState::Sending);
    let lapsed = at + LEASE;
    assert!(claim_sends(&store, lapsed).await.is_empty());
    assert_eq!(part(&store, ids[0]).await.state, PartState::Unknown);
    assert_eq!(
        store.next_send_due(Vec::new()).await.expect("due"),
        Some(lapsed + WAIT)
    );
    assert!(claim_sends(&store, lapsed + WAIT - ms(1)).await.is_empty());
    assert!(open_reviews(&store).await.is_empty());
    // No status came in time: a person decides; the next part goes in the same claim.
    let next = claim_sends(&store, lapsed + WAIT).await;
    assert_eq!(next.iter().map(|j| j.id).collect::<Vec<_>>(), [ids[1]]);
    let open = open_reviews(&store).await;
    assert_eq!(open.len(), 1);
    assert_eq!(
        (open[0].reason.as_str(), open[0].outbox_id),
        ("unknown_outcome", Some(ids[0]))
    );
    // A status after the wait settles it all the same, and takes it off the person's hands.
    let late = with_callback(
        status("wamid.l1", "delivered", at),
        send_callback(job.id, job.attempt),
    );
    deliver(&store, late, lapsed + WAIT + ms(1)).await;
    let entry = part(&store, ids[0]).await;
    assert_eq!(
        (entry.state, entry.wamid.as_deref(), entry.delivery),
        (
            PartState::Accepted,
            Some("wamid.l1"),
            Some(Delivery::Delivered)
        )
    );
    assert!(open_reviews(&store).await.is_empty());
    let item = store
        .review_item(open[0].id)
        .await
        .expect("review item")
        .expect("kept");
    assert_eq!(item.state, ReviewState::Closed);
    assert!(
        claim_sends(&store, lapsed + WAIT * 3).await.is_empty(),
        "never sent again"
    );
}

/// A status that says a part with a person failed leaves it with them.
pub async fn a_late_failure_stays_with_the_person(store: Arc<dyn Store>) {
    let at = T0 + ms(20_000);
    let id = replied(&store, "c1", &["one"], at).await[0];
    let job = claim_only(&store, id, at).await;
    claim_sends(&store, at + LEASE).await;
    claim_sends(&store, at + LEASE + WAIT).await;
    assert_eq!(part(&store, id).await.state, PartState::Review);
    let failed = with_callback(
        status("wamid.f1", "failed", at),
        send_callback(job.id, job.attempt),
    );
    deliver(
        &store,
        with_code(failed, 131_026),
        at + LEASE + WAIT + ms(1),
    )
    .await;
    let entry = part(&store, id).await;
    assert_eq!(
        (entry.state, entry.delivery),
        (PartState::Review, Some(Delivery::Failed))
    );
    assert_eq!(open_reviews(&store).await.len(), 1);
}

/// A status naming a send whose sender has not answered yet (or never will: it died) settles
/// it at once, not when the send lease lapses; the recipient's spacing holds from the status
/// (Meta took the message before it), and a sender that does answer adds its own.
pub async fn a_status_settles_a_send_under_way_at_once(store: Arc<dyn Store>) {
    let at = T0 + ms(20_000);
    let ids = replied(&store, "c1", &["one", "two"], at).await;
    let job = claim_only(&store, ids[0], at).await;
    let delivered = with_callback(
        status("wamid.w1", "delivered", at),
        send_callback(ids[0], job.attempt),
    );
    let settled_at = at + ms(10);
    deliver(&store, delivered, settled_at).await;
    assert_eq!(
        seen(&store, ids[0]).await,
        (PartState::Accepted, Some(Delivery::Delivered)),
        "settled by the status, before any lease lapses"
    );
    assert!(
        claim_sends(&store, settled_at + PAIR_SPACING - ms(1))
            .await
            .is_empty(),
        "the spacing holds from the status"
    );
    // The sender's own answer comes after all: the same send, with its spacing.
    let answer = SendResult::Accepted {
        wamid: "wamid.w1".into(),
        template: false,
        next_send_at: at + ms(4_000),
    };
    store
        .record_send(job.id, job.attempt, at + ms(20), answer)
        .await
        .expect("the same send");
    let lost = SendResult::Unknown {
        error: "timed out".into(),
        wait_until: at + WAIT,
    };
    let refused = store
        .record_send(job.id, job.attempt, at + ms(20), lost)
        .await;
    assert!(matches!(refused, Err(sabi::store::Error::LeaseLost)));
    assert!(claim_sends(&store, at + ms(3_999)).await.is_empty());
    let next = claim_sends(&store, at + ms(4_000)).await;
    assert_eq!(next.iter().map(|j| j.id).collect::<Vec<_>>(), [ids[1]]);
    assert_eq!(part(&store, ids[0]).await.state, PartState::Accepted);
}
