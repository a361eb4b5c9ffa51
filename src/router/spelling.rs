//! PURE: repairs words typed in a hurry. Customers drop vowels ("statmnt", "recnt trnsfer"),
//! slip a letter ("debitd", "packge", "twise") or swap two ("recieve"); no lexicon can list
//! every such spelling. A word the training messages use at most once, one slip from a word the
//! domain uses often, is read as that word.
//!
//! Rules, both keeping the first letter (people rarely mistype it, and it keeps "honey" from
//! becoming "money"):
//! - **vowels dropped**: the word is the domain word with up to three vowels left out
//!   ("statmnt" is "statement");
//! - **one slip**: one letter added, left out, changed, or two neighbours swapped, in words of
//!   five letters or more ("debitd" is "debited"), unless the word is a known word with an
//!   ending ("orders" is not a slip of "order": the router reads a word's forms itself, and
//!   turning one into another changed what patterns saw).
//!
//! A word that could be repaired into two domain words equally often used is left alone.

use std::collections::HashMap;
use std::hash::BuildHasherDefault;

use super::vocabulary::Fnv;

type ByKey<V> = HashMap<String, V, BuildHasherDefault<Fnv>>;

/// Letters a customer may drop from a word without losing it.
const VOWELS: &[u8] = b"aeiou";
/// Vowels a repair may restore at most.
const MAX_DROPPED: usize = 3;
/// The shortest word a slip is repaired in: shorter words are one slip from too many others.
const MIN_SLIP_LEN: usize = 5;
/// Endings that make another form of a word.
const ENDINGS: &[&str] = &["s", "es", "ed", "ing", "er", "ers", "ly"];
/// The shortest word whose dropped vowels are restored.
const MIN_DROPPED_LEN: usize = 4;
/// A word is known once the training messages use it this often.
const MIN_USES: u32 = 2;
/// A domain word is a repair's target once the in-scope training messages use it this often.
const MIN_TARGET_USES: u32 = 5;

#[derive(Debug, Clone, Default)]
pub(super) struct Spelling {
    /// Words the training messages use more than once, in scope or not, and the lexicon's:
    /// never repaired.
    known: ByKey<()>,
    /// Domain words and how often the in-scope training messages use them.
    targets: Vec<(String, u32)>,
    /// First letter and consonants -> targets with that skeleton.
    by_skeleton: ByKey<Vec<usize>>,
    /// A target and each of its one-letter deletions -> targets.
    by_deletion: ByKey<Vec<usize>>,
}

impl Spelling {
    /// `taught`: every word of every training message, one item per use; `lexicon`: the words
    /// the lexicon spells; `domain`: the words of in-scope messages, one item per use. Training
    /// messages are typed by customers too: a word they use once may itself be a slip, and is
    /// repaired like an unknown one.
    pub(super) fn new<'a>(
        taught: impl IntoIterator<Item = &'a str>,
        lexicon: impl IntoIterator<Item = &'a str>,
        domain: impl IntoIterator<Item = &'a str>,
    ) -> Spelling {
        let mut known = counts(taught);
        known.retain(|_, n| *n >= MIN_USES);
        known.extend(lexicon.into_iter().map(|w| (w.to_owned(), MIN_USES)));
        let mut spelling = Spelling {
            known: known.into_keys().map(|w| (w, ())).collect(),
            ..Spelling::default()
        };
        let mut targets: Vec<(String, u32)> = counts(domain)
            .into_iter()
            .filter(|(w, n)| *n >= MIN_TARGET_USES && w.len() >= MIN_DROPPED_LEN && repairable(w))
            .collect();
        // A fixed order: repairs must not depend on the hash map's.
        targets.sort();
        for (index, (word, _)) in targets.iter().enumerate() {
            spelling
                .by_skeleton
                .entry(skeleton(word))
                .or_default()
                .push(index);
            if word.len() >= MIN_SLIP_LEN {
                for key in std::iter::once(word.clone()).chain(deletions(word)) {
                    let at = spelling.by_deletion.entry(key).or_default();
                    if at.last() != Some(&index) {
                        at.push(index);
                    }
                }
            }
        }
        spelling.targets = targets;
        spelling
    }

    /// The domain word `word` was meant to be, when it is unknown and one is clearly meant.
    pub(super) fn repair(&self, word: &str) -> Option<&str> {
        if word.len() < MIN_DROPPED_LEN || !repairable(word) || self.known.contains_key(word) {
            return None;
        }
        let dropped = self
            .by_skeleton
            .get(&skeleton(word))
            .into_iter()
            .flatten()
            .filter(|&&t| vowels_dropped(word, &self.targets[t].0));
        let mut slips = Vec::new();
        if word.len() >= MIN_SLIP_LEN && !self.inflects_known(word) {
            for key in std::iter::once(word.to_owned()).chain(deletions(word)) {
                slips.extend(self.by_deletion.get(&key).into_iter().flatten());
            }
        }
        let slipped = slips.into_iter().filter(|&&t| {
            let target = &self.targets[t].0;
            target.as_bytes()[0] == word.as_bytes()[0] && one_slip(word, target)
        });
        self.most_used(dropped.chain(slipped).copied())
    }

    /// `word` is a known word with an ending ("deliver" + "ed", "charge" + "d", "card" + "s").
    fn inflects_known(&self, word: &str) -> bool {
        let plain = ENDINGS.iter().filter_map(|e| word.strip_suffix(e));
        let with_e = word.strip_suffix('d').filter(|w| w.ends_with('e'));
        plain
            .chain(with_e)
            .any(|stem| stem.len() >= 3 && self.known.contains_key(stem))
    }

    /// The candidate used most often; none when two different words tie.
    fn most_used(&self, candidates: impl Iterator<Item = usize>) -> Option<&str> {
        let mut best: Option<usize> = None;
        let mut tied = false;
        for c in candidates {
            match best {
                Some(b) if b == c => {}
                Some(b) if self.targets[c].1 == self.targets[b].1 => tied = true,
                Some(b) if self.targets[c].1 < self.targets[b].1 => {}
                _ => {
                    best = Some(c);
                    tied = false;
                }
            }
        }
        best.filter(|_| !tied).map(|b| self.targets[b].0.as_str())
    }
}

