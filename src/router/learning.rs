//! Learning from use: which of the turns kept with the router's guess a person should label.
//!
//! Every turn keeps what the router guessed ([`crate::store::Turns::set_route`]) and who then
//! answered. `sabi route --export-unsure` lists, as a labelling file:
//! 1. turns a person labelled on the review desk, with their label as the intent;
//! 2. turns where someone other than the one the guess pointed to answered (the router kept a
//!    message that a person or the agent then took, or sent to the agent one that ended with a
//!    person);
//! 3. the rest, least sure first: the guesses whose confidence was nearest the threshold that
//!    decides between a local answer and the agent.
//!
//! A line's `intent` is the person's label, or `null` until someone fills it in; files passed
//! to `--calibrate` or `--eval` skip the lines still without one.
//!
//! PURE: no IO.

use std::collections::HashSet;

use serde::Serialize;

use super::{ActionKind, Router};
use crate::store::{AnsweredBy, RoutedTurn};

/// Why a turn is in the export.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Why {
    Labelled,
    AnsweredOtherwise,
    Unsure,
}

/// One line of the labelling file.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Line {
    pub text: String,
    /// A person's label; `null` until one is given.
    pub intent: Option<String>,
    pub guess: String,
    pub confidence: f32,
    pub answered_by: AnsweredBy,
    pub why: Why,
    pub batch: i64,
}

/// The turns worth a person's label, most useful first, at most `limit`; each text once.
pub fn unsure(router: &Router, turns: Vec<RoutedTurn>, limit: usize) -> Vec<Line> {
    let mut ranked: Vec<(Why, f32, RoutedTurn)> = turns
        .into_iter()
        .filter(|t| !t.text.trim().is_empty())
        .map(|t| {
            let why = if t.label.is_some() {
                Why::Labelled
            } else if expected(router, &t) != t.answered_by {
                Why::AnsweredOtherwise
            } else {
                Why::Unsure
            };
            let doubt = router
                .threshold(&t.guess.intent)
                .map_or(0.0, |threshold| (t.guess.confidence - threshold).abs());
            (why, doubt, t)
        })
        .collect();
    // Stable: within a kind and an equal doubt, the latest turn (the store's order) first.
    ranked.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.total_cmp(&b.1)));
    let mut seen = HashSet::new();
    ranked
        .into_iter()
        .filter(|(_, _, t)| seen.insert(t.text.trim().to_lowercase()))
        .take(limit)
        .map(|(why, _, t)| Line {
            text: t.text,
            intent: t.label,
            guess: t.guess.intent,
            confidence: t.guess.confidence,
            answered_by: t.answered_by,
            why,
            batch: t.batch_id,
        })
        .collect()
}

/// Who the guess sent the turn to: the router's own reply or hand-off, else the agent.
fn expected(router: &Router, turn: &RoutedTurn) -> AnsweredBy {
    if !turn.guess.local {
        return AnsweredBy::Agent;
    }
    match router.action(&turn.guess.intent) {
        Some((ActionKind::Reply, Some(_), _)) => AnsweredBy::Router,
        Some((ActionKind::Handoff, _, _)) => AnsweredBy::Person,
        _ => AnsweredBy::Agent,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::At;
    use crate::store::RouteGuess;

    fn turn(batch: i64, text: &str, guess: &str, confidence: f32, local: bool) -> RoutedTurn {
        RoutedTurn {
            batch_id: batch,
            text: text.into(),
            guess: RouteGuess {
                intent: guess.into(),
                confidence,
                local,
            },
            answered_by: if local {
                AnsweredBy::Router
            } else {
                AnsweredBy::Agent
            },
            label: None,
            finished_at: At::from_millis(batch),
        }
    }

    #[test]
    fn labels_come_first_then_other_answerers_then_the_least_sure() {
        let router = Router::shared(crate::config::DEFAULT_INTENTS).expect("router");
        let threshold = router.threshold("check_balance").expect("an intent");
        let mut labelled = turn(1, "my balance no show", "check_balance", 0.3, false);
        labelled.label = Some("check_balance".into());
        let mut taken = turn(2, "wetin be my balance", "check_balance", 1.0, true);
        taken.answered_by = AnsweredBy::Person;
        let near = turn(
            3,
            "I no fit see my balance",
            "check_balance",
            threshold - 0.01,
            false,
        );
        let far = turn(4, "tell me a story", "check_balance", 0.01, false);
        let again = turn(5, "Tell me a story ", "check_balance", 0.01, false);
        let lines = unsure(&router, vec![far, near, again, taken, labelled], 10);
        let order: Vec<(i64, Why)> = lines.iter().map(|l| (l.batch, l.why)).collect();
        assert_eq!(
            order,
            [
                (1, Why::Labelled),
                (2, Why::AnsweredOtherwise),
                (3, Why::Unsure),
                (4, Why::Unsure),
            ],
            "the repeated text is listed once"
        );
        assert_eq!(lines[0].intent.as_deref(), Some("check_balance"));
        assert_eq!(lines[1].intent, None, "unlabelled until a person says");
        assert_eq!(unsure(&router, Vec::new(), 10), []);
    }
}
