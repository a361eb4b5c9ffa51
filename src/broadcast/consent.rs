//! Stop and start requests: a WhatsApp customer who writes STOP (or "no send me again", "ẹ má
//! fi ránṣẹ́ sí mi mọ́", "kwụsị", "ku daina turo min saƙo", ...) is opted out of broadcasts
//! and told so once; START opts them back in. Service replies never read it.
//!
//! A request is a whole message, give or take a "please": "stop" inside a sentence ("stop my
//! order") is a question for the assistant, not an opt-out. [`Consent`] wraps the turn handler:
//! a batch made only of such requests gets the confirmation instead of an answer; one with more
//! in it is answered as usual, the confirmation first. The request counts from when the
//! customer sent it, so a later choice made in WhatsApp's own menu is never undone by it.

use std::sync::Arc;

use async_trait::async_trait;
use unicode_normalization::UnicodeNormalization;
use unicode_normalization::char::is_combining_mark;

use crate::clock::At;
use crate::domain::{Batch, Channel, ReplyPart};
use crate::store::rules::consent::Source;
use crate::store::{Broadcasts, Choice};
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
    "e duro",
    "ma fi ranse si mi mo",
    "e ma fi ranse si mi mo",
    "e ma ranse si mi mo",
    "mi o fe ifiranse mo",
    "kwusi",
    "kwusi ya",
    "ezitela m ozi ozo",
    "ezitekwala m ozi",
    "achoghi m ozi ozo",
    "tsaya",
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

/// Words of courtesy around a request that do not change it.
const COURTESY: &[&str] = &[
    "please", "pls", "plz", "abeg", "biko", "jor", "jare", "o", "oo", "sir", "now", "thanks",
    "thank", "you", "ejo", "don", "allah", "dan",
];

/// Whether `text`, taken whole, is a stop or start request.
pub fn request(text: &str) -> Option<Request> {
    let folded = fold(text);
    let words: Vec<&str> = folded.split_whitespace().collect();
    let first = words.iter().position(|w| !COURTESY.contains(w))?;
    let last = words.iter().rposition(|w| !COURTESY.contains(w))?;
    let core = words[first..=last].join(" ");
    if STOP.contains(&core.as_str()) {
        Some(Request::Stop)
    } else if START.contains(&core.as_str()) {
        Some(Request::Start)
    } else {
        None
    }
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
}

/// The turn handler that hears stop and start requests before `inner` answers.
pub struct Consent {
    inner: Arc<dyn TurnHandler>,
    store: Arc<dyn Broadcasts>,
    replies: Replies,
}

impl Consent {
    pub fn new(
        inner: Arc<dyn TurnHandler>,
        store: Arc<dyn Broadcasts>,
        replies: Replies,
    ) -> Arc<Consent> {
        Arc::new(Consent {
            inner,
            store,
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
            .store
            .choose(customer, choice)
            .await
            .map_err(|e| TurnError(format!("keeping a stop or start request: {e}")))?;
        let text = match asked {
            Request::Stop => &self.replies.stopped,
            Request::Start => &self.replies.started,
        };
        Ok(changed.then(|| ReplyPart::text(text.clone())))
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
            "Please opt-out",
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
}
