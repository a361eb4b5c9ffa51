//! An inbound item's lifecycle: a customer's message waits for its turn, is answered in it or
//! handed to a person; everything else is only recorded.

use super::batch::BatchState;
use super::named;
use crate::domain::ItemKind;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ItemState {
    /// A message waiting for its conversation's next turn.
    Pending,
    /// In a turn now.
    Batched,
    /// Its turn answered it.
    Answered,
    /// Its turn handed it to a person.
    Review,
    /// A message that deliberately asks for no turn (a reaction, a system notice, ...).
    Skipped,
    /// Deleted by the customer before its turn.
    Withdrawn,
    /// Not a message: a status, an error, a field event.
    Recorded,
}

named!(ItemState {
    Pending => "pending",
    Batched => "batched",
    Answered => "answered",
    Review => "review",
    Skipped => "skipped",
    Withdrawn => "withdrawn",
    Recorded => "recorded",
});

/// What can happen to a stored message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// Its conversation's turn took it.
    Claimed,
    /// The turn it is in ended so.
    TurnEnded(BatchState),
    /// The customer deleted it.
    Withdrawn,
    /// A person sent its batch back for a new turn.
    Requeued,
    /// A person replied to it (the web chat shows the reply as its answer).
    PersonReplied,
}

/// The state an inbound item is stored in: a message that asks for a turn (`turn`) waits for
/// it; one that does not is skipped; anything else is only recorded.
pub fn arrived(kind: ItemKind, turn: bool) -> ItemState {
    match (kind, turn) {
        (ItemKind::Message, true) => ItemState::Pending,
        (ItemKind::Message, false) => ItemState::Skipped,
        _ => ItemState::Recorded,
    }
}

/// The state after `event`, or `None` when the event does not apply (nothing changes).
pub fn next(state: ItemState, event: Event) -> Option<ItemState> {
    use ItemState::*;
    match (state, event) {
        (Pending, Event::Claimed) => Some(Batched),
        (Batched, Event::TurnEnded(BatchState::Done)) => Some(Answered),
        (Batched, Event::TurnEnded(BatchState::Review)) => Some(Review),
        (Pending, Event::Withdrawn) => Some(Withdrawn),
        (Batched | Answered | Review, Event::Requeued) => Some(Pending),
        (Batched | Review, Event::PersonReplied) => Some(Answered),
        _ => None,
    }
}

/// A web-chat question's job, as its browser sees it, from the question's state.
pub fn job_status(state: ItemState) -> JobStatus {
    match state {
        ItemState::Pending => JobStatus::Queued,
        ItemState::Batched => JobStatus::Started,
        ItemState::Answered => JobStatus::Finished,
        _ => JobStatus::Failed,
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum JobStatus {
    Queued,
    Started,
    Finished,
    Failed,
}

#[cfg(test)]
mod tests {
    use super::*;

    const EVENTS: [Event; 8] = [
        Event::Claimed,
        Event::TurnEnded(BatchState::Running),
        Event::TurnEnded(BatchState::Waiting),
        Event::TurnEnded(BatchState::Done),
        Event::TurnEnded(BatchState::Review),
        Event::Withdrawn,
        Event::Requeued,
        Event::PersonReplied,
    ];

    #[test]
    fn what_is_not_a_waiting_message_never_enters_a_turn() {
        for state in ItemState::ALL {
            for event in EVENTS {
                if let Some(to) = next(*state, event) {
                    assert!(
                        !matches!(
                            state,
                            ItemState::Skipped | ItemState::Recorded | ItemState::Withdrawn
                        ),
                        "{state} moved on {event:?}"
                    );
                    if to == ItemState::Batched {
                        assert_eq!(*state, ItemState::Pending);
                    }
                }
            }
        }
    }

    #[test]
    fn a_message_in_a_turn_cannot_be_withdrawn_and_a_retry_keeps_it_in_its_turn() {
        assert_eq!(next(ItemState::Batched, Event::Withdrawn), None);
        assert_eq!(
            next(ItemState::Batched, Event::TurnEnded(BatchState::Waiting)),
            None
        );
    }

    #[test]
    fn only_a_waiting_question_is_queued_and_only_an_answered_one_finished() {
        for state in ItemState::ALL {
            assert_eq!(
                job_status(*state) == JobStatus::Queued,
                *state == ItemState::Pending
            );
            assert_eq!(
                job_status(*state) == JobStatus::Finished,
                *state == ItemState::Answered
            );
        }
    }
}
