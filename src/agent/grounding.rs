//! PURE: the figures in a text, and whether each figure of a model's answer comes from
//! somewhere the turn can point to (DESIGN.md, invariant 8).
//!
//! A figure is an amount (a number with a currency mark or word, or a `k`/`m` suffix, 0
//! included), any number of 3 or more digits, a date, a token that mixes letters with 3 or more
//! digits (a reference), or a percentage other than 100%. Small bare numbers ("24 hours",
//! "option 2") are not figures. Figures compare by what they mean, not how they are written:
//! `N45,000`, `₦45,000`, `NGN 45000`, `45k` and `45,000.00` are one amount; a phone or account
//! number is its last 10 digits; a date is its day and month, in any common spelling; a
//! reference is its letters and digits, or its digits alone (`ORD-48213` and `#48213`). An
//! amount may group its thousands with spaces (`₦45 000`). A template's placeholder where a
//! figure should be (`[insert balance]`, `{{amount}}`, `<amount>`) is a figure no source
//! grounds: the model had no figure to give.
//!
//! [`Ground`] holds what the sources said (every number in them, small ones too, since a tool
//! may answer `{"balance": 0}`); [`Ground::ungrounded`] names the answer's figures it lacks.

use std::collections::HashSet;
use std::sync::LazyLock;

use regex::{Captures, Regex};

/// One meaning a figure can have; two texts agree on a figure when they share its key.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Key {
    /// A quantity in a canonical spelling: `45000`, `52340.1`, `0`.
    Number(String),
    /// A digit string with a leading zero (`0042`, the `0000` of "ending 0000"): an identifier,
    /// not the quantity it would parse to.
    Digits(String),
    /// A phone or account number (10 or more digits): its last 10.
    Long(String),
    /// A day as (month, day); the year is not compared.
    Day(u8, u8),
    /// A reference's letters and digits, upper-cased: `ORD48213`.
    Reference(String),
}

/// A figure found in a text.
#[derive(Debug, Clone, PartialEq)]
pub struct Figure {
    /// As written.
    pub text: String,
    /// Whether an answer must ground it (a small bare number need not).
    pub counts: bool,
    /// The ways to read it: it is grounded when every key of one reading is known.
    readings: Vec<Vec<Key>>,
    /// What a source holding it also gives: its year, the last 4 digits of a long number
    /// ("ending 6789"), an amount's whole units.
    implied: Vec<Key>,
}

/// What the sources of a turn said: the figures an answer may use.
#[derive(Debug, Clone, Default)]
pub struct Ground {
    known: HashSet<Key>,
}

impl Ground {
    /// Adds every figure of `text` (a prompt message, a tool's answer, configured words).
    pub fn add(&mut self, text: &str) {
        for figure in figures(text) {
            self.known.extend(figure.readings.into_iter().flatten());
            self.known.extend(figure.implied);
        }
    }

    /// The figures of `answer` that no source gave, as written, each once.
    pub fn ungrounded(&self, answer: &str) -> Vec<String> {
        let mut loose: Vec<String> = Vec::new();
        for figure in figures(answer) {
            let grounded = figure
                .readings
                .iter()
                .any(|reading| reading.iter().all(|key| self.known.contains(key)));
            if figure.counts && !grounded && !loose.contains(&figure.text) {
                loose.push(figure.text);
            }
        }
        loose
    }
}

