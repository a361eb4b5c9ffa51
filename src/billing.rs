//! What Meta charges for the WhatsApp messages its statuses priced: the store's ledger
//! ([`PriceCount`], see [`price`](crate::store::rules::price)) at `whatsapp.prices`. A cost is
//! given whole or not at all: when a charged message has no price, the cost is unknown and
//! the bill says how many messages and which categories and prefixes lack one.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use crate::config::MessagePrices;
use crate::store::PriceCount;

/// Messages priced in one category (or in all), charged and free, and what the charged cost.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Line {
    pub billed: u64,
    pub free: u64,
    /// `None` when a charged message has no price.
    pub cost: Option<f64>,
}

/// Charged messages without a price.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Unpriced {
    pub messages: u64,
    /// `<category> <prefix>` pairs with no price (prefixes are a number's first digits).
    pub missing: BTreeSet<String>,
}

/// The WhatsApp bill since some hour.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Bill {
    #[serde(flatten)]
    pub total: Line,
    pub currency: String,
    pub by_category: BTreeMap<String, Line>,
    pub unpriced: Unpriced,
}

/// The bill of `counts` at `prices`.
pub fn bill(counts: &[PriceCount], prices: &MessagePrices) -> Bill {
    let mut total = Line {
        cost: Some(0.0),
        ..Line::default()
    };
    let mut by_category: BTreeMap<String, Line> = BTreeMap::new();
    let mut unpriced = Unpriced::default();
    for count in counts {
        let line = by_category
            .entry(count.category.clone())
            .or_insert_with(|| Line {
                cost: Some(0.0),
                ..Line::default()
            });
        if !count.billed {
            line.free += count.messages;
            total.free += count.messages;
            continue;
        }
        line.billed += count.messages;
        total.billed += count.messages;
        match prices.of(&count.category, &count.prefix) {
            Some(price) => {
                let cost = price * count.messages as f64;
                line.cost = line.cost.map(|c| c + cost);
                total.cost = total.cost.map(|c| c + cost);
            }
            None => {
                line.cost = None;
                total.cost = None;
                unpriced.messages += count.messages;
                unpriced
                    .missing
                    .insert(format!("{} {}", count.category, count.prefix));
            }
        }
    }
    Bill {
        total,
        currency: prices.currency.clone(),
        by_category,
        unpriced,
    }
}

impl Bill {
    /// One line for people: counts, and the cost or why it is unknown.
    pub fn summary(&self) -> String {
        let Line { billed, free, cost } = &self.total;
        let counted = format!("{billed} billed, {free} free");
        match cost {
            Some(cost) => format!("{counted}, {cost:.4} {}", self.currency),
            None => format!(
                "{counted}; cost unknown: {} billed message(s) have no price in whatsapp.prices \
                 ({})",
                self.unpriced.messages,
                self.unpriced
                    .missing
                    .iter()
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn count(category: &str, prefix: &str, billed: bool, messages: u64) -> PriceCount {
        PriceCount {
            category: category.into(),
            prefix: prefix.into(),
            billed,
            messages,
        }
    }

    fn prices() -> MessagePrices {
        let mut by_category = BTreeMap::new();
        by_category.insert(
            "utility".to_owned(),
            BTreeMap::from([("234".to_owned(), 0.01), ("2348".to_owned(), 0.02)]),
        );
        by_category.insert(
            "marketing".to_owned(),
            BTreeMap::from([("44".to_owned(), 0.07)]),
        );
        MessagePrices {
            by_category,
            currency: "USD".into(),
        }
    }

    #[test]
    fn charged_messages_cost_their_longest_prefixs_price_and_free_ones_nothing() {
        let counts = [
            count("utility", "2348", true, 10),
            count("utility", "2347", true, 5),
            count("service", "2348", false, 40),
            count("marketing", "4477", true, 2),
        ];
        let bill = bill(&counts, &prices());
        assert_eq!(bill.total.billed, 17);
        assert_eq!(bill.total.free, 40);
        let cost = bill.total.cost.expect("priced");
        assert!((cost - (0.2 + 0.05 + 0.14)).abs() < 1e-9, "{cost}");
        assert_eq!(bill.by_category["service"].cost, Some(0.0));
        assert_eq!(bill.unpriced.messages, 0);
        assert!(bill.summary().ends_with("0.3900 USD"), "{}", bill.summary());
    }

    #[test]
    fn one_charged_message_without_a_price_makes_the_cost_unknown_never_partial() {
        let counts = [
            count("utility", "2348", true, 10),
            count("authentication", "2348", true, 3),
            count("marketing", "NG", true, 1),
        ];
        let bill = bill(&counts, &prices());
        assert_eq!(bill.total.cost, None);
        assert_eq!(bill.by_category["utility"].cost, Some(0.2));
        assert_eq!(bill.by_category["authentication"].cost, None);
        assert_eq!(bill.unpriced.messages, 4);
        let json = serde_json::to_value(&bill).expect("json");
        assert_eq!(json["cost"], serde_json::Value::Null);
        assert_eq!(json["billed"], 14);
        assert!(
            bill.summary()
                .contains("4 billed message(s) have no price in whatsapp.prices (authentication 2348, marketing NG)"),
            "{}",
            bill.summary()
        );
    }
}
