//! Stop and start requests: a WhatsApp customer who writes STOP (or "no send me again", "ẹ má
//! fi ránṣẹ́ sí mi mọ́", "kwụsị", "ku daina turo min saƙo", ...) is opted out of broadcasts
//! and told so once; START opts them back in. Service replies never read it.
//!
//! A request is a whole message, give or take a "please": "stop" inside a sentence ("stop my
//! order") is a question for the assistant, not an opt-out. [`Consent`] wraps the turn handler:
//! a batch made only of such requests gets the confirmation instead of an answer; one with more
//! in it is answered as usual, the confirmation first. The request counts from when the
//! customer sent it, so a later choice made in WhatsApp's own menu is never undone by it.
//!
//! Words that only look like requests are messages:
//! - "Start", "Resume" or "Subscribe" from a customer who is not opted out (what click-to-WhatsApp
//!   ads prefill) is answered like any message;
//! - "wait" ("tsaya" in Hausa, "ẹ dúró" in Yoruba) and Pidgin "don stop" ("has stopped") are
//!   not requests at all;
//! - a bare "stop" right after the assistant asked a question is most likely an answer to it:
//!   it is answered, and the opt-out offered as a choice ([`STOP_OFFER_BUTTON`]) instead of
//!   made at once.

use std::sync::Arc;

use async_trait::async_trait;
use unicode_normalization::UnicodeNormalization;
use unicode_normalization::char::is_combining_mark;

use crate::clock::At;
use crate::domain::{Batch, Channel, ReplyPart};
use crate::store::rules::consent::Source;
use crate::store::{Broadcasts, Choice, Speaker, Turns};
use crate::turn::{TurnError, TurnHandler, TurnOutcome};

/// What a customer asked of broadcasts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Request {
    Stop,
    Start,
}

/// Stop requests, folded (see [`fold`]): English, Nigerian Pidgin, Yoruba, Igbo and Hausa.
const STOP: &[&str] = &[
    "stop",
    "stop all",
    "stopall",
    "unsubscribe",
    "unsub",
    "opt out",
    "optout",
    "stop messages",
    "stop offers",
    "stop sending",
    "stop sending me messages",
    "stop messaging me",
    "no more messages",
    "remove me",
    "remove me from your list",
    "no send me again",
    "no send me message again",
    "no send me messages again",
    "no send me anything again",
    "no dey send me message",
    "no dey send me message again",
    "no dey send me messages again",
    "stop am",
    "make una stop",
    "make una stop to dey send me message",
    "i no want una message again",
    "i no wan see una message again",
    "ma fi ranse si mi mo",
    "e ma fi ranse si mi mo",
    "e ma ranse si mi mo",
    "mi o fe ifiranse mo",
    "kwusi",
    "kwusi ya",
    "ezitela m ozi ozo",
    "ezitekwala m ozi",
    "achoghi m ozi ozo",
    "ku daina",
    "ka daina turo min sako",
    "ku daina turo min sako",
    "kar ku sake turo min sako",
    "ba na son sako",
];

/// Start requests, folded.
const START: &[&str] = &[
    "start",
    "unstop",
    "subscribe",
    "resume",
    "opt in",
    "optin",
    "start again",
    "start sending again",
    "start dey send me message again",
    "una fit dey send me message again",
    "e bere",
    "e maa fi ranse si mi",
    "malite",
    "bido",
    "ku ci gaba da turo min sako",
];

/// Words of courtesy around a request that do not change it. Hausa's "don Allah" and "dan
/// Allah" ("please") count only together: Pidgin "don" alone marks a thing done ("don stop",
/// "has stopped").
const COURTESY: &[&str] = &[
    "please", "pls", "plz", "abeg", "biko", "jor", "jare", "o", "oo", "sir", "now", "thanks",
    "thank", "you", "ejo", "allah",
];

/// The quick reply that offers the opt-out when a bare "stop" may have answered a question; its
/// words are a stop request.
pub const STOP_OFFER_BUTTON: &str = "Stop offers";

/// Whether `text`, taken whole, is a stop or start request.
pub fn request(text: &str) -> Option<Request> {
    let core = core(text)?;
    if STOP.contains(&core.as_str()) {
        Some(Request::Stop)
    } else if START.contains(&core.as_str()) {
        Some(Request::Start)
    } else {
        None
    }
}

