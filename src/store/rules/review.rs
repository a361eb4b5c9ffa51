//! A review item's lifecycle: open until a person settles it once; a send that fails again
//! after a person requeued it opens its item again. On a live channel (the web chat, whose
//! visitor waits on the page and answers back) a person's reply does not settle the item: the
//! person holds the conversation, and what the visitor writes meanwhile joins the item, until
//! the person closes or requeues it.

use std::time::Duration;

use super::item::ItemState;
use super::named;
use crate::clock::At;

/// Whether the customer waits on the other end for a person's next word.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Line {
    /// WhatsApp: a reply goes out and settles the item; the customer's next message is a new turn.
    Async,
    /// The web chat: a reply keeps the item open, and the person holds the conversation.
    Live,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReviewState {
    /// Waiting for a person.
    Open,
    /// A person replied to the customer.
    Replied,
    /// A person sent it back to the automatic path.
    Requeued,
    /// A person closed it: nothing more to do.
    Closed,
}

named!(ReviewState {
    Open => "open",
    Replied => "replied",
    Requeued => "requeued",
    Closed => "closed",
});

/// The state a person's resolution leaves an open item in; `None` when the item is already
/// settled (each item is settled once). On a [`Line::Live`] a reply leaves it open.
pub fn settle(state: ReviewState, resolution: &Resolution, line: Line) -> Option<ReviewState> {
    if state != ReviewState::Open {
        return None;
    }
    Some(match (resolution, line) {
        (Resolution::Reply { desk: Some(_), .. }, _) => ReviewState::Open,
        (Resolution::Reply { .. }, Line::Live) => ReviewState::Open,
        (Resolution::Reply { .. }, Line::Async) => ReviewState::Replied,
        (Resolution::Requeue, _) => ReviewState::Requeued,
        (Resolution::Close, _) => ReviewState::Closed,
    })
}

/// The line a conversation of `channel` is (by the channel's name).
pub fn line(channel: &str) -> Line {
    match channel {
        "webchat" => Line::Live,
        _ => Line::Async,
    }
}

/// Where a web-chat visitor's new message goes, given the state of the latest review item of
/// their conversation (`None`: there is none).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Destination {
    /// To a new turn: it waits in the inbox, and its conversation is scheduled.
    Turn,
    /// To the person holding the open item: the message joins the item's batch (the desk shows
    /// it there), in [`ItemState::Review`], and no turn is scheduled for it.
    Person,
}

/// While a person holds the conversation (its item is open), the visitor talks to the person,
/// never to the assistant: Sabi does not answer a customer a person is answering.
pub fn destination(latest: Option<ReviewState>) -> Destination {
    match latest {
        Some(ReviewState::Open) => Destination::Person,
        _ => Destination::Turn,
    }
}

/// The state a new message starts in for its destination.
pub fn arriving(destination: Destination) -> ItemState {
    match destination {
        Destination::Turn => ItemState::Pending,
        Destination::Person => ItemState::Review,
    }
}

/// Whether a person holds the conversation at `now`: they replied to the customer (from the
/// desk, the admin API or the WhatsApp Business app) within their hold. Meanwhile the
/// assistant stands down on every channel: a batch claimed then goes to the person
/// ([`ReviewReason::PersonAnswering`](crate::domain::ReviewReason::PersonAnswering)), never to
/// a turn.
pub fn person_holds(held_until: Option<At>, now: At) -> bool {
    held_until.is_some_and(|until| until > now)
}

/// How long a help desk holds a conversation handed to it: until the desk resolves it (the
/// largest time every store keeps exactly).
pub const DESK_HOLD: At = At::from_millis(99_999_999_999_999);

/// How long a help desk's reply is remembered as sent: a desk delivers a webhook again within
/// minutes when unsure.
pub const DESK_REPLY_MEMORY: Duration = Duration::from_secs(7 * 24 * 3600);

/// A person's hold on the conversation after they replied at `at`: `hold`
/// (`engine.human_hold`) from their latest reply, so each reply renews it.
pub fn held_after_reply(at: At, hold: Duration) -> At {
    at + hold
}

