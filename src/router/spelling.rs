//! PURE: repairs words typed in a hurry. Customers drop vowels ("statmnt", "recnt trnsfer"),
//! swap two letters ("recieve"), leave one out or add one ("trackin", "transactionn"); no
//! lexicon can list every such spelling. A word the training messages use at most once, close to
//! a word the domain uses often, is read as that word.
//!
//! Rules, all keeping the first letter (people rarely mistype it, and it keeps "honey" from
//! becoming "money"), in words of five letters or more:
//! - **vowels dropped**: the word is the domain word with up to three vowels left out, not only
//!   its last ("statmnt" is "statement"; "hell" is not "hello");
//! - **one slip**: two neighbours swapped; in words of seven letters or more, one letter left out
//!   or added ("trackin"); in words of eight or more, one letter changed. Shorter words are one
//!   slip from too many others ("manage" and "manager", "score" and "store", "spent" and
//!   "spend"). A known word with an ending is no slip ("orders" is not "order": the router reads
//!   a word's forms itself, and turning one into another changed what patterns saw).
//!
//! Dropped vowels are preferred to a slip, then the word used more often; two equally used
//! candidates leave the word alone. Repairs happen as messages are routed: the classifier learns
//! the training messages as typed.

use std::hash::Hasher;

use super::vocabulary::{Fnv, FnvMap, FnvSet};

/// Letters a customer may drop from a word without losing it.
const VOWELS: &[u8] = b"aeiou";
/// Vowels a repair may restore at most.
const MAX_DROPPED: usize = 3;
/// The shortest word repaired at all.
const MIN_REPAIR_LEN: usize = 5;
/// The shortest word a letter left out or added is repaired in.
const MIN_GAP_LEN: usize = 7;
/// The shortest word a changed letter is repaired in.
const MIN_CHANGE_LEN: usize = 8;
/// Longer words are not looked up: no domain word is that long, and each costs a lookup a letter.
const MAX_REPAIR_LEN: usize = 24;
/// Endings that make another form of a word. Longer than the vocabulary's `SUFFIXES`, which are
/// cut from every word before each lookup and so must cut the same way everywhere ("er" would
/// make "order" "ord"); these are only tried to find a known word under a form of it.
const ENDINGS: &[&str] = &["s", "es", "ed", "ing", "er", "ers", "ly"];
/// A word is known once the training messages use it this often.
const MIN_USES: u32 = 2;
/// A domain word is a repair's target once the in-scope training messages use it this often.
const MIN_TARGET_USES: u32 = 5;

#[derive(Debug, Clone, Default)]
pub(super) struct Spelling {
    /// Words the training messages use more than once, in scope or not, and the lexicon's:
    /// never repaired.
    known: FnvSet,
    /// Domain words and how often the in-scope training messages use them.
    targets: Vec<(String, u32)>,
    /// The hash of a first letter and consonants -> targets with that skeleton.
    by_skeleton: FnvMap<u64, Vec<usize>>,
    /// The hash of a target and of each of its one-letter deletions -> targets.
    by_deletion: FnvMap<u64, Vec<usize>>,
}

impl Spelling {
    /// `taught`: every word of every training message, one item per use; `lexicon`: the words
    /// the lexicon spells; `domain`: the words of in-scope messages, one item per use. Training
    /// messages are typed by customers too: a word they use only once may itself be a slip, so
    /// it is not known.
    pub(super) fn new<'a>(
        taught: impl IntoIterator<Item = &'a str>,
        lexicon: impl IntoIterator<Item = &'a str>,
        domain: impl IntoIterator<Item = &'a str>,
    ) -> Spelling {
        let mut known = counts(taught);
        known.retain(|_, n| *n >= MIN_USES);
        let mut spelling = Spelling {
            known: known
                .into_keys()
                .chain(lexicon.into_iter().map(str::to_owned))
                .collect(),
            ..Spelling::default()
        };
        spelling.targets = counts(domain)
            .into_iter()
            .filter(|(w, n)| *n >= MIN_TARGET_USES && w.len() >= MIN_REPAIR_LEN && repairable(w))
            .collect();
        for (index, (word, _)) in spelling.targets.iter().enumerate() {
            spelling
                .by_skeleton
                .entry(skeleton(word))
                .or_default()
                .push(index);
            for key in std::iter::once(hashed(word.bytes())).chain(deletions(word)) {
                let at = spelling.by_deletion.entry(key).or_default();
                if at.last() != Some(&index) {
                    at.push(index);
                }
            }
        }
        spelling
    }

    /// The domain word `word` was meant to be, when it is unknown and one is clearly meant.
    pub(super) fn repair(&self, word: &str) -> Option<&str> {
        if !(MIN_REPAIR_LEN..=MAX_REPAIR_LEN).contains(&word.len())
            || !repairable(word)
            || self.known.contains(word)
        {
            return None;
        }
        let dropped = self
            .by_skeleton
            .get(&skeleton(word))
            .into_iter()
            .flatten()
            .copied()
            .filter(|&t| vowels_dropped(word, &self.targets[t].0));
        if let Some(target) = self.most_used(dropped) {
            return Some(target);
        }
        if self.inflects_known(word) {
            return None;
        }
        let mut slips = Vec::new();
        for key in std::iter::once(hashed(word.bytes())).chain(deletions(word)) {
            slips.extend(self.by_deletion.get(&key).into_iter().flatten().copied());
        }
        self.most_used(
            slips
                .into_iter()
                .filter(|&t| one_slip(word, &self.targets[t].0)),
        )
    }

    /// `word` is a known word with an ending ("deliver" + "ed", "charge" + "d", "card" + "s").
    fn inflects_known(&self, word: &str) -> bool {
        let plain = ENDINGS.iter().filter_map(|e| word.strip_suffix(e));
        let with_e = word.strip_suffix('d').filter(|w| w.ends_with('e'));
        plain
            .chain(with_e)
            .any(|stem| stem.len() >= 3 && self.known.contains(stem))
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
fn counts<'a>(words: impl IntoIterator<Item = &'a str>) -> FnvMap<String, u32> {
    let mut counts = FnvMap::default();
    for word in words {
        *counts.entry(word.to_owned()).or_default() += 1;
    }
    counts
}

