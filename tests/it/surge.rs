//! A surge: what the engine does when everybody writes at once (the broadcast's replies). The
//! model provider's budget is shared by every turn: a 429 pauses them together.

use std::sync::Arc;
use std::time::Duration;

use sabi::agent::budget::Limits;
use sabi::agent::llm::{ChatMessage, Llm, LlmContext, Provider, Providers, Retries, Sampling};
use sabi::clock::{At, ManualClock};
use sabi::metrics::Metrics;
use sabi::testing::llm::{Answer, FakeLlm};

use crate::helpers::eventually;

fn client(fake: &FakeLlm, clock: Arc<ManualClock>, metrics: Arc<Metrics>) -> Arc<Llm> {
    let provider = Provider {
        base_url: fake.base_url(),
        api_key: None,
        model: "fake-model".into(),
    };
    let limits = Limits {
        concurrent: 4,
        requests_per_minute: None,
        tokens_per_minute: None,
    };
    let context = LlmContext {
        timeout: Duration::from_secs(10),
        retries: Retries {
            attempts: 3,
            backoff: Duration::from_secs(1),
        },
        sampling: Sampling::default(),
        clock,
        metrics,
    };
    Arc::new(Llm::new((provider, limits), None, context).expect("client"))
}

/// One turn's 429 holds every turn's call for its Retry-After; then they all go.
#[tokio::test]
async fn a_429_pauses_every_turn_together_for_its_retry_after() {
    let fake = FakeLlm::start().await;
    fake.script([Answer::Throttled(30)]);
    let clock = ManualClock::new(At::from_millis(1_781_000_000_000));
    let metrics = Metrics::new();
    let llm = client(&fake, clock.clone(), metrics.clone());
    let ask = |llm: Arc<Llm>, text: &'static str| {
        tokio::spawn(async move {
            let messages = [ChatMessage::new("user", text)];
            llm.complete(&messages, &[], Providers::All).await
        })
    };
    let first = ask(llm.clone(), "first");
    eventually(|| fake.completions().len() == 1).await;
    // The 429 came back: the provider is paused for 30 s, for the first turn's retry and for
    // turns that had not called yet.
    eventually(|| metrics.encode().contains("sabi_llm_paused 1")).await;
    let others: Vec<_> = ["second", "third"]
        .into_iter()
        .map(|text| ask(llm.clone(), text))
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(fake.completions().len(), 1, "nobody calls while paused");
    clock.advance(Duration::from_secs(29));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(fake.completions().len(), 1, "not before the Retry-After");
    clock.advance(Duration::from_secs(1));
    let answer = first.await.expect("ran").expect("answered after the pause");
    assert!(answer.message.content.is_some());
    for other in others {
        other.await.expect("ran").expect("answered");
    }
    assert_eq!(
        fake.completions().len(),
        4,
        "the throttled call again, then two"
    );
    let text = metrics.encode();
    assert!(text.contains("sabi_llm_throttled_total 1"), "{text}");
}