const MONTHS: &str = "jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|june?|july?|aug(?:ust)?|sep(?:t(?:ember)?)?|oct(?:ober)?|nov(?:ember)?|dec(?:ember)?";
/// A number as written: thousands grouped by commas only in threes, so "1,2,3" is three.
const NUMBER: &str = r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?";
/// An amount as written after or before its currency: thousands grouped by commas or spaces.
const AMOUNT: &str =
    r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d{1,3}(?:[ \x{a0}\x{202f}]\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?";
const MULTIPLIER: &str = r"k|m|bn|thousand|million|billion";

/// A placeholder left where a figure should be.
static PLACEHOLDER: LazyLock<Regex> = LazyLock::new(|| {
    regex(
        r"(?i)\[\s*(?:insert|enter|add|your|customer'?s?|account|amount|balance|name|date|number|reference|x{2,})\b[^\]\n\d]{0,40}\]|\{\{\s*[a-z_][a-z0-9_ ]{0,30}\}\}|<\s*(?:insert|amount|balance|date|number|reference)\b[^>\n]{0,30}>",
    )
});

static ISO_DATE: LazyLock<Regex> =
    LazyLock::new(|| regex(r"\b(\d{4})-(\d{1,2})-(\d{1,2})(?:T|\b)"));
static NUMERIC_DATE: LazyLock<Regex> =
    LazyLock::new(|| regex(r"\b(\d{1,2})[/.-](\d{1,2})[/.-](\d{4}|\d{2})\b"));
static DAY_MONTH: LazyLock<Regex> = LazyLock::new(|| {
    regex(&format!(
        r"(?i)\b(\d{{1,2}})(?:st|nd|rd|th)?(?:\s+of)?\s+({MONTHS})\b(?:,?\s+(\d{{4}})\b)?"
    ))
});
static MONTH_DAY: LazyLock<Regex> = LazyLock::new(|| {
    regex(&format!(
        r"(?i)\b({MONTHS})\b\.?\s+(\d{{1,2}})(?:st|nd|rd|th)?\b(?:,?\s+(\d{{4}})\b)?"
    ))
});
/// Digits with single separators between them, as phone and account numbers are written.
static DIGIT_RUN: LazyLock<Regex> = LazyLock::new(|| regex(r"\(?\+?\d(?:(?:[ .\-]|\) ?)?\d)*"));
static CURRENCY_FIRST: LazyLock<Regex> = LazyLock::new(|| {
    regex(&format!(
        r"(?i)(?:₦|\bngn|\busd|us\$|\$|£|€|\bn)\s?({AMOUNT})(?:\s?({MULTIPLIER})\b)?"
    ))
});
static CURRENCY_AFTER: LazyLock<Regex> = LazyLock::new(|| {
    regex(&format!(
        r"(?i)\b({AMOUNT})(?:\s?({MULTIPLIER}))?\s?(?:naira|ngn|usd|dollars?|kobo)\b"
    ))
});
static MULTIPLIED: LazyLock<Regex> =
    LazyLock::new(|| regex(&format!(r"(?i)\b({NUMBER})\s?({MULTIPLIER})\b")));
static PERCENT: LazyLock<Regex> =
    LazyLock::new(|| regex(&format!(r"(?i)\b({NUMBER})\s?(?:%|per ?cent\b)")));
static TOKEN: LazyLock<Regex> = LazyLock::new(|| regex(r"[A-Za-z0-9][A-Za-z0-9_\-]*"));
static BARE: LazyLock<Regex> = LazyLock::new(|| regex(NUMBER));

fn regex(pattern: &str) -> Regex {
    Regex::new(pattern).expect("figure patterns are valid")
}

/// Every figure in `text` (small bare numbers too, marked as not counting), in order.
pub fn figures(text: &str) -> Vec<Figure> {
    let mut scan = Scan {
        text: text.to_owned(),
        found: Vec::new(),
    };
    scan.each(&PLACEHOLDER, |_| Some(Figure::new(true, Vec::new())));
    scan.each(&ISO_DATE, |c| day(&c[2], &c[3], Some(&c[1])));
    scan.each(&NUMERIC_DATE, |c| {
        // Day first as in Nigeria, or month first: either day agrees.
        let year = c.get(3).map(|y| y.as_str());
        match (day(&c[2], &c[1], year), day(&c[1], &c[2], year)) {
            (Some(mut either), Some(other)) => {
                either.readings.extend(other.readings);
                Some(either)
            }
            (either, other) => either.or(other),
        }
    });
    scan.each(&DAY_MONTH, |c| {
        day(
            &month(&c[2])?.to_string(),
            &c[1],
            c.get(3).map(|y| y.as_str()),
        )
    });
    scan.each(&MONTH_DAY, |c| {
        day(
            &month(&c[1])?.to_string(),
            &c[2],
            c.get(3).map(|y| y.as_str()),
        )
    });
    scan.each(&DIGIT_RUN, |c| long_number(&c[0]));
    for pattern in [&CURRENCY_FIRST, &CURRENCY_AFTER, &MULTIPLIED] {
        scan.each(pattern, |c| {
            let multiplier = c.get(2).map(|m| m.as_str());
            let figure = Figure::new(true, vec![vec![Key::Number(quantity(&c[1], multiplier)?)]]);
            // The whole units of `1.5m` are not 1 or 2.
            Some(match multiplier {
                None => figure.whole(&c[1]),
                Some(_) => figure,
            })
        });
    }
    scan.each(&PERCENT, |c| {
        let value = quantity(&c[1], None)?;
        Some(Figure::new(value != "100", vec![vec![Key::Number(value)]]))
    });
    scan.each(&TOKEN, |c| reference(&c[0]));
    scan.each(&BARE, |c| {
        let written = &c[0];
        let whole = written.split('.').next().unwrap_or(written);
        let counts = whole.chars().filter(char::is_ascii_digit).count() >= 3;
        let mut figure = Figure::new(counts, vec![vec![number(written)?]]).whole(written);
        // "100,200" in a JSON array is two numbers as well.
        if written.contains(',') {
            figure.implied.extend(
                written
                    .split(',')
                    .filter_map(|part| number(part.split('.').next().unwrap_or(part))),
            );
        }
        Some(figure)
    });
    scan.found.sort_by_key(|(at, _)| *at);
    scan.found.into_iter().map(|(_, figure)| figure).collect()
}

/// The text still to read (what was read is blanked, byte for byte) and what was found in it.
struct Scan {
    text: String,
    found: Vec<(usize, Figure)>,
}

impl Scan {
    /// Reads each match of `pattern` as a figure with `read`; a match it reads is blanked.
    fn each(&mut self, pattern: &Regex, read: impl Fn(&Captures<'_>) -> Option<Figure>) {
        let mut taken = Vec::new();
        for captures in pattern.captures_iter(&self.text) {
            let whole = captures.get(0).expect("a match has group 0");
            if let Some(mut figure) = read(&captures) {
                figure.text = whole.as_str().trim().to_owned();
                self.found.push((whole.start(), figure));
                taken.push(whole.range());
            }
        }
        for range in taken {
            let blank: String = self.text[range.clone()]
                .chars()
                .map(|c| " ".repeat(c.len_utf8()))
                .collect();
            self.text.replace_range(range, &blank);
        }
    }
}

impl Figure {
    fn new(counts: bool, readings: Vec<Vec<Key>>) -> Figure {
        Figure {
            text: String::new(),
            counts,
            readings,
            implied: Vec::new(),
        }
    }

    /// An amount with a fraction also gives its whole units, as a reply may round them.
    fn whole(mut self, written: &str) -> Figure {
        let written: String = written
            .chars()
            .filter(|c| !matches!(c, ' ' | '\u{a0}' | '\u{202f}'))
            .collect();
        if let Some((units, _)) = written.split_once('.') {
            self.implied.extend(number(units));
            if let Ok(value) = written.replace(',', "").parse::<f64>() {
                self.implied.push(Key::Number(format!("{}", value.round())));
            }
        }
        self
    }
}

/// A day from its month and day numbers (and year, which a source also gives as a number).
fn day(month: &str, day: &str, year: Option<&str>) -> Option<Figure> {
    let (month, day): (u8, u8) = (month.parse().ok()?, day.parse().ok()?);
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) {
        return None;
    }
    let mut figure = Figure::new(true, vec![vec![Key::Day(month, day)]]);
    figure.implied.extend(year.and_then(number));
    Some(figure)
}

fn month(name: &str) -> Option<u8> {
    let name = name.to_ascii_lowercase();
    let at = [
        "jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec",
    ]
    .iter()
    .position(|m| name.starts_with(m))?;
    u8::try_from(at + 1).ok()
}

/// 10 or more digits written as one number (a phone or account number), or nothing: shorter
/// runs are read again as amounts, dates and numbers.
fn long_number(written: &str) -> Option<Figure> {
    let digits: String = written.chars().filter(char::is_ascii_digit).collect();
    let separators = written
        .chars()
        .filter(|c| !c.is_ascii_digit() && *c != '+')
        .collect::<String>();
    // "12345678.90" is an amount with its fraction, not a number to call.
    if digits.len() < 10 || separators == "." {
        return None;
    }
    let last = |n: usize| digits[digits.len() - n..].to_owned();
    // Or several numbers side by side ("5000 0123456789"), each grounded on its own.
    let parts: Option<Vec<Key>> = written
        .split(|c: char| !c.is_ascii_digit())
        .filter(|part| !part.is_empty())
        .map(|part| match part.len() {
            10.. => Some(Key::Long(part[part.len() - 10..].to_owned())),
            _ => number(part),
        })
        .collect();
    let mut readings = vec![vec![Key::Long(last(10))]];
    readings.extend(parts);
    let mut figure = Figure::new(true, readings);
    figure.implied.extend(number(&last(4)));
    Some(figure)
}

/// A token that mixes letters with 3 or more digits: its letters and digits, or its digits.
fn reference(token: &str) -> Option<Figure> {
    let digits: String = token.chars().filter(char::is_ascii_digit).collect();
    if digits.len() < 3 || !token.chars().any(|c| c.is_ascii_alphabetic()) {
        return None;
    }
    let letters_and_digits: String = token
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .collect::<String>()
        .to_ascii_uppercase();
    Some(Figure::new(
        true,
        vec![
            vec![Key::Reference(letters_and_digits)],
            vec![number(&digits)?],
        ],
    ))
}

/// A number as written (`45,000.00`, `0042`) as its key.
fn number(written: &str) -> Option<Key> {
    let plain = written.replace(',', "");
    let (units, fraction) = plain.split_once('.').unwrap_or((&plain, ""));
    if units.is_empty() || !units.chars().all(|c| c.is_ascii_digit()) {
        return None;
    }
    if units.len() > 1 && units.starts_with('0') && fraction.is_empty() {
        return Some(Key::Digits(units.to_owned()));
    }
    Some(Key::Number(canonical(units, fraction)))
}

/// `45,000.50` with `k` -> `45000500`; without -> `45000.5`.
fn quantity(written: &str, multiplier: Option<&str>) -> Option<String> {
    let factor = match multiplier.map(str::to_ascii_lowercase).as_deref() {
        None => 1.0,
        Some("k" | "thousand") => 1e3,
        Some("m" | "million") => 1e6,
        Some(_) => 1e9,
    };
    let plain: String = written
        .chars()
        .filter(|c| !matches!(c, ',' | ' ' | '\u{a0}' | '\u{202f}'))
        .collect();
    let (units, fraction) = if multiplier.is_none() {
        let (units, fraction) = plain.split_once('.').unwrap_or((&plain, ""));
        (units.to_owned(), fraction.to_owned())
    } else {
        let cents = format!("{:.2}", plain.parse::<f64>().ok()? * factor);
        let (units, fraction) = cents.split_once('.').unwrap_or((&cents, ""));
        (units.to_owned(), fraction.to_owned())
    };
    Some(canonical(&units, &fraction))
}

/// No leading zeros in the units (but one), no trailing zeros in the fraction.
fn canonical(units: &str, fraction: &str) -> String {
    let units = units.trim_start_matches('0');
    let units = if units.is_empty() { "0" } else { units };
    match fraction.trim_end_matches('0') {
        "" => units.to_owned(),
        fraction => format!("{units}.{fraction}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ground(sources: &[&str]) -> Ground {
        let mut ground = Ground::default();
        for source in sources {
            ground.add(source);
        }
        ground
    }

    /// The figures of `text` that count, as written.
    fn counted(text: &str) -> Vec<String> {
        figures(text)
            .into_iter()
            .filter(|f| f.counts)
            .map(|f| f.text)
            .collect()
    }

    #[test]
    fn an_amount_is_the_same_in_every_spelling() {
        let spellings = [
            "N45,000",
            "₦45,000",
            "NGN 45000",
            "45000",
            "45k",
            "45,000.00",
            "45K",
            "NGN45,000.00",
            "45000 NGN",
            "₦45 000",
            "45 000 naira",
        ];
        for source in spellings {
            for answer in spellings {
                assert!(
                    ground(&[source])
                        .ungrounded(&format!("You have {answer}."))
                        .is_empty(),
                    "{answer} from {source}"
                );
            }
        }
        assert_eq!(
            ground(&["balance 45000"]).ungrounded("Your balance is ₦45,500."),
            vec!["₦45,500"]
        );
        assert!(ground(&["1.5m"]).ungrounded("N1,500,000").is_empty());
        assert!(
            ground(&["{\"balance\": 0}"])
                .ungrounded("It is $0.")
                .is_empty()
        );
        // An amount with kobo may be said in whole naira.
        assert!(ground(&["\"52,340.10\""]).ungrounded("₦52,340").is_empty());
        assert!(
            ground(&["\"52,340.10\""])
                .ungrounded("₦52,340.10")
                .is_empty()
        );
    }

    #[test]
    fn what_is_a_figure_and_what_is_not() {
        for text in [
            "We reply within 24 hours.",
            "Pick option 2.",
            "It takes 3 days.",
            "Fully 100% sure.",
            "Open 9am to 5pm, 24/7, on the 2nd floor.",
            "Call us at 10:30.",
        ] {
            assert_eq!(counted(text), Vec::<String>::new(), "{text}");
        }
        for (text, figure) in [
            ("Your balance is $0.", "$0"),
            ("It is 0 naira.", "0 naira"),
            ("Fee: N50", "N50"),
            ("Send 5k", "5k"),
            ("There are 123 left", "123"),
            ("Order ORD-48213 shipped", "ORD-48213"),
            ("Order #48213 shipped", "48213"),
            ("Interest is 15%.", "15%"),
            ("Due 12 March.", "12 March"),
            ("Call 08031234567", "08031234567"),
            ("Ref TXN12345.", "TXN12345"),
            ("Your balance is [insert balance].", "[insert balance]"),
            ("You owe {{amount}} today", "{{amount}}"),
            ("Your balance is ₦45 000.", "₦45 000"),
        ] {
            assert_eq!(counted(text), vec![figure], "{text}");
        }
        // Letters with fewer than 3 digits are a word, not a reference.
        assert_eq!(counted("Use 2FA or the A1 form"), Vec::<String>::new());
    }

    #[test]
    fn a_date_is_the_same_day_in_every_common_form() {
        let forms = [
            "12 March",
            "March 12th",
            "2026-03-12",
            "12/03/2026",
            "12th of March, 2026",
            "Mar 12",
            "2026-03-12T09:30:00Z",
        ];
        for source in forms {
            for answer in forms {
                assert!(
                    ground(&[source])
                        .ungrounded(&format!("It is due on {answer}."))
                        .is_empty(),
                    "{answer} from {source}"
                );
            }
        }
        assert_eq!(
            ground(&["2026-03-12"]).ungrounded("It is due on 13 March."),
            vec!["13 March"]
        );
        // A year alone is a number the date gave.
        assert!(ground(&["2026-03-12"]).ungrounded("in 2026").is_empty());
    }

    #[test]
    fn a_phone_or_account_number_is_its_last_ten_digits() {
        let forms = [
            "+234 803 123 4567",
            "08031234567",
            "2348031234567",
            "0803-123-4567",
            "(0803) 123 4567",
        ];
        for source in forms {
            for answer in forms {
                assert!(
                    ground(&[source])
                        .ungrounded(&format!("We will call {answer}."))
                        .is_empty(),
                    "{answer} from {source}"
                );
            }
        }
        assert_eq!(
            ground(&["08031234567"]).ungrounded("Call 08031234568"),
            vec!["08031234568"]
        );
        // The end of a number the source gave in full, or masked as the model saw it.
        assert!(
            ground(&["account 0123456789"])
                .ungrounded("account ending 6789")
                .is_empty()
        );
        let masked = ground(&["account [number ending 6789]"]);
        assert!(masked.ungrounded("account ending 6789").is_empty());
        assert_eq!(
            masked.ungrounded("account 0123456789"),
            vec!["0123456789"],
            "the model never saw it whole"
        );
        // An account of zeros gives no zero amount.
        assert_eq!(
            ground(&["account 0000000000", "[number ending 0000]"]).ungrounded("You have $0."),
            vec!["$0"]
        );
    }

    #[test]
    fn a_reference_is_its_digits_or_its_letters_and_digits() {
        for (source, answer) in [
            ("ORD-48213", "#48213"),
            ("order 48213", "ORD-48213"),
            ("ORD-48213", "ord48213"),
            ("{\"order\": \"ORD-48213\"}", "Order 48213"),
        ] {
            assert!(
                ground(&[source]).ungrounded(answer).is_empty(),
                "{answer} from {source}"
            );
        }
        assert_eq!(
            ground(&["ORD-48213"]).ungrounded("ORD-48214"),
            vec!["ORD-48214"]
        );
    }

    #[test]
    fn only_the_ungrounded_figures_are_named_each_once() {
        let ground = ground(&["balance 45000", "customer said 2,500"]);
        assert_eq!(
            ground.ungrounded("You have 45k; you sent 2,500; fee N300, N300 again, in 3 days."),
            vec!["N300"]
        );
        assert!(
            Ground::default()
                .ungrounded("Hello, how can I help?")
                .is_empty()
        );
    }
}
