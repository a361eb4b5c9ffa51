//! A broadcast's report: of those Meta took it for, how many it reached, read it, answered it
//! or are opted out now, the replies minute by minute after each send (the curve a surge of
//! replies follows), and what it cost: estimated from `broadcast.prices`, and actual from the
//! pricing Meta's statuses give each message (charged, or free when the customer came from an
//! ad), counted by Meta's pricing category (`marketing`, `marketing_lite` for messages sent
//! through the Marketing Messages API). A 131050 refusal is a failed recipient, not one sent.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;

use crate::store::{self, BroadcastView, Broadcasts, RecipientState, RecipientView};

/// Minutes of the reply curve; replies later are counted together.
const CURVE_MINUTES: usize = 60;
const MINUTE: Duration = Duration::from_secs(60);

#[derive(Debug, Serialize)]
pub struct Report {
    pub broadcast: BroadcastView,
    /// Recipients Meta took the template for.
    pub sent: u64,
    /// Shares of `sent`, from 0 to 1.
    pub rates: Rates,
    /// `reply_curve[m]`: customers whose first reply came `m` minutes after their send.
    pub reply_curve: Vec<u64>,
    /// ...and those who replied later than the curve's hour (within a week).
    pub replies_later: u64,
    pub cost: Cost,
}

#[derive(Debug, Default, Serialize)]
pub struct Rates {
    pub delivered: f64,
    pub read: f64,
    pub replied: f64,
    pub opted_out: f64,
    pub failed: f64,
}

#[derive(Debug, Serialize)]
pub struct Cost {
    pub currency: String,
    /// Every recipient not left out, at their country's price.
    pub estimated: f64,
    /// The messages Meta's statuses say it charges for, at their country's price.
    pub actual: f64,
    /// Messages Meta said it charges for, and those it said are free.
    pub billed: u64,
    /// The messages Meta charges for by its pricing category (`marketing`, `marketing_lite`,
    /// ...), and what they cost at their country's price.
    pub by_category: BTreeMap<String, Charged>,
    pub free: u64,
    /// Messages Meta took that no status has priced yet.
    pub awaiting_pricing: u64,
    /// Recipients whose country has no price in `broadcast.prices`: left out of both sums.
    pub unpriced: u64,
}

/// Charged messages of one pricing category.
#[derive(Debug, Default, Serialize)]
pub struct Charged {
    pub messages: u64,
    /// At their country's price; those without one count as messages only.
    pub cost: f64,
}

/// Prices by country prefix.
pub struct Prices<'a> {
    pub by_prefix: &'a BTreeMap<String, f64>,
    pub currency: &'a str,
}

impl Prices<'_> {
    /// The price for `number`: its longest matching prefix's.
    fn of(&self, number: &str) -> Option<f64> {
        (1..=number.len().min(4))
            .rev()
            .find_map(|n| self.by_prefix.get(&number[..n]).copied())
    }
}

/// The report of broadcast `id`; `None` when there is no such broadcast.
///
/// # Errors
/// When the store cannot be read.
pub async fn report(
    store: &dyn Broadcasts,
    id: i64,
    prices: &Prices<'_>,
) -> store::Result<Option<Report>> {
    let Some(broadcast) = store.broadcast(id).await? else {
        return Ok(None);
    };
    let recipients = store.broadcast_recipients(id, None, usize::MAX).await?;
    let sent: Vec<&RecipientView> = recipients.iter().filter(|r| r.sent_at.is_some()).collect();
    let numbers: Vec<String> = sent.iter().map(|r| r.to.clone()).collect();
    let opted_out = store.opted_out(&numbers).await?;
    let (reply_curve, replies_later) = curve(&sent);
    let share = |n: usize| match sent.len() {
        0 => 0.0,
        total => n as f64 / total as f64,
    };
    let count = |keep: &dyn Fn(&RecipientView) -> bool| sent.iter().filter(|r| keep(r)).count();
    let rates = Rates {
        delivered: share(count(&|r| delivered(r.state))),
        read: share(count(&|r| r.state == RecipientState::Read)),
        replied: share(count(&|r| r.replied_at.is_some())),
        opted_out: share(count(&|r| opted_out.contains(&r.to))),
        failed: share(count(&|r| r.state == RecipientState::Failed)),
    };
    Ok(Some(Report {
        sent: sent.len() as u64,
        rates,
        reply_curve,
        replies_later,
        cost: cost(&recipients, prices),
        broadcast,
    }))
}

/// Meta took it, and has not said it failed.
fn sent(state: RecipientState) -> bool {
    matches!(
        state,
        RecipientState::Accepted | RecipientState::Delivered | RecipientState::Read
    )
}

fn delivered(state: RecipientState) -> bool {
    matches!(state, RecipientState::Delivered | RecipientState::Read)
}

/// First replies by minute after the send.
fn curve(sent: &[&RecipientView]) -> (Vec<u64>, u64) {
    let mut minutes = vec![0; CURVE_MINUTES];
    let mut later = 0;
    for r in sent {
        let (Some(sent_at), Some(replied_at)) = (r.sent_at, r.replied_at) else {
            continue;
        };
        let after = replied_at.since(sent_at);
        let minute = usize::try_from(after.as_secs() / MINUTE.as_secs()).unwrap_or(usize::MAX);
        match minutes.get_mut(minute) {
            Some(n) => *n += 1,
            None => later += 1,
        }
    }
    (minutes, later)
}

fn cost(recipients: &[RecipientView], prices: &Prices<'_>) -> Cost {
    let mut cost = Cost {
        currency: prices.currency.to_owned(),
        estimated: 0.0,
        actual: 0.0,
        billed: 0,
        by_category: BTreeMap::new(),
        free: 0,
        awaiting_pricing: 0,
        unpriced: 0,
    };
    for r in recipients
        .iter()
        .filter(|r| r.state != RecipientState::Skipped)
    {
        let charged = (r.billed == Some(true)).then(|| {
            let category = r.pricing.clone().unwrap_or_else(|| "unknown".into());
            cost.by_category.entry(category).or_default()
        });
        if let Some(charged) = charged {
            charged.messages += 1;
            charged.cost += prices.of(&r.to).unwrap_or(0.0);
        }
        match r.billed {
            Some(true) => cost.billed += 1,
            Some(false) => cost.free += 1,
            None if sent(r.state) => cost.awaiting_pricing += 1,
            None => {}
        }
        let Some(price) = prices.of(&r.to) else {
            cost.unpriced += 1;
            continue;
        };
        cost.estimated += price;
        if r.billed == Some(true) {
            cost.actual += price;
        }
    }
    cost
}
