//! PURE: a customer's message -> the canonical text the router matches and classifies.
//!
//! Steps, in order: Unicode NFD with combining marks stripped (Yoruba tone marks, accents),
//! lower case, emoji that carry meaning turned into words and the rest dropped, amounts,
//! account and phone numbers and references masked (so digits never drive a decision), runs of
//! three or more equal letters cut to two, and every token mapped through the lexicon of
//! spelling variants (`wetin`/`wetyn`, `acct`/`acc`, `pls`/`abeg`/`biko`, ...).

use unicode_normalization::UnicodeNormalization;
use unicode_normalization::char::is_combining_mark;

use super::entities::{Entities, Span};
use super::spelling::Spelling;
use super::vocabulary::FnvMap;

/// Maps spelling variants (and multi-word phrases) to canonical words.
#[derive(Debug, Clone, Default)]
pub(super) struct Lexicon {
    words: FnvMap<String, String>,
    /// Multi-word variants by their first word, longest first: replaced before tokens are
    /// mapped. Keyed by first word so that a large lexicon costs one lookup per token.
    phrases: FnvMap<String, Vec<(Vec<String>, String)>>,
    /// Words no variant lists, repaired when typed in a hurry; empty until the router learns
    /// its domain's words.
    spelling: Spelling,
}

impl Lexicon {
    /// Adds `variants` of `canonical`. Variants are normalised like messages are.
    pub(super) fn add(&mut self, canonical: &str, variants: &[String]) {
        let canonical = fold(canonical);
        for variant in variants {
            let tokens: Vec<String> = fold(variant)
                .split_whitespace()
                .map(str::to_owned)
                .collect();
            match tokens.len() {
                0 => {}
                1 => {
                    self.words.insert(tokens[0].clone(), canonical.clone());
                }
                _ => {
                    let starting = self.phrases.entry(tokens[0].clone()).or_default();
                    starting.push((tokens, canonical.clone()));
                    starting.sort_by_key(|(tokens, _)| std::cmp::Reverse(tokens.len()));
                }
            }
        }
    }

    /// Every word the lexicon spells, of variants and canonical forms, phrases word by word.
    pub(super) fn words(&self) -> impl Iterator<Item = &str> {
        let words = self
            .words
            .iter()
            .flat_map(|(variant, canonical)| [variant.as_str(), canonical.as_str()]);
        let phrases = self
            .phrases
            .values()
            .flatten()
            .flat_map(|(tokens, canonical)| {
                tokens
                    .iter()
                    .map(String::as_str)
                    .chain(canonical.split(' '))
            });
        words.chain(phrases)
    }

    pub(super) fn repair_spellings_with(&mut self, spelling: Spelling) {
        self.spelling = spelling;
    }

    fn map<'a>(&'a self, token: &'a str) -> &'a str {
        match self.words.get(token) {
            Some(canonical) => canonical,
            None => self.spelling.repair(token).unwrap_or(token),
        }
    }
}

/// A message ready for matching: canonical words separated by single spaces.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Normalised {
    pub(super) text: String,
    pub(super) entities: Entities,
    /// The message's clauses, as byte ranges of `text`, in order; together they cover every
    /// word. A clause ends at a sentence or clause mark (`. , ; : ! ?`, a new line) and before
    /// a word that opens a new one ("but", "then", ...).
    pub(super) clauses: Vec<(usize, usize)>,
    /// The message asks a question (a `?`, which the canonical text drops).
    pub(super) question: bool,
}

/// Marks that end a clause, and emoji that stand for no word: people put them where others put
/// a comma ("I no wan transfer 🙅🏾 na data I wan buy"). Amounts (`15,000`) are masked before
/// the split.
fn ends_clause(c: char) -> bool {
    matches!(c, '.' | ',' | ';' | ':' | '!' | '?' | '\n' | '\u{2026}') || emoji_word(c) == Some("")
}

/// Canonical words that open a new clause ("I don't want a loan *but* how much is left").
const CLAUSE_OPENERS: &[&str] = &["but", "however", "then", "oya", "also", "instead"];

