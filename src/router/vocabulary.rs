//! PURE: the words the domain explains. A routine request is said in words the intents'
//! examples, patterns and lexicon use; a message with several words they never use ("the
//! balance of my *diet plan*", "my *school* never refund my *acceptance fee*") is about
//! something else, however routine its keyword, and goes to the agent.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};

/// Words that carry no topic: a message may hold any number of them.
const FUNCTION_WORDS: &[&str] = &[
    "a",
    "about",
    "abi",
    "after",
    "again",
    "ago",
    "all",
    "also",
    "am",
    "an",
    "and",
    "any",
    "are",
    "as",
    "at",
    "be",
    "because",
    "been",
    "before",
    "being",
    "but",
    "by",
    "can",
    "come",
    "could",
    "day",
    "days",
    "dey",
    "did",
    "do",
    "does",
    "don",
    "e",
    "even",
    "for",
    "from",
    "get",
    "go",
    "gon",
    "got",
    "had",
    "has",
    "have",
    "he",
    "her",
    "here",
    "him",
    "his",
    "how",
    "i",
    "if",
    "im",
    "in",
    "into",
    "is",
    "it",
    "its",
    "just",
    "last",
    "let",
    "like",
    "make",
    "may",
    "me",
    "might",
    "mine",
    "more",
    "must",
    "my",
    "na",
    "now",
    "o",
    "of",
    "oh",
    "ok",
    "okay",
    "on",
    "one",
    "or",
    "our",
    "out",
    "pls",
    "sef",
    "sha",
    "she",
    "should",
    "since",
    "so",
    "some",
    "still",
    "that",
    "the",
    "their",
    "them",
    "then",
    "there",
    "these",
    "they",
    "this",
    "those",
    "till",
    "to",
    "today",
    "too",
    "two",
    "up",
    "us",
    "very",
    "was",
    "we",
    "week",
    "were",
    "wey",
    "when",
    "which",
    "while",
    "who",
    "why",
    "will",
    "with",
    "would",
    "ya",
    "yes",
    "yet",
    "you",
    "your",
    "yesterday",
    "tomorrow",
    "month",
    "please",
    "hello",
    "thanks",
    "oga",
    "madam",
    "sir",
    "abeg",
    "omo",
    "chai",
    "haba",
    "jare",
    "oya",
    "ehn",
    "ehen",
    "ah",
    "eh",
    "wahala",
    "time",
    "what",
    "where",
    "want",
    "not",
    "need",
    "help",
    "tell",
    "know",
    "see",
    "give",
    "take",
    "say",
    "said",
    "why",
    "already",
    "ever",
    "only",
    "well",
    "way",
    "thing",
    "things",
    "something",
    "people",
];

/// Suffixes cut before a word is looked up, so `transactions`, `declined` and `blocking` are
/// the words their examples spell otherwise.
const SUFFIXES: &[&str] = &["ing", "ed", "s", "ly"];

/// Words hashed with FNV-1a: short keys, looked up for every word of every message.
pub(super) type FnvSet = HashSet<String, BuildHasherDefault<Fnv>>;
/// Words (or their hashes) to what the router keeps for them, hashed with FNV-1a.
pub(super) type FnvMap<K, V> = HashMap<K, V, BuildHasherDefault<Fnv>>;

#[derive(Debug)]
pub(super) struct Vocabulary {
    words: FnvSet,
    function_words: FnvSet,
}

impl Default for Vocabulary {
    fn default() -> Self {
        Vocabulary {
            words: FnvSet::default(),
            function_words: FUNCTION_WORDS.iter().map(|w| (*w).to_owned()).collect(),
        }
    }
}

impl Vocabulary {
    /// Learns every word of `texts` (normalised messages, patterns, lexicon words).
    pub(super) fn learn<'a>(&mut self, texts: impl IntoIterator<Item = &'a str>) {
        for text in texts {
            for word in text.split(|c: char| !c.is_alphanumeric()) {
                if word.len() >= 3 {
                    self.words.insert(stem(word).to_owned());
                }
            }
        }
    }

    /// Learns the literal words of regular expressions (`\\bmoney\\b` teaches `money`).
    pub(super) fn learn_patterns<'a>(&mut self, patterns: impl IntoIterator<Item = &'a str>) {
        for pattern in patterns {
            let mut literal = String::with_capacity(pattern.len());
            let mut chars = pattern.chars();
            while let Some(c) = chars.next() {
                if c == '\\' {
                    // An escape (`\\b`, `\\s`, `\\w`) is not a letter of a word.
                    chars.next();
                    literal.push(' ');
                } else {
                    literal.push(c);
                }
            }
            self.learn([literal.as_str()]);
        }
    }

    /// (content words of a normalised message, those of them the domain never uses).
    pub(super) fn unknown(&self, text: &str) -> (usize, usize) {
        text.split_whitespace()
            .filter(|w| is_content(w) && !self.function_words.contains(*w))
            .fold((0, 0), |(content, unknown), w| {
                (
                    content + 1,
                    unknown + usize::from(!self.words.contains(stem(w))),
                )
            })
    }
}

/// A word that could name a topic: letters, three or more (not a number or placeholder).
fn is_content(word: &str) -> bool {
    word.len() >= 3 && word.chars().all(char::is_alphabetic)
}

/// FNV-1a: fast on the short keys (words) the router looks up for every token.
pub(super) struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
}

impl Hasher for Fnv {
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 ^= u64::from(*b);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

fn stem(word: &str) -> &str {
    SUFFIXES
        .iter()
        .find_map(|s| word.strip_suffix(s).filter(|rest| rest.len() >= 3))
        .unwrap_or(word)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_the_examples_use_are_known_in_other_forms_too() {
        let mut vocabulary = Vocabulary::default();
        vocabulary.learn(["check my balance", "my card was declined"]);
        vocabulary.learn_patterns(["\\b(transactions?)\\b", "\\bmoney\\b"]);
        assert_eq!(vocabulary.unknown("please check my balances now"), (2, 0));
        assert_eq!(
            vocabulary.unknown("why is my card declining <amount>"),
            (2, 0)
        );
        assert_eq!(vocabulary.unknown("the balance of my diet plan"), (3, 2));
        assert_eq!(vocabulary.unknown("transaction"), (1, 0));
        assert_eq!(vocabulary.unknown("money"), (1, 0));
    }
}
