//! Words that look like broadcast requests but are messages: "Start" from a customer who never
//! opted out (what click-to-WhatsApp ads prefill) is answered; "wait" in Hausa and Yoruba and
//! Pidgin "don stop" are not opt-outs; and a bare "stop" after the assistant asked a question
//! is answered, with the opt-out offered as a choice instead of made at once.

use sabi::testing::llm::{Answer, FakeLlm};

use crate::agent::{outbox, start, turn};

const CUSTOMER: &str = "2348031234567";
const STOPPED: &str = "You will get no more offers or updates from us.";
const OFFER: &str = "If you want no more offers or updates from us, tap Stop offers.";

/// An app whose every message goes to the model (`llm`): no router.
async fn app(llm: &FakeLlm) -> crate::helpers::TestApp {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("sabi.toml"), "[router]\nenabled = false\n").expect("toml");
    start(dir, llm, &[]).await
}

async fn opted_out(app: &crate::helpers::TestApp) -> bool {
    app.store
        .opted_out(&[CUSTOMER.to_owned()])
        .await
        .expect("opt-outs")
        .contains(CUSTOMER)
}

#[tokio::test]
async fn start_resume_and_subscribe_from_a_customer_who_never_opted_out_are_answered() {
    let llm = FakeLlm::start().await;
    let app = app(&llm).await;
    llm.script((0..3).map(|_| Answer::Text("Welcome to Sabi Bank! How can we help?".into())));
    for (n, word) in ["Start", "Resume", "Subscribe"].into_iter().enumerate() {
        turn(&app, &format!("wamid.w{n}"), word).await;
        let replies = outbox(&app).await;
        assert_eq!(replies.len(), n + 1, "{word} is answered: {replies:?}");
    }
    assert!(!opted_out(&app).await);
}

#[tokio::test]
async fn wait_and_has_stopped_are_answered_not_opt_outs() {
    let llm = FakeLlm::start().await;
    let app = app(&llm).await;
    llm.script((0..3).map(|_| Answer::Text("Okay, take your time.".into())));
    for (n, word) in ["Tsaya", "Ẹ dúró", "E don stop"].into_iter().enumerate() {
        turn(&app, &format!("wamid.w{n}"), word).await;
        let replies = outbox(&app).await;
        assert_eq!(replies.len(), n + 1, "{word} is answered: {replies:?}");
        assert!(!replies[n].text.starts_with(STOPPED), "{word}: {replies:?}");
        assert!(!opted_out(&app).await, "{word} is not an opt-out");
    }
}

#[tokio::test]
async fn a_bare_stop_after_a_question_is_answered_with_the_opt_out_offered() {
    let llm = FakeLlm::start().await;
    let app = app(&llm).await;
    llm.script([
        Answer::Text("Your transfer is pending. Shall I keep retrying it?".into()),
        Answer::Text("Okay, I have stopped retrying the transfer.".into()),
    ]);
    turn(
        &app,
        "wamid.q1",
        "my transfer of 5000 naira is still pending",
    )
    .await;
    turn(&app, "wamid.q2", "Stop").await;
    let texts: Vec<String> = outbox(&app).await.into_iter().map(|e| e.text).collect();
    // One message (whatsapp.max_reply_parts): the answer first, the offer under it.
    assert_eq!(
        texts[1..],
        [format!(
            "Okay, I have stopped retrying the transfer.\n\n{OFFER}"
        )],
        "answered, then the choice: {texts:?}"
    );
    assert!(!opted_out(&app).await, "not opted out at once");

    // The customer takes the offer: now it is an opt-out, confirmed.
    turn(&app, "wamid.q3", "Stop offers").await;
    let texts: Vec<String> = outbox(&app).await.into_iter().map(|e| e.text).collect();
    assert!(texts[2].starts_with(STOPPED), "{texts:?}");
    assert!(opted_out(&app).await);
    // With no question before it, a bare "stop" opts out at once.
    turn(&app, "wamid.q4", "START").await;
    turn(&app, "wamid.q5", "stop").await;
    assert!(opted_out(&app).await);
}
