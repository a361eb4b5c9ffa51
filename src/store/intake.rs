//! Where a delivery enters the store: a webhook's or the web chat's items kept in one atomic, durable step (the ingress acknowledges after it).

use std::collections::HashSet;
use std::time::Duration;

use async_trait::async_trait;

use super::Result;
use crate::clock::At;
use crate::domain::{BatchPolicy, InboundItem, Quarantined};

/// One delivery to keep: everything in it is stored in one atomic, durable step.
#[derive(Debug, Clone)]
pub struct Ingest {
    pub items: Vec<InboundItem>,
    pub quarantined: Vec<Quarantined>,
    /// When the delivery arrived, Unix milliseconds.
    pub received_at: At,
    /// When the conversations this delivery touches become due.
    pub policy: BatchPolicy,
    /// The messages (by dedupe key) the router answers alone. Any other message puts its
    /// conversation in the model's lane until a batch takes it; the others' turns are claimed
    /// first ([`Turns::claim_routine`](super::Turns::claim_routine)).
    pub routine: HashSet<String>,
    /// The least time between two messages to one customer (`whatsapp.pair_spacing`): a status
    /// that settles a send before its sender answered holds the customer that long.
    pub pair_spacing: Duration,
    /// How long a person's reply from the WhatsApp Business app (an
    /// [`ItemKind::Echo`](crate::domain::ItemKind::Echo)) holds its conversation
    /// (`engine.human_hold`, see [`person_holds`](super::rules::review::person_holds)).
    pub human_hold: Duration,
}

/// What an ingest did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IngestReceipt {
    /// Items stored for the first time.
    pub stored: usize,
    /// Items already stored with the same content: changed nothing.
    pub duplicates: usize,
    /// Items already stored under the same key with other content: logged, changed nothing.
    pub anomalies: usize,
    /// Raw parts quarantined for the first time (a redelivered one is kept once).
    pub quarantined: usize,
    /// The earliest due time among the conversations this delivery scheduled.
    pub earliest_due: Option<At>,
    /// Messages whose statuses priced them for the first time, as (category, type): what
    /// `/metrics` counts ([`price`](super::rules::price)).
    pub priced: Vec<(String, String)>,
}

/// What the ingress keeps: deliveries, atomically and durably.
#[async_trait]
pub trait Intake: Send + Sync + 'static {
    /// Appends a delivery's items deduplicated on (channel, dedupe key), records its statuses
    /// and quarantined parts, and schedules each conversation it wakes. Atomic and durable.
    ///
    /// # Errors
    /// [`Error::Unavailable`](super::Error::Unavailable) when nothing could be committed: nothing of the delivery is kept.
    async fn ingest(&self, delivery: Ingest) -> Result<IngestReceipt>;
}
