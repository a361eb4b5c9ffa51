//! PURE: amounts, account numbers, phone numbers, references and data sizes in a message.
//!
//! They are returned with the intent (for templates, tools and the agent) and masked in the
//! text the router classifies, so that no digit string ever decides an intent.

use std::sync::LazyLock;

use regex::bytes::{Regex, RegexBuilder};
use serde::Serialize;

/// What was found, in order of appearance.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Entities {
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub amounts: Vec<Amount>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub accounts: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub phones: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub references: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub data_sizes: Vec<String>,
    #[serde(skip)]
    pub spans: Vec<Span>,
}

impl Entities {
    pub fn is_empty(&self) -> bool {
        self.spans.is_empty()
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Amount {
    /// In whole currency units: `15k` is 15000.
    pub value: f64,
    pub currency: &'static str,
    pub text: String,
}

/// Where an entity sits in the message, and the word that replaces it.
#[derive(Debug, Clone, PartialEq)]
pub struct Span {
    pub start: usize,
    pub end: usize,
    pub placeholder: &'static str,
}

#[derive(Clone, Copy)]
enum Kind {
    Phone,
    Account,
    Amount,
    DataSize,
    Reference,
}

/// Patterns in priority order: an earlier kind wins an overlap.
static PATTERNS: LazyLock<Vec<(Kind, Regex)>> = LazyLock::new(|| {
    // ASCII classes and word boundaries keep every search on the fast DFA path; `₦` is matched
    // as its UTF-8 bytes.
    let compile = |p: &str| {
        RegexBuilder::new(p)
            .unicode(false)
            .build()
            .expect("entity patterns are valid")
    };
    vec![
        // Nigerian mobile numbers: 0 or +234, then 7/8/9, 0/1, and 8 more digits, spaces allowed.
        (
            Kind::Phone,
            compile(r"(?:\+?234[\s-]?|\b0)[789][01]\d[\s-]?\d{3}[\s-]?\d{4}\b"),
        ),
        // NUBAN account numbers: exactly ten digits.
        (Kind::Account, compile(r"\b\d{10}\b")),
        (
            Kind::DataSize,
            compile(r"(?i)\b\d+(?:\.\d+)?\s?(?:gb|mb|tb)\b"),
        ),
        (
            Kind::Amount,
            compile(
                r"(?i)(?:₦\s?|\bngn\s?|\bn)\d[\d,]*(?:\.\d+)?(?:\s?[km]\b)?|\b\d[\d,]*(?:\.\d+)?\s?(?:k\b|m\b|naira\b|bucks\b)|\b\d{1,3}(?:,\d{3})+\b",
            ),
        ),
        // Mixed letters and digits (FT24098XKZ1, LN-440912, ORD-77120-NG) and long digit runs.
        (
            Kind::Reference,
            compile(
                r"(?i)\b(?:[a-z]{1,5}[-]?\d[a-z0-9-]{3,}|\d{3,}[a-z][a-z0-9-]*)\b|#?\b\d{5,9}\b|\b\d{12,}\b",
            ),
        ),
    ]
});

pub fn extract(message: &str) -> Entities {
    let mut found: Vec<(Span, Kind)> = Vec::new();
    for (kind, pattern) in PATTERNS.iter() {
        for m in pattern.find_iter(message.as_bytes()) {
            let overlaps = found
                .iter()
                .any(|(s, _)| m.start() < s.end && s.start < m.end());
            if !overlaps {
                let span = Span {
                    start: m.start(),
                    end: m.end(),
                    placeholder: placeholder(*kind),
                };
                found.push((span, *kind));
            }
        }
    }
    found.sort_by_key(|(span, _)| span.start);
    let mut entities = Entities::default();
    for (span, kind) in found {
        // Matches start and end on ASCII characters or whole UTF-8 sequences.
        let Some(text) = message
            .get(span.start..span.end)
            .map(|t| t.trim().to_owned())
        else {
            continue;
        };
        match kind {
            Kind::Phone => entities.phones.push(digits(&text)),
            Kind::Account => entities.accounts.push(text),
            Kind::DataSize => entities
                .data_sizes
                .push(text.to_lowercase().replace(' ', "")),
            Kind::Reference => entities
                .references
                .push(text.trim_start_matches('#').to_owned()),
            Kind::Amount => {
                if let Some(value) = amount_value(&text) {
                    entities.amounts.push(Amount {
                        value,
                        currency: "NGN",
                        text,
                    });
                }
            }
        }
        entities.spans.push(span);
    }
    entities
}

fn placeholder(kind: Kind) -> &'static str {
    match kind {
        Kind::Phone => "<phone>",
        Kind::Account => "<account>",
        Kind::Amount => "<amount>",
        Kind::DataSize => "<datasize>",
        Kind::Reference => "<ref>",
    }
}

fn digits(text: &str) -> String {
    text.chars().filter(char::is_ascii_digit).collect()
}

/// `₦15,000` -> 15000, `N5k` -> 5000, `2.5m` -> 2500000, `1,500 naira` -> 1500.
fn amount_value(text: &str) -> Option<f64> {
    let lower = text.to_lowercase();
    let number: String = lower
        .chars()
        .skip_while(|c| !c.is_ascii_digit())
        .take_while(|c| c.is_ascii_digit() || *c == ',' || *c == '.')
        .filter(|c| *c != ',')
        .collect();
    let value: f64 = number.parse().ok()?;
    let rest = lower.trim_end_matches(|c: char| !c.is_alphanumeric());
    let multiplier = if rest.ends_with('k') {
        1_000.0
    } else if rest.ends_with('m') && !rest.ends_with("naira") {
        1_000_000.0
    } else {
        1.0
    };
    Some(value * multiplier)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn amounts(text: &str) -> Vec<f64> {
        extract(text).amounts.iter().map(|a| a.value).collect()
    }

    #[test]
    fn amounts_in_every_spelling() {
        assert_eq!(amounts("send 15k"), vec![15_000.0]);
        assert_eq!(amounts("₦15,000 and N5k"), vec![15_000.0, 5_000.0]);
        assert_eq!(amounts("a loan of 2.5m"), vec![2_500_000.0]);
        assert_eq!(
            amounts("Credit my line with 1,500 naira airtime"),
            vec![1_500.0]
        );
        assert_eq!(amounts("remove 3,500 two times"), vec![3_500.0]);
        assert!(amounts("buy 2GB data").is_empty());
    }

    #[test]
    fn numbers_and_references() {
        let e = extract(
            "bal for acct 0123456789, call 0706 111 2233 or +2348031234567, ref FT24098XKZ1",
        );
        assert_eq!(e.accounts, vec!["0123456789"]);
        assert_eq!(e.phones, vec!["07061112233", "2348031234567"]);
        assert_eq!(e.references, vec!["FT24098XKZ1"]);
        let e = extract("Loan status for application LN-440912 and order #48213");
        assert_eq!(e.references, vec!["LN-440912", "48213"]);
        assert_eq!(extract("buy 2GB data").data_sizes, vec!["2gb"]);
    }
}