/// A person's hold after `resolution` at `now`: a reply holds the conversation (see
/// [`held_after_reply`]); closing the item or sending it back gives the customer back to the
/// assistant at once.
pub fn hold_after(resolution: &Resolution, now: At) -> Option<At> {
    match resolution {
        Resolution::Reply { hold, .. } => Some(held_after_reply(now, *hold)),
        Resolution::Requeue | Resolution::Close => None,
    }
}

/// How a person settles a review item.
#[derive(Debug, Clone, PartialEq)]
pub enum Resolution {
    /// A person's reply to the customer, through the outbox and all its rules; the person then
    /// holds the conversation for `hold` (`engine.human_hold`).
    Reply {
        text: String,
        sandbox: bool,
        hold: Duration,
        /// From a help desk: its id of the message. The desk holds the conversation until it
        /// resolves it, so the item stays open for the desk's next reply; and the desk may
        /// deliver a message more than once, so a reply with an id already sent is not sent
        /// again.
        desk: Option<String>,
    },
    /// Back to the automatic path: a batch's messages become pending again for a new turn; a
    /// failed or unknown send is queued again (the person accepts it may arrive twice).
    Requeue,
    /// Nothing more to do.
    Close,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resolutions() -> [Resolution; 3] {
        [
            Resolution::Reply {
                text: "on it".into(),
                sandbox: false,
                hold: HOUR,
                desk: None,
            },
            Resolution::Requeue,
            Resolution::Close,
        ]
    }

    const HOUR: Duration = Duration::from_secs(3600);

    #[test]
    fn a_persons_reply_holds_the_conversation_and_leaving_it_gives_it_back() {
        let now = At::from_millis(1_000_000);
        let [reply, requeue, close] = resolutions();
        let until = hold_after(&reply, now).expect("a reply holds");
        assert_eq!(until, now + HOUR);
        assert!(person_holds(Some(until), now));
        assert!(person_holds(
            Some(until),
            now + HOUR - Duration::from_millis(1)
        ));
        assert!(!person_holds(Some(until), now + HOUR), "the hold ends");
        assert!(!person_holds(None, now));
        assert_eq!(hold_after(&requeue, now), None);
        assert_eq!(hold_after(&close, now), None);
        // Each reply renews it from its own time.
        let later = now + HOUR / 2;
        assert_eq!(held_after_reply(later, HOUR), later + HOUR);
    }

    #[test]
    fn only_an_open_item_is_settled_and_never_back_to_open() {
        for state in ReviewState::ALL {
            for resolution in &resolutions() {
                let to = settle(*state, resolution, Line::Async);
                assert_eq!(
                    to.is_some(),
                    *state == ReviewState::Open,
                    "{state} {resolution:?}"
                );
                assert_ne!(to, Some(ReviewState::Open));
                // Settling is final: a second resolution is refused whatever it is.
                if let Some(to) = to {
                    assert!(
                        resolutions()
                            .iter()
                            .all(|r| settle(to, r, Line::Async).is_none())
                    );
                }
            }
        }
    }

    #[test]
    fn on_a_live_line_a_reply_keeps_the_person_in_the_conversation_until_they_leave() {
        let [reply, requeue, close] = resolutions();
        let open = ReviewState::Open;
        assert_eq!(settle(open, &reply, Line::Live), Some(open));
        assert_eq!(
            settle(open, &requeue, Line::Live),
            Some(ReviewState::Requeued)
        );
        assert_eq!(settle(open, &close, Line::Live), Some(ReviewState::Closed));
        assert_eq!(line("webchat"), Line::Live);
        assert_eq!(line("whatsapp"), Line::Async);
    }

    #[test]
    fn a_visitor_talks_to_the_person_only_while_the_item_is_open() {
        for state in ReviewState::ALL {
            let to = destination(Some(*state));
            assert_eq!(to == Destination::Person, *state == ReviewState::Open);
            assert_eq!(arriving(to) == ItemState::Review, to == Destination::Person);
        }
        assert_eq!(destination(None), Destination::Turn);
        assert_eq!(arriving(Destination::Turn), ItemState::Pending);
    }

    #[test]
    fn names_round_trip() {
        for state in ReviewState::ALL {
            assert_eq!(ReviewState::parse(state.as_str()), Some(*state));
        }
    }
}
