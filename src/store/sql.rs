//! What the two SQL stores share beyond their dialects: the driver-free reading of rows into
//! the rulebook's types. SQLite (`sqlite/`) and PostgreSQL (`postgres/`) load a row with their
//! driver, hand the values here, and ask the rulebook (`rules`) what follows.

use std::collections::HashMap;
use std::sync::LazyLock;
use std::time::Duration;

use super::rules::batch::{self, BatchState, Lease};
use super::rules::broadcast;
use super::rules::hours::{LocalHours, Turn};
use super::rules::item::{self, ItemState};
use super::rules::part::PartState;
use super::rules::review::{self, ReviewState};
use super::rules::sql_list;
use super::{ChatSubmission, Error, Ingest, Resolution, Result};
use crate::clock::At;
use crate::domain::{Channel, InboundItem, LeaseToken};

/// The columns [`fenced`] reads from a `batches` row, in its order: the state, the latest token,
/// the instant the state runs until, and the conversation.
pub(super) const LEASE_COLUMNS: &str =
    "state, token, coalesce(lease_until, next_attempt_at), conversation_id";

/// A batch's lease as its row keeps it.
pub(super) fn lease(state: &str, token: i64, until: Option<At>) -> Result<Lease> {
    let state = BatchState::parse(state)
        .ok_or_else(|| Error::Schema(format!("unknown batch state {state:?}")))?;
    Ok(Lease {
        state,
        token: LeaseToken(token),
        until: until.unwrap_or(At::from_millis(0)),
    })
}

/// The conversation a write carrying `token` speaks for, when the batch's lease (read by
/// [`LEASE_COLUMNS`]) still [`holds`](batch::holds) for it; anything else is a lost lease.
pub(super) fn fenced(row: Option<(Lease, i64)>, token: LeaseToken) -> Result<i64> {
    match row {
        Some((lease, conversation)) if batch::holds(&lease, token) => Ok(conversation),
        _ => Err(Error::LeaseLost),
    }
}

/// The lease a renewal by `token` at `now` leaves (see [`batch::renewed`]), to be saved; a lost
/// lease otherwise.
pub(super) fn renewed(
    row: Option<(Lease, i64)>,
    token: LeaseToken,
    now: At,
    span: Duration,
) -> Result<Lease> {
    row.and_then(|(lease, _)| batch::renewed(&lease, token, now, span))
        .ok_or(Error::LeaseLost)
}

/// The state a batch's messages take when its turn ends in `ended` (answered, or with a
/// person); an ending the item rulebook does not know leaves them in their turn.
pub(super) fn answered(ended: BatchState) -> ItemState {
    item::next(ItemState::Batched, item::Event::TurnEnded(ended)).unwrap_or(ItemState::Batched)
}

/// The state a reply part is written in, as an SQL expression over its conversation's
/// `channel` column, `sandbox` naming the parameter that says whether Sabi runs in sandbox mode:
/// served to the web page, only kept in sandbox mode, queued for the sender otherwise.
pub(super) fn first_state(channel: &str, sandbox: &str) -> String {
    format!(
        "CASE WHEN {channel} = '{webchat}' THEN '{served}' WHEN {sandbox} THEN '{kept}' \
         ELSE '{queued}' END",
        webchat = Channel::Webchat.as_str(),
        served = PartState::Served,
        kept = PartState::Sandbox,
        queued = PartState::Queued,
    )
}

/// The gauges' counts of work in each state, as SQL scalar subqueries in [`Gauges`](super::Gauges)'s order
/// after `due`: running and waiting batches, open review items, sends queued (a closed window's
/// included) and sends of unknown outcome.
pub(super) fn gauge_counts() -> [String; 5] {
    let count = |table: &str, states: &[&str]| {
        let states: Vec<String> = states.iter().map(|s| format!("'{s}'")).collect();
        format!(
            "(SELECT count(*) FROM {table} WHERE state IN ({}))",
            states.join(", ")
        )
    };
    [
        count("batches", &[BatchState::Running.as_str()]),
        count("batches", &[BatchState::Waiting.as_str()]),
        count("review", &[ReviewState::Open.as_str()]),
        count(
            "outbox",
            &[PartState::Queued.as_str(), PartState::WindowClosed.as_str()],
        ),
        count("outbox", &[PartState::Unknown.as_str()]),
    ]
}