/// Whether `text` is "stop" alone (give or take a "please"), the word that may answer a
/// question as well as ask for an opt-out.
fn bare_stop(text: &str) -> bool {
    core(text).as_deref() == Some("stop")
}

/// The words of `text` without the courtesy around them.
fn core(text: &str) -> Option<String> {
    let folded = fold(text);
    let mut words: Vec<&str> = Vec::new();
    let mut rest = folded.split_whitespace().peekable();
    while let Some(word) = rest.next() {
        if matches!(word, "don" | "dan") && rest.peek() == Some(&"allah") {
            continue;
        }
        words.push(word);
    }
    let first = words.iter().position(|w| !COURTESY.contains(w))?;
    let last = words.iter().rposition(|w| !COURTESY.contains(w))?;
    Some(words[first..=last].join(" "))
}

/// Lower case without accents (ẹ, ụ, ƙ and the tones all fold to plain letters), punctuation
/// and emoji as spaces.
fn fold(text: &str) -> String {
    text.nfd()
        .filter(|c| !is_combining_mark(*c))
        .map(|c| match c {
            'ƙ' | 'Ƙ' => 'k',
            'ɗ' | 'Ɗ' => 'd',
            'ɓ' | 'Ɓ' => 'b',
            c if c.is_alphanumeric() => c.to_lowercase().next().unwrap_or(c),
            '\'' | '\u{2019}' => '\u{0}',
            _ => ' ',
        })
        .filter(|c| *c != '\u{0}')
        .collect()
}

/// What the customer is told, once, when their standing changes.
#[derive(Debug, Clone)]
pub struct Replies {
    pub stopped: String,
    pub started: String,
    /// Offers the opt-out, with the [`STOP_OFFER_BUTTON`], after a bare "stop" that may have
    /// answered a question. It must not end with a question mark.
    pub offer: String,
}

/// The turn handler that hears stop and start requests before `inner` answers.
pub struct Consent {
    inner: Arc<dyn TurnHandler>,
    /// Where a customer's choice is kept: [`Broadcasts::choose`].
    choices: Arc<dyn Broadcasts>,
    /// What the customer was sent last (a reply, a broadcast), to read a bare "stop" against.
    turns: Arc<dyn Turns>,
    replies: Replies,
}

impl Consent {
    pub fn new(
        inner: Arc<dyn TurnHandler>,
        choices: Arc<dyn Broadcasts>,
        turns: Arc<dyn Turns>,
        replies: Replies,
    ) -> Arc<Consent> {
        Arc::new(Consent {
            inner,
            choices,
            turns,
            replies,
        })
    }

    /// Keeps the customer's last request of the batch, made `at`; the confirmation when it
    /// changed their standing (a repeat gets none).
    async fn keep(
        &self,
        customer: &str,
        asked: Request,
        at: At,
    ) -> Result<Option<ReplyPart>, TurnError> {
        let choice = Choice {
            opted_out: asked == Request::Stop,
            source: Source::Keyword,
            at,
        };
        let changed = self
            .choices
            .choose(customer, choice)
            .await
            .map_err(|e| TurnError(format!("keeping a stop or start request: {e}")))?;
        let text = match asked {
            Request::Stop => &self.replies.stopped,
            Request::Start => &self.replies.started,
        };
        Ok(changed.then(|| ReplyPart::text(text.clone())))
    }

    async fn opted_out(&self, customer: &str) -> Result<bool, TurnError> {
        let out = self
            .choices
            .opted_out(&[customer.to_owned()])
            .await
            .map_err(|e| TurnError(format!("reading whether the customer opted out: {e}")))?;
        Ok(out.contains(customer))
    }

    /// Whether the last thing the customer was sent before `batch` is a reply that ended with
    /// a question: a broadcast sent since makes a bare "stop" the opt-out it usually is.
    async fn asked_a_question(&self, batch: &Batch) -> Result<bool, TurnError> {
        let failed = |e: crate::store::Error| TurnError(format!("reading the last reply: {e}"));
        let history = self.turns.history(batch.id, 1).await.map_err(failed)?;
        let Some(reply) = history
            .iter()
            .rev()
            .find(|e| e.speaker == Speaker::Business)
            .filter(|e| e.text.trim_end().ends_with(['?', '\u{ff1f}']))
        else {
            return Ok(false);
        };
        // Up to when the batch fell due: WhatsApp's send times are whole seconds, and a
        // broadcast that crossed the customer's message makes it an opt-out all the more.
        let broadcast = self
            .turns
            .last_broadcast(
                &batch.conversation,
                reply.at,
                batch.due_at.max(batch.first_sent_at()),
            )
            .await
            .map_err(failed)?;
        Ok(broadcast.is_none())
    }
}

