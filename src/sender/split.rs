//! PURE: long replies cut into parts WhatsApp accepts, at paragraph, sentence or word
//! boundaries, never inside a character or an emoji sequence.
//!
//! Lengths are counted in UTF-16 code units, which is never less than the characters Meta
//! counts, so no part is refused for its length whatever Meta's counting.

use crate::domain::ReplyPart;
use crate::whatsapp::graph::{BUTTONS_BODY_LIMIT, MAX_OPTIONS};

/// The longest text body Meta accepts.
pub const TEXT_LIMIT: usize = 4096;

/// The reply as it goes out: each part within the limits, quotes on the first piece of a part
/// and quick replies under its last; in more than `max_parts` messages, packed (`pack`).
pub fn for_whatsapp(parts: Vec<ReplyPart>, max_parts: usize) -> Vec<ReplyPart> {
    let mut out = Vec::with_capacity(parts.len());
    for part in parts {
        let mut pieces = split(&part.text, TEXT_LIMIT);
        let buttons = (1..=3).contains(&part.options.len());
        if buttons {
            if let Some(last) = pieces.pop() {
                pieces.extend(split(&last, BUTTONS_BODY_LIMIT));
            }
        }
        let count = pieces.len();
        for (index, text) in pieces.into_iter().enumerate() {
            out.push(ReplyPart {
                text,
                options: if index + 1 == count {
                    part.options.iter().take(MAX_OPTIONS).cloned().collect()
                } else {
                    Vec::new()
                },
                quote: if index == 0 { part.quote.clone() } else { None },
            });
        }
    }
    if out.len() > max_parts {
        pack(out)
    } else {
        out
    }
}

/// `parts` in as few messages as fit, as Meta bills each: neighbours joined with a blank line
/// while the text stays within its limit (the buttons' body limit when the later one carries
/// buttons). A part that quotes a message starts a new one, and one with quick replies ends
/// its message, so quotes and buttons stay where they were.
fn pack(parts: Vec<ReplyPart>) -> Vec<ReplyPart> {
    let mut out: Vec<ReplyPart> = Vec::with_capacity(parts.len());
    for part in parts {
        if let Some(last) = out.last_mut() {
            let limit = match (1..=3).contains(&part.options.len()) {
                true => BUTTONS_BODY_LIMIT,
                false => TEXT_LIMIT,
            };
            let fits = units(&last.text) + 2 + units(&part.text) <= limit;
            if fits && last.options.is_empty() && part.quote.is_none() {
                last.text.push_str("\n\n");
                last.text.push_str(&part.text);
                last.options = part.options;
                continue;
            }
        }
        out.push(part);
    }
    out
}

/// `text` in pieces of at most `limit` UTF-16 units, in order.
pub fn split(text: &str, limit: usize) -> Vec<String> {
    let mut pieces = Vec::new();
    let mut rest = text.trim();
    while units(rest) > limit {
        let window = prefix_within(rest, limit);
        let cut = boundary(&rest[..window], limit).unwrap_or(window);
        let (head, tail) = rest.split_at(cut);
        pieces.push(head.trim_end().to_owned());
        rest = tail.trim_start();
    }
    if !rest.is_empty() || pieces.is_empty() {
        pieces.push(rest.to_owned());
    }
    pieces
}

fn units(s: &str) -> usize {
    s.chars().map(char::len_utf16).sum()
}

/// The byte length of the longest prefix of `s` within `limit` units that does not end
/// inside an emoji sequence or before a combining mark.
fn prefix_within(s: &str, limit: usize) -> usize {
    let mut used = 0;
    let mut end = 0;
    for (index, c) in s.char_indices() {
        used += c.len_utf16();
        if used > limit {
            break;
        }
        end = index + c.len_utf8();
    }
    let mut cut = end;
    while cut > 0 && !safe_cut(s, cut) {
        cut = s[..cut].char_indices().next_back().map_or(0, |(i, _)| i);
    }
    // A single unbreakable run longer than the limit: cut where it fits.
    if cut == 0 { end.max(1) } else { cut }
}

/// Whether cutting `s` at `at` keeps every emoji sequence and accented letter whole.
fn safe_cut(s: &str, at: usize) -> bool {
    let before = s[..at].chars().next_back();
    let after = s[at..].chars().next();
    let joins = |c: char| {
        matches!(c, '\u{200D}' | '\u{FE0E}' | '\u{FE0F}' | '\u{20E3}')
            || ('\u{1F3FB}'..='\u{1F3FF}').contains(&c)
            || ('\u{0300}'..='\u{036F}').contains(&c)
            || ('\u{E0020}'..='\u{E007F}').contains(&c)
    };
    let regional = |c: char| ('\u{1F1E6}'..='\u{1F1FF}').contains(&c);
    match (before, after) {
        (Some('\u{200D}'), _) => false,
        (_, Some(c)) if joins(c) => false,
        // Flags are pairs of regional indicators: cut only between pairs.
        (Some(b), Some(a)) if regional(b) && regional(a) => {
            s[..at].chars().rev().take_while(|&c| regional(c)).count() % 2 == 0
        }
        _ => true,
    }
}