/// A batch just opened, under its first token.
pub(super) struct Opened {
    pub batch: i64,
    pub conversation: i64,
    pub requeued: bool,
    /// Until when a person holds the conversation ([`rules::review::person_holds`]).
    pub held_until: Option<At>,
}

/// A due broadcast recipient: its id, broadcast and zone, and whether its customer opted out
/// or is inside the cooldown.
pub(super) type Due = (i64, i64, Option<String>, bool, bool);

/// What a claim does to a due recipient at `now`: its broadcast's hours (`hours`, by broadcast,
/// as the claim read them) and its customer's choices decide (see [`broadcast::on_claim`]).
pub(super) fn claim_event(
    hours: &HashMap<i64, Option<LocalHours>>,
    (_, broadcast_id, tz, opted_out, in_cooldown): &Due,
    now: At,
    lease: Duration,
) -> broadcast::Event<'static> {
    let turn = hours
        .get(broadcast_id)
        .and_then(Option::as_ref)
        .map_or(Turn::Go, |h| h.turn(tz.as_deref(), now));
    broadcast::on_claim(turn, *opted_out, *in_cooldown, lease)
}

/// A web-chat question as a delivery of its own: web chat has slots of its own, not the
/// routine lane, and no pairing.
pub(super) fn chat_delivery(item: InboundItem, s: &ChatSubmission) -> Ingest {
    Ingest {
        items: vec![item],
        quarantined: Vec::new(),
        received_at: s.now,
        policy: s.policy,
        routine: Default::default(),
        pair_spacing: Duration::ZERO,
        // A web page's person holds its chat through the open review item.
        human_hold: Duration::ZERO,
    }
}

/// The state a person's `resolution` leaves a review item in, read from its row (`state`, and
/// the `channel` of its conversation); `NotFound` when the item is settled already.
pub(super) fn settled(state: &str, channel: &str, resolution: &Resolution) -> Result<ReviewState> {
    let line = review::line(channel);
    ReviewState::parse(state)
        .and_then(|s| review::settle(s, resolution, line))
        .ok_or(Error::NotFound)
}

/// The columns where an erasure marker stands in for a forgotten customer: moved with the
/// marker secret (`rekey`).
pub(super) const MARKED: [(&str, &str); 2] = [
    ("consents", "customer"),
    ("broadcast_recipients", "recipient"),
];

/// The markers a [`MARKED`] column holds.
pub(super) fn markers_sql(table: &str, column: &str) -> String {
    format!("SELECT DISTINCT {column} FROM {table} WHERE {column} LIKE 'erased:%'")
}

/// Says what a rekey moved, when it moved anything.
pub(super) fn rekeyed(markers: u64, erased_keys: usize) {
    if markers + erased_keys as u64 > 0 {
        tracing::info!(
            markers,
            erased_keys,
            "erasure markers and erased keys moved under the marker secret"
        );
    }
}

/// Web-chat questions waiting for their turn, as an SQL condition on `inbox`: the condition of
/// the partial index both stores keep for it (`inbox_webchat_pending`), written out in full
/// so a query with it may use the index.
pub(super) static WEBCHAT_WAITING_SQL: LazyLock<String> = LazyLock::new(|| {
    format!(
        "state = '{pending}' AND channel = '{webchat}'",
        pending = ItemState::Pending,
        webchat = Channel::Webchat.as_str(),
    )
});

/// The reply parts a conversation's history leaves out, as an SQL list: the customer never
/// read them (failed, with a person, or stopped by a closed window).
pub(super) static UNSAID_SQL: LazyLock<String> = LazyLock::new(|| {
    sql_list(PartState::ALL, PartState::as_str, |state| {
        matches!(
            state,
            PartState::Failed | PartState::Review | PartState::WindowClosed
        )
    })
});
