//! The pricing ledger: what Meta's statuses say each message costs (`store::rules::price`),
//! kept once per message however many statuses price it, in whatever order and at once, read
//! by whole hours, and gone at the messages' horizon.

use std::sync::Arc;
use std::time::Duration;

use sabi::clock::At;
use sabi::domain::InboundItem;
use sabi::store::{Horizons, PriceCount, Store, Swept};

use super::T0;
use super::fixtures::{deliver, status};

use crate::helpers::ms;

const HOUR: Duration = Duration::from_secs(3_600);

/// Meta's status `delivery` of `wamid` to a Nigerian number, priced as `category`/`kind`.
fn priced(wamid: &str, delivery: &str, category: &str, kind: &str, at: At) -> InboundItem {
    let mut item = status(wamid, delivery, at);
    item.customer = Some("2348012345678".into());
    let facts = &mut item.facts;
    facts["recipient_id"] = "2348012345678".into();
    facts["pricing_model"] = "PMP".into();
    facts["pricing_category"] = category.into();
    facts["pricing_type"] = kind.into();
    item
}

fn count(category: &str, billed: bool, messages: u64) -> PriceCount {
    PriceCount {
        category: category.into(),
        prefix: "2348".into(),
        billed,
        messages,
    }
}

async fn counts(store: &Arc<dyn Store>, since: At) -> Vec<PriceCount> {
    store.price_counts(since).await.expect("price counts")
}

pub async fn a_priced_message_is_counted_once_with_its_latest_pricing(store: Arc<dyn Store>) {
    let at = T0;
    let first = deliver(
        &store,
        priced("wamid.p1", "sent", "service", "free_customer_service", at),
        at,
    )
    .await;
    assert_eq!(
        first.priced,
        vec![("service".to_owned(), "free_customer_service".to_owned())]
    );
    // Meta priced it again, differently, on delivery; a redelivery and the read change nothing.
    for (delivery, ms_later) in [("delivered", 1), ("delivered", 2), ("read", 3)] {
        let later = at + ms(ms_later);
        let receipt = deliver(
            &store,
            priced("wamid.p1", delivery, "utility", "regular", later),
            later,
        )
        .await;
        assert!(receipt.priced.is_empty(), "{delivery}: {receipt:?}");
    }
    assert_eq!(
        counts(&store, At::default()).await,
        vec![count("utility", true, 1)]
    );
    // Conversation-based pricing charges a conversation once, whichever message opened it.
    for (n, wamid) in ["wamid.c1", "wamid.c2"].iter().enumerate() {
        let mut item = priced(wamid, "sent", "marketing", "regular", at);
        item.facts["pricing_model"] = "CBP".into();
        item.facts["conversation_id"] = "conv.1".into();
        let receipt = deliver(&store, item, at + ms(10 + n as u64)).await;
        assert_eq!(receipt.priced.len(), usize::from(n == 0), "{wamid}");
    }
    assert_eq!(
        counts(&store, At::default()).await,
        vec![count("marketing", true, 1), count("utility", true, 1)]
    );
}

pub async fn statuses_of_one_message_at_once_count_it_once(store: Arc<dyn Store>) {
    let deliveries = ["sent", "delivered", "read"].map(|delivery| {
        let store = store.clone();
        async move {
            let item = priced("wamid.race", delivery, "utility", "regular", T0);
            deliver(&store, item, T0).await
        }
    });
    let receipts = futures_util::future::join_all(deliveries).await;
    let new: usize = receipts.iter().map(|r| r.priced.len()).sum();
    assert_eq!(new, 1, "{receipts:?}");
    assert_eq!(
        counts(&store, At::default()).await,
        vec![count("utility", true, 1)]
    );
}

pub async fn the_ledger_reads_whole_hours_and_goes_at_the_messages_horizon(store: Arc<dyn Store>) {
    let next_hour = T0 + HOUR;
    deliver(
        &store,
        priced("wamid.h1", "sent", "utility", "regular", T0),
        T0,
    )
    .await;
    deliver(
        &store,
        priced("wamid.h2", "sent", "utility", "free_entry_point", next_hour),
        next_hour,
    )
    .await;
    // Since a minute after T0: T0's hour is read whole, as every store counts by the hour.
    assert_eq!(
        counts(&store, T0 + ms(60_000)).await,
        vec![count("utility", false, 1), count("utility", true, 1)]
    );
    assert_eq!(
        counts(&store, next_hour + ms(60_000)).await,
        vec![count("utility", false, 1)]
    );
    let horizons = Horizons {
        messages: HOUR,
        ..Horizons::default()
    };
    // An hour past T0 the horizon falls inside T0's hour: that hour stays whole.
    assert_eq!(sweep(&store, &horizons, T0 + HOUR).await.prices, 0);
    let swept = sweep(&store, &horizons, next_hour + HOUR * 2).await;
    assert_eq!(swept.prices, 2);
    assert!(counts(&store, At::default()).await.is_empty());
}

async fn sweep(store: &Arc<dyn Store>, horizons: &Horizons, now: At) -> Swept {
    let mut total = Swept::default();
    loop {
        let swept = store.sweep(horizons, now, 1).await.expect("sweep");
        if swept.is_empty() {
            return total;
        }
        total.add(&swept);
    }
}