/// The best place to end a piece inside `window`: a paragraph, else a sentence, else a word
/// break, as long as the piece keeps a third of the room (tiny pieces read badly).
fn boundary(window: &str, limit: usize) -> Option<usize> {
    let long_enough = |at: usize| units(&window[..at]) >= limit / 3;
    let paragraph = window.rfind("\n\n").filter(|&at| long_enough(at));
    let sentence = || {
        window
            .char_indices()
            .rev()
            .find(|&(i, c)| {
                matches!(c, '.' | '!' | '?' | '\n')
                    && window[i + 1..].starts_with(char::is_whitespace)
                    && long_enough(i + 1)
            })
            .map(|(i, _)| i + 1)
    };
    let word = || {
        window
            .char_indices()
            .rev()
            .find(|&(i, c)| c.is_whitespace() && i > 0)
            .map(|(i, _)| i)
    };
    paragraph.or_else(sentence).or_else(word)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn short_text_is_one_piece() {
        assert_eq!(split("  hello  ", 10), vec!["hello"]);
        assert_eq!(split("", 10), vec![""]);
    }

    #[test]
    fn paragraphs_then_sentences_then_words() {
        let text = format!("{}\n\n{}", "a".repeat(30), "b".repeat(30));
        assert_eq!(split(&text, 40), vec!["a".repeat(30), "b".repeat(30)]);
        let text = "One two three. Four five six seven.";
        assert_eq!(
            split(text, 20),
            vec!["One two three.", "Four five six seven."]
        );
        assert_eq!(
            split(text, 16),
            vec!["One two three.", "Four five six", "seven."]
        );
        assert_eq!(split("abcdefghij", 4), vec!["abcd", "efgh", "ij"]);
    }

    #[test]
    fn emoji_sequences_stay_whole() {
        let family = "👨\u{200D}👩\u{200D}👧";
        let text = family.repeat(5);
        for piece in split(&text, 9) {
            assert!(units(&piece) <= 9);
            assert_eq!(piece.matches(family).count() * family.len(), piece.len());
        }
        let flags = "🇳🇬".repeat(6);
        for piece in split(&flags, 10) {
            assert_eq!(piece.chars().count() % 2, 0, "{piece:?}");
        }
    }

    #[test]
    fn options_ride_on_the_last_piece_and_fit_buttons() {
        let part = ReplyPart {
            text: "word ".repeat(1000),
            options: vec!["Yes".into(), "No".into()],
            quote: Some("wamid.1".into()),
        };
        let parts = for_whatsapp(vec![part], 1);
        assert!(parts.len() >= 2);
        assert_eq!(parts[0].quote.as_deref(), Some("wamid.1"));
        assert!(parts[1..].iter().all(|p| p.quote.is_none()));
        let last = parts.last().map(|p| (units(&p.text), p.options.len()));
        assert!(matches!(last, Some((n, 2)) if n <= BUTTONS_BODY_LIMIT));
        assert!(
            parts[..parts.len() - 1]
                .iter()
                .all(|p| p.options.is_empty())
        );
    }

    fn part(text: &str, options: &[&str], quote: Option<&str>) -> ReplyPart {
        ReplyPart {
            text: text.into(),
            options: options.iter().map(|o| (*o).to_owned()).collect(),
            quote: quote.map(str::to_owned),
        }
    }

    #[test]
    fn a_reply_in_more_parts_than_allowed_goes_in_as_few_messages_as_fit() {
        let parts = vec![
            part("Our hours: 9 to 5.", &[], Some("wamid.1")),
            part("We deliver in Lagos.", &[], None),
            part("Want a call back?", &["Yes", "No"], None),
            part("Or write to us.", &[], None),
        ];
        let packed = for_whatsapp(parts.clone(), 1);
        assert_eq!(
            packed,
            vec![
                part(
                    "Our hours: 9 to 5.\n\nWe deliver in Lagos.\n\nWant a call back?",
                    &["Yes", "No"],
                    Some("wamid.1")
                ),
                part("Or write to us.", &[], None),
            ],
            "buttons end their message"
        );
        assert_eq!(
            for_whatsapp(parts.clone(), 4),
            parts,
            "within the limit: as written"
        );
    }

    #[test]
    fn packing_keeps_quotes_and_limits() {
        let long = "word ".repeat(700);
        let parts = vec![
            part(&long, &[], None),
            part(&long, &[], None),
            part("Another question?", &[], Some("wamid.2")),
            part(&"a ".repeat(600), &["Yes"], None),
        ];
        let packed = for_whatsapp(parts, 1);
        assert_eq!(packed.len(), 4, "no two fit together: {packed:?}");
        for p in &packed {
            assert!(units(&p.text) <= TEXT_LIMIT);
        }
        let short = vec![part("a", &[], None), part("b", &[], Some("wamid.3"))];
        assert_eq!(for_whatsapp(short, 1).len(), 2, "a quote starts a message");
    }

    proptest! {
        #[test]
        fn pieces_fit_and_keep_every_word(
            words in proptest::collection::vec("[a-z🙂é.!?\n]{1,12}", 0..400),
            limit in 8usize..200,
        ) {
            let text = words.join(" ");
            let pieces = split(&text, limit);
            for piece in &pieces {
                prop_assert!(units(piece) <= limit, "{piece:?} over {limit}");
            }
            let squash = |s: &str| s.split_whitespace().collect::<String>();
            prop_assert_eq!(squash(&pieces.concat()), squash(&text));
        }
    }
}
