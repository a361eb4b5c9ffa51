//! A review item's lifecycle: open until a person settles it once; a send that fails again
//! after a person requeued it opens its item again.

use super::named;
use crate::store::Resolution;

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
/// settled (each item is settled once).
pub fn settle(state: ReviewState, resolution: &Resolution) -> Option<ReviewState> {
    if state != ReviewState::Open {
        return None;
    }
    Some(match resolution {
        Resolution::Reply { .. } => ReviewState::Replied,
        Resolution::Requeue => ReviewState::Requeued,
        Resolution::Close => ReviewState::Closed,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resolutions() -> [Resolution; 3] {
        [
            Resolution::Reply {
                text: "on it".into(),
                sandbox: false,
            },
            Resolution::Requeue,
            Resolution::Close,
        ]
    }

    #[test]
    fn only_an_open_item_is_settled_and_never_back_to_open() {
        for state in ReviewState::ALL {
            for resolution in &resolutions() {
                let to = settle(*state, resolution);
                assert_eq!(
                    to.is_some(),
                    *state == ReviewState::Open,
                    "{state} {resolution:?}"
                );
                assert_ne!(to, Some(ReviewState::Open));
                // Settling is final: a second resolution is refused whatever it is.
                if let Some(to) = to {
                    assert!(resolutions().iter().all(|r| settle(to, r).is_none()));
                }
            }
        }
    }

    #[test]
    fn names_round_trip() {
        for state in ReviewState::ALL {
            assert_eq!(ReviewState::parse(state.as_str()), Some(*state));
        }
    }
}