/// Whether the first of `words` opens a new clause: an opener, or "before" with the customer
/// as its subject ("my balance *before I pay* school fees"; not "before Monday", nor "before I
/// can open", which asks what opening needs).
fn opens_clause(words: &[&str]) -> bool {
    match words {
        [word, ..] if CLAUSE_OPENERS.contains(word) => true,
        ["before", "i" | "we", next, ..] => !matches!(*next, "can" | "fit" | "could"),
        _ => false,
    }
}

pub(super) fn normalise(message: &str, lexicon: &Lexicon) -> Normalised {
    let entities = super::entities::extract(message);
    let masked = mask(message, &entities.spans);
    let mut text = String::with_capacity(masked.len());
    let mut clauses = Vec::new();
    // Each piece is mapped on its own, so a lexicon phrase never spans two clauses.
    for piece in masked.split(ends_clause) {
        let folded = fold(piece);
        let tokens: Vec<&str> = folded.split_whitespace().collect();
        let mut start = None;
        let words = map_tokens(&tokens, lexicon);
        for (k, &word) in words.iter().enumerate() {
            if !text.is_empty() {
                text.push(' ');
            }
            let at = text.len();
            match start {
                Some(from) if opens_clause(&words[k..]) => {
                    clauses.push((from, at.saturating_sub(1)));
                    start = Some(at);
                }
                None => start = Some(at),
                Some(_) => {}
            }
            text.push_str(word);
        }
        if let Some(from) = start {
            clauses.push((from, text.len()));
        }
    }
    Normalised {
        text,
        entities,
        clauses,
        question: message.contains('?'),
    }
}

/// Replaces each entity span with its placeholder word.
fn mask(message: &str, spans: &[Span]) -> String {
    let mut out = String::with_capacity(message.len());
    let mut at = 0;
    for span in spans {
        if span.start < at {
            continue;
        }
        out.push_str(&message[at..span.start]);
        out.push(' ');
        out.push_str(span.placeholder);
        out.push(' ');
        at = span.end;
    }
    out.push_str(&message[at..]);
    out
}

/// NFD without combining marks, lower case, emoji as words, punctuation as spaces, repeated
/// letters cut to two. Placeholders (`<amount>`) survive.
pub(super) fn fold(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut last: Option<char> = None;
    let mut run = 0;
    for c in text.nfd().filter(|c| !is_combining_mark(*c)) {
        if let Some(word) = emoji_word(c) {
            out.push(' ');
            out.push_str(word);
            out.push(' ');
            last = None;
            continue;
        }
        let c = match c {
            'a'..='z' | '0'..='9' | '<' | '>' | '_' => c,
            'A'..='Z' => c.to_ascii_lowercase(),
            '\'' | '\u{2019}' => continue,
            c if c.is_alphanumeric() => c.to_lowercase().next().unwrap_or(c),
            _ => ' ',
        };
        if Some(c) == last && c.is_alphabetic() {
            run += 1;
            if run >= 2 {
                continue;
            }
        } else {
            run = 0;
        }
        last = Some(c);
        out.push(c);
    }
    out
}

/// Emoji that carry meaning in support chats; others are dropped.
fn emoji_word(c: char) -> Option<&'static str> {
    match c {
        '🙏' => Some("please"),
        '👍' | '👌' => Some("ok"),
        '😡' | '😤' | '😠' => Some("angry"),
        '💳' => Some("card"),
        '📦' => Some("parcel"),
        '💰' | '💵' | '💸' => Some("money"),
        '📱' => Some("phone"),
        c if is_emoji(c) => Some(""),
        _ => None,
    }
}

fn is_emoji(c: char) -> bool {
    matches!(c as u32, 0x1F000..=0x1FAFF | 0x2600..=0x27BF | 0xFE0F | 0x200D)
}