#[async_trait]
impl TurnHandler for Consent {
    async fn handle(&self, batch: &Batch) -> Result<TurnOutcome, TurnError> {
        if batch.conversation.channel != Channel::Whatsapp {
            return self.inner.handle(batch).await;
        }
        let asked: Vec<Option<Request>> = batch
            .messages
            .iter()
            .map(|m| m.text.as_deref().and_then(request))
            .collect();
        let last = batch
            .messages
            .iter()
            .zip(&asked)
            .rev()
            .find_map(|(m, asked)| Some((*asked)?).map(|a| (a, m.sent_at())));
        let Some((last, at)) = last else {
            return self.inner.handle(batch).await;
        };
        let customer = &batch.conversation.customer;
        // "Start" from someone who gets broadcasts already is a greeting (an ad's prefilled
        // text): answered like any message.
        if last == Request::Start && !self.opted_out(customer).await? {
            return self.inner.handle(batch).await;
        }
        // "stop" alone after a question is most likely its answer: answered, with the opt-out
        // offered as a choice.
        let bare = batch
            .messages
            .iter()
            .all(|m| m.text.as_deref().is_some_and(bare_stop));
        if bare && self.asked_a_question(batch).await? {
            let offer = ReplyPart {
                options: vec![STOP_OFFER_BUTTON.to_owned()],
                ..ReplyPart::text(self.replies.offer.clone())
            };
            let with_offer =
                |parts: Vec<ReplyPart>| parts.into_iter().chain([offer.clone()]).collect();
            return Ok(match self.inner.handle(batch).await? {
                TurnOutcome::Reply(parts) => TurnOutcome::Reply(with_offer(parts)),
                TurnOutcome::Handoff { parts, note } => TurnOutcome::Handoff {
                    parts: with_offer(parts),
                    note,
                },
                review => review,
            });
        }
        // The rest of the batch is answered first: were that to fail, the turn is tried again,
        // and the request is kept (and confirmed) then.
        let answer = match asked.iter().all(Option::is_some) {
            true => None,
            false => Some(self.inner.handle(batch).await?),
        };
        let confirmation = self.keep(&batch.conversation.customer, last, at).await?;
        let first = |parts: Vec<ReplyPart>| confirmation.iter().cloned().chain(parts).collect();
        Ok(match answer {
            None => TurnOutcome::Reply(first(Vec::new())),
            Some(TurnOutcome::Reply(parts)) => TurnOutcome::Reply(first(parts)),
            Some(TurnOutcome::Handoff { parts, note }) => TurnOutcome::Handoff {
                parts: first(parts),
                note,
            },
            Some(review) => review,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_messages_in_five_languages_are_requests() {
        for stop in [
            "STOP",
            "Stop.",
            "stop please",
            "Unsubscribe",
            "abeg no send me again o",
            "No dey send me message again!!",
            "Ẹ má fi ránṣẹ́ sí mi mọ́",
            "Kwụsị",
            "Ku daina turo min saƙo",
            "Don Allah ku daina",
            "Please opt-out",
            "Stop offers",
        ] {
            assert_eq!(request(stop), Some(Request::Stop), "{stop}");
        }
        for start in ["START", "start again pls", "Unstop", "Bido"] {
            assert_eq!(request(start), Some(Request::Start), "{start}");
        }
    }

    #[test]
    fn a_request_inside_a_sentence_is_a_question() {
        for text in [
            "stop my order",
            "how do I stop the delivery",
            "when does the sale start",
            "no send me the wrong size again",
            "please",
            "",
        ] {
            assert_eq!(request(text), None, "{text}");
        }
    }

    #[test]
    fn wait_and_has_stopped_are_not_requests() {
        for text in [
            "Tsaya",
            "tsaya please",
            "Ẹ dúró",
            "e duro o",
            "don stop",
            "E don stop",
        ] {
            assert_eq!(request(text), None, "{text}");
        }
        assert!(bare_stop("Stop."));
        assert!(bare_stop("stop abeg"));
        assert!(!bare_stop("stop all"));
        assert!(!bare_stop("unsubscribe"));
    }
}