/// Plain lower-case ASCII letters only (so byte offsets are letters): placeholders, numbers
/// and other scripts are left alone.
fn repairable(word: &str) -> bool {
    word.bytes().all(|b| b.is_ascii_lowercase())
}

/// The hash of `letters`. Skeletons and deletions are looked up by hash, so that no string is
/// built for each unknown word; a collision only adds a candidate, and every candidate is
/// checked letter by letter.
fn hashed(letters: impl Iterator<Item = u8>) -> u64 {
    let mut hash = Fnv::default();
    for letter in letters {
        hash.write_u8(letter);
    }
    hash.finish()
}

/// The first letter, then the consonants: what survives a customer dropping vowels.
fn skeleton(word: &str) -> u64 {
    let bytes = word.as_bytes();
    let consonants = bytes[1..].iter().filter(|b| !VOWELS.contains(b));
    hashed(std::iter::once(bytes[0]).chain(consonants.copied()))
}

/// `word` is `target` with one to three of its vowels (never the first letter, nor only the
/// last) left out.
fn vowels_dropped(word: &str, target: &str) -> bool {
    let (w, t) = (word.as_bytes(), target.as_bytes());
    if t.len() <= w.len() || t.len() - w.len() > MAX_DROPPED || w[0] != t[0] {
        return false;
    }
    let mut at = 0;
    let mut inside = false;
    for (i, &b) in t.iter().enumerate() {
        if at < w.len() && w[at] == b {
            at += 1;
        } else if VOWELS.contains(&b) {
            inside |= i + 1 < t.len();
        } else {
            return false;
        }
    }
    at == w.len() && inside
}

/// The hashes of `word` without one of its letters, each way (ASCII: one byte a letter).
fn deletions(word: &str) -> impl Iterator<Item = u64> + '_ {
    let bytes = word.as_bytes();
    (0..bytes.len()).map(move |i| hashed(bytes[..i].iter().chain(&bytes[i + 1..]).copied()))
}

/// One slip, as long as the word is for its kind: two neighbours swapped, a letter left out or
/// added, a letter changed. The first letter always stands.
fn one_slip(word: &str, target: &str) -> bool {
    let (a, b) = (word.as_bytes(), target.as_bytes());
    let prefix = a.iter().zip(b).take_while(|(x, y)| x == y).count();
    if prefix == 0 {
        return false;
    }
    let (x, y) = (&a[prefix..], &b[prefix..]);
    let swapped =
        x.len() == y.len() && x.len() >= 2 && x[0] == y[1] && x[1] == y[0] && x[2..] == y[2..];
    let gap = match x.len().abs_diff(y.len()) {
        1 if x.len() > y.len() => x[1..] == *y,
        1 => y[1..] == *x,
        _ => false,
    };
    let changed = x.len() == y.len() && !x.is_empty() && x[1..] == y[1..];
    swapped || (gap && a.len() >= MIN_GAP_LEN) || (changed && a.len() >= MIN_CHANGE_LEN)
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
            ("twcie", "twice"),
            ("pacakge", "package"),
            ("rechargee", "recharge"),
            ("transfar", "transfer"),
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
        // Unknown, but: another first letter, too short, two slips, a letter changed or left
        // out of a short word, only a last vowel dropped, a known word's form, not letters.
        for word in [
            "xtatement",
            "twie",
            "debbitd",
            "stateme",
            "mohey",
            "recen",
            "packag",
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
        let tied = uses(&[("recent", 5), ("recant", 5)]);
        let s = Spelling::new(tied.clone(), [], tied);
        assert_eq!(s.repair("recnt"), None);
        let more = uses(&[("recent", 6), ("recant", 5)]);
        let s = Spelling::new(more.clone(), [], more);
        assert_eq!(s.repair("recnt"), Some("recent"));
    }
}
