//! Learning from use across the roles: a turn keeps the router's guess (Turns), a person
//! labels it (Reviews), and the ended turns come back with who answered them (Inspection).

use std::sync::Arc;

use sabi::clock::At;
use sabi::store::{AnsweredBy, Ending, Error, RouteGuess, RoutedTurn, Store, TurnUsage};

use super::{T0, ingest, message, reply};
use crate::helpers::ms;

fn guess(intent: &str, confidence: f32, local: bool) -> RouteGuess {
    RouteGuess {
        intent: intent.into(),
        confidence,
        local,
    }
}

/// Claims the one batch due, keeps `route` with it, uses the model when `used` and ends it
/// with `ending` at `at`: the batch's id.
async fn routed(
    store: &Arc<dyn Store>,
    route: Option<RouteGuess>,
    used: bool,
    ending: Ending,
    at: At,
) -> i64 {
    let claims = store.claim(at, ms(60_000), 10, None).await.expect("claim");
    assert_eq!(claims.len(), 1, "one turn due");
    let batch = claims[0].batch.id;
    if let Some(route) = route {
        store.set_route(batch, route).await.expect("route kept");
    }
    if used {
        let usage = TurnUsage {
            prompt_tokens: 10,
            completion_tokens: 2,
            cost: 0.5,
        };
        store.add_usage(batch, usage).await.expect("usage");
    }
    store
        .finish(batch, claims[0].token, at, ending)
        .await
        .expect("finish");
    batch
}

pub async fn routed_turns_keep_the_guess_who_answered_and_a_label(store: Arc<dyn Store>) {
    let handoff = Ending::Review {
        reason: sabi::domain::ReviewReason::HandoffAsked,
        error: None,
    };
    // c1 in two messages, answered by the router; c2 by the agent; c3 by a person; c4 with no
    // guess kept; c5 still waiting for a retry.
    let said = [
        message("wamid.l1b", "c1", "my balance?", T0 + ms(2_000)),
        message("wamid.l1a", "c1", "hello", T0 + ms(1_000)),
    ];
    ingest(&store, said.into(), T0 + ms(2_000)).await;
    let local = routed(
        &store,
        Some(guess("check_balance", 0.97, true)),
        false,
        reply("Balance"),
        T0 + ms(20_000),
    )
    .await;
    let steps: [(&str, Option<RouteGuess>, bool, Ending); 3] = [
        (
            "c2",
            Some(guess("out_of_scope", 0.40, false)),
            true,
            reply("Agent"),
        ),
        (
            "c3",
            Some(guess("check_balance", 0.61, false)),
            false,
            handoff,
        ),
        ("c4", None, false, reply("Unrouted")),
    ];
    let mut batches = vec![local];
    for (n, (customer, route, used, ending)) in steps.into_iter().enumerate() {
        let at = T0 + ms(30_000 + 10_000 * n as u64);
        let item = message(
            &format!("wamid.l-{customer}"),
            customer,
            "words",
            at - ms(15_000),
        );
        ingest(&store, vec![item], at - ms(15_000)).await;
        batches.push(routed(&store, route, used, ending, at).await);
    }
    let waiting = message("wamid.l-c5", "c5", "later", T0 + ms(60_000));
    ingest(&store, vec![waiting], T0 + ms(60_000)).await;
    let claim = store
        .claim(T0 + ms(75_000), ms(60_000), 10, None)
        .await
        .expect("claim")
        .remove(0);
    store
        .set_route(claim.batch.id, guess("greeting", 0.5, false))
        .await
        .expect("route kept");
    let retry = Ending::RetryAt {
        at: T0 + ms(99_000),
        error: "later".into(),
    };
    store
        .finish(claim.batch.id, claim.token, T0 + ms(75_000), retry)
        .await
        .expect("retry");

    store
        .label_turn(batches[2], "agent_escalation")
        .await
        .expect("labelled");
    store
        .label_turn(batches[2], "check_balance")
        .await
        .expect("labelled again");
    assert!(matches!(
        store.label_turn(9_999, "check_balance").await,
        Err(Error::NotFound)
    ));

    let all = store.routed_turns(At::default(), 10).await.expect("routed");
    let expected = [
        (
            batches[2],
            "words",
            AnsweredBy::Person,
            Some("check_balance"),
        ),
        (batches[1], "words", AnsweredBy::Agent, None),
        (local, "hello\nmy balance?", AnsweredBy::Router, None),
    ];
    let got: Vec<(i64, &str, AnsweredBy, Option<&str>)> = all
        .iter()
        .map(|t| {
            (
                t.batch_id,
                t.text.as_str(),
                t.answered_by,
                t.label.as_deref(),
            )
        })
        .collect();
    assert_eq!(
        got, expected,
        "the latest first; unrouted and unended turns left out"
    );
    assert_eq!(all[1].guess, guess("out_of_scope", 0.40, false));
    assert!((all[0].guess.confidence - 0.61).abs() < 1e-6);
    assert_eq!(all[0].finished_at, T0 + ms(40_000));
    let recent: Vec<i64> = store
        .routed_turns(T0 + ms(30_000), 10)
        .await
        .expect("routed")
        .iter()
        .map(|t: &RoutedTurn| t.batch_id)
        .collect();
    assert_eq!(
        recent,
        [batches[2], batches[1]],
        "ended at the cut-off counts"
    );
    let first = store.routed_turns(At::default(), 1).await.expect("routed");
    assert_eq!(first.len(), 1);
}