fn map_tokens<'a>(tokens: &[&'a str], lexicon: &'a Lexicon) -> Vec<&'a str> {
    let mut out = Vec::with_capacity(tokens.len());
    let mut i = 0;
    'tokens: while i < tokens.len() {
        for (phrase, canonical) in lexicon.phrases.get(tokens[i]).into_iter().flatten() {
            let end = i + phrase.len();
            if end <= tokens.len() && tokens[i..end].iter().zip(phrase).all(|(t, p)| *t == p) {
                out.push(canonical.as_str());
                i = end;
                continue 'tokens;
            }
        }
        out.push(lexicon.map(tokens[i]));
        i += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lexicon() -> Lexicon {
        let mut l = Lexicon::default();
        l.add("balance", &["bal".into(), "balnce".into()]);
        l.add("account", &["acct".into(), "acc".into()]);
        l.add("what", &["wetin".into(), "wetyn".into()]);
        l.add("please", &["abeg".into(), "e joo".into()]);
        l
    }

    #[test]
    fn folds_case_marks_emoji_and_repeats() {
        assert_eq!(fold("Ẹ jọ̀ọ́"), "e joo");
        assert_eq!(fold("PLEASEEEE!!!"), "pleasee   ");
        assert_eq!(
            fold("airtime abeg 🙏🏾")
                .split_whitespace()
                .collect::<Vec<_>>(),
            ["airtime", "abeg", "please"]
        );
        assert_eq!(fold("I'd like"), "id like");
    }

    #[test]
    fn maps_variants_and_phrases() {
        let n = normalise("Pls wat is my ACCT bal? E joo", &lexicon());
        assert_eq!(n.text, "pls wat is my account balance please");
        assert_eq!(
            normalise("wetyn be my balnce", &lexicon()).text,
            "what be my balance"
        );
    }

    #[test]
    fn phrases_sharing_a_first_word_take_the_longest_then_the_word() {
        let mut l = lexicon();
        l.add("where", &["ina".into()]);
        l.add("want", &["ina son".into()]);
        l.add("good evening", &["barka da yamma".into()]);
        l.add("hello", &["barka".into(), "ina kwana".into()]);
        assert_eq!(normalise("Ina son data", &l).text, "want data");
        assert_eq!(normalise("ina kwana", &l).text, "hello");
        assert_eq!(normalise("Ina kayana?", &l).text, "where kayana");
        assert_eq!(normalise("Barka da yamma", &l).text, "good evening");
        assert_eq!(normalise("barka", &l).text, "hello");
    }

    #[test]
    fn clauses_end_at_marks_and_before_words_that_open_one() {
        let n = normalise("Thanks, e don enter. Now wetin be my bal?", &lexicon());
        assert_eq!(n.text, "thanks e don enter now what be my balance");
        let clauses = |message: &str| {
            let n = normalise(message, &lexicon());
            n.clauses
                .iter()
                .map(|&(a, b)| n.text[a..b].to_owned())
                .collect::<Vec<_>>()
        };
        for (message, expected) in [
            (
                "Thanks, e don enter. Now wetin be my bal?",
                &["thanks", "e don enter", "now what be my balance"][..],
            ),
            (
                "I no want loan but how much remain",
                &["i no want loan", "but how much remain"],
            ),
            // An emoji that stands for no word ends a clause; one that stands for a word is it.
            (
                "I no wan transfer 🙅🏾‍♂️ na data I wan buy 🙏",
                &["i no wan transfer", "na data i wan buy please"],
            ),
            // "Before" opens a clause when the customer does the next thing; not before a day,
            // nor before "I can" (what opening an account needs).
            (
                "tell me my balance before I pay school fees",
                &["tell me my balance", "before i pay school fees"],
            ),
            (
                "I need the shoes before Monday",
                &["i need the shoes before monday"],
            ),
            (
                "do I need BVN before I can open",
                &["do i need bvn before i can open"],
            ),
        ] {
            assert_eq!(clauses(message), expected, "{message}");
        }
        assert_eq!(
            normalise("my 💳 😭 don block", &lexicon()).text,
            "my card don block"
        );
        // A mark with no words beside it makes no clause; an amount's comma is no mark.
        let n = normalise("?? send ₦15,000 !!", &lexicon());
        assert_eq!(n.clauses.len(), 1, "{n:?}");
    }

    #[test]
    fn masks_numbers_so_digits_do_not_decide() {
        let n = normalise(
            "send 1k credit to 08031234567 from acct 0123456789",
            &lexicon(),
        );
        assert_eq!(
            n.text,
            "send <amount> credit to <phone> from account <account>"
        );
    }
}