/// How often each word is used.
fn counts<'a>(words: impl IntoIterator<Item = &'a str>) -> ByKey<u32> {
    let mut counts = ByKey::default();
    for word in words {
        *counts.entry(word.to_owned()).or_default() += 1;
    }
    counts
}

/// Plain lower-case letters only: placeholders, numbers and other scripts are left alone.
fn repairable(word: &str) -> bool {
    word.bytes().all(|b| b.is_ascii_lowercase())
}

/// The first letter, then the consonants: what survives a customer dropping vowels.
fn skeleton(word: &str) -> String {
    let bytes = word.as_bytes();
    let mut out = String::with_capacity(word.len());
    out.push(char::from(bytes[0]));
    out.extend(
        bytes[1..]
            .iter()
            .filter(|b| !VOWELS.contains(b))
            .map(|&b| char::from(b)),
    );
    out
}

/// `word` is `target` with one to three of its vowels (never the first letter) left out.
fn vowels_dropped(word: &str, target: &str) -> bool {
    let (w, t) = (word.as_bytes(), target.as_bytes());
    if t.len() <= w.len() || t.len() - w.len() > MAX_DROPPED || w[0] != t[0] {
        return false;
    }
    let mut at = 0;
    for &b in t {
        if at < w.len() && w[at] == b {
            at += 1;
        } else if !VOWELS.contains(&b) {
            return false;
        }
    }
    at == w.len()
}

/// `word` without one of its letters, each way.
fn deletions(word: &str) -> impl Iterator<Item = String> + '_ {
    (0..word.len()).map(move |i| {
        let mut out = String::with_capacity(word.len() - 1);
        out.push_str(&word[..i]);
        out.push_str(&word[i + 1..]);
        out
    })
}

/// One letter added, left out or changed, or two neighbours swapped.
fn one_slip(word: &str, target: &str) -> bool {
    let (a, b) = (word.as_bytes(), target.as_bytes());
    let prefix = a.iter().zip(b).take_while(|(x, y)| x == y).count();
    let (a, b) = (&a[prefix..], &b[prefix..]);
    match a.len().abs_diff(b.len()) {
        0 if a.is_empty() => false,
        0 => a[1..] == b[1..] || (a.len() >= 2 && a[0] == b[1] && a[1] == b[0] && a[2..] == b[2..]),
        1 if a.len() > b.len() => a[1..] == *b,
        1 => b[1..] == *a,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each domain word used often enough to be a target; "statmnt" taught once.
    fn spelling() -> Spelling {
        let domain: Vec<&str> = "statement transaction debited package money twice recent \
                                 transfer recharge order"
            .split_whitespace()
            .flat_map(|w| [w; MIN_TARGET_USES as usize])
            .collect();
        let taught = "honey honey border border statmnt";
        Spelling::new(
            domain.iter().copied().chain(taught.split(' ')),
            ["stmt"],
            domain.iter().copied(),
        )
    }

    #[test]
    fn a_hurried_word_is_read_as_the_domain_word() {
        let s = spelling();
        for (typed, meant) in [
            ("statmnt", "statement"),
            ("transactin", "transaction"),
            ("recnt", "recent"),
            ("trnsfer", "transfer"),
            ("debitd", "debited"),
            ("packge", "package"),
            ("twise", "twice"),
            ("pacakge", "package"),
            ("rechargee", "recharge"),
        ] {
            assert_eq!(s.repair(typed), Some(meant), "{typed}");
        }
    }

    #[test]
    fn known_short_or_far_words_are_left_alone() {
        let s = spelling();
        // Known words, even one slip from a domain word.
        for word in ["honey", "border", "stmt", "money"] {
            assert_eq!(s.repair(word), None, "{word}");
        }
        // Unknown, but: another first letter, too short, two slips, a consonant dropped from a
        // four-letter word, a known word's form, not letters.
        for word in [
            "xtatement",
            "mny",
            "debbitd",
            "stateme",
            "twie",
            "orders",
            "<amount>",
        ] {
            assert_eq!(s.repair(word), None, "{word}");
        }
    }

    #[test]
    fn a_word_two_domain_words_could_be_is_left_alone() {
        let uses = |words: &[(&'static str, usize)]| -> Vec<&'static str> {
            words.iter().flat_map(|&(w, n)| vec![w; n]).collect()
        };
        let tied = uses(&[("carts", 5), ("cards", 5)]);
        let s = Spelling::new(tied.clone(), [], tied);
        assert_eq!(s.repair("carbs"), None);
        let more = uses(&[("carts", 5), ("cards", 6)]);
        let s = Spelling::new(more.clone(), [], more);
        assert_eq!(s.repair("carbs"), Some("cards"));
    }
}
