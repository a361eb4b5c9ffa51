//! The guard between the model and the customer, against a fake model server that answers in
//! each of the shapes real models write: nothing unfit is sent, a tool call written as text is
//! run once, and unfit answers go to a corrective retry, the fallback provider and a person, in
//! that order.

use sabi::testing::graph::FakeGraph;
use sabi::testing::llm::{Answer, FakeLlm};
use serde_json::{Value, json};

use crate::agent::{
    OUT_OF_SCOPE, order_api, outbox, review, start, turn, voice_webhook, with_fallback,
    write_config,
};

/// The messages of a completion request, as (role, content).
fn said(request: &Value) -> Vec<(String, String)> {
    request["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|m| {
            (
                m["role"].as_str().unwrap_or_default().to_owned(),
                m["content"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

#[tokio::test]
async fn every_kind_of_unfit_answer_is_stopped_and_the_customer_gets_a_real_one() {
    let llm = FakeLlm::start().await;
    let dir = tempfile::tempdir().expect("tempdir");
    write_config(&dir, "http://127.0.0.1:9", "");
    let app = start(dir, &llm, &[]).await;
    let unfit = [
        (Answer::Text(String::new()), "empty"),
        (Answer::Text(" \n ".into()), "empty"),
        (Answer::Text("<tools></tools>".into()), "markup"),
        (
            Answer::Text("Sure!<|im_end|>\n<|im_start|>user".into()),
            "markup",
        ),
        (Answer::Text("{\"reply\": \"hello\"}".into()), "json"),
        (
            Answer::Text("```json\n{\"name\": \"transfer\", \"arguments\": {}}\n```".into()),
            "json",
        ),
        (
            Answer::CutOff("Your balance as of today is".into()),
            "cut_off",
        ),
        (Answer::Text("blah ".repeat(1_000)), "too_long"),
        (
            Answer::Text("To know, please call order_status.".into()),
            "tool_name",
        ),
    ];
    let mut sent = 0;
    for (n, (answer, check)) in unfit.into_iter().enumerate() {
        let before = llm.completions().len();
        let real = format!("A real answer, number {n}.");
        llm.script([answer, Answer::Text(real.clone())]);
        turn(&app, &format!("wamid.unfit{n}"), OUT_OF_SCOPE).await;
        sent += 1;
        let replies = outbox(&app).await;
        assert_eq!(replies.len(), sent, "{check}: one reply, the real one");
        assert_eq!(replies[sent - 1].text, real, "{check}");
        let requests = llm.completions();
        assert_eq!(requests.len(), before + 2, "{check}: asked once more");
        let again = said(&requests[before + 1]);
        let correction = &again.last().expect("messages").1;
        assert!(correction.starts_with("[Sabi]"), "{check}: {correction}");
        assert_eq!(
            again[again.len() - 2].0,
            "assistant",
            "roles still alternate"
        );
    }
    let metrics = app
        .client
        .get(app.url("/metrics"))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    for (check, n) in [
        ("empty", 2),
        ("markup", 2),
        ("json", 2),
        ("cut_off", 1),
        ("too_long", 1),
        ("tool_name", 1),
    ] {
        assert!(
            metrics.contains(&format!("sabi_llm_guard_total{{outcome=\"{check}\"}} {n}")),
            "{check} counted {n} times:\n{metrics}"
        );
    }
}

#[tokio::test]
async fn a_tool_call_written_as_text_is_run_once_in_each_common_form() {
    let llm = FakeLlm::start().await;
    let (api, calls) = order_api().await;
    let dir = tempfile::tempdir().expect("tempdir");
    write_config(&dir, &api, "");
    let app = start(dir, &llm, &[]).await;
    let forms = [
        "```json\n{\"name\": \"order_status\", \"arguments\": {\"order_id\": \"1001\"}}\n```",
        "<tool_call>\n{\"name\": \"order_status\", \"arguments\": {\"order_id\": \"1002\"}}\n</tool_call>",
        "{\"name\": \"order_status\", \"parameters\": {\"order_id\": \"1003\"}}",
    ];
    for (n, form) in forms.into_iter().enumerate() {
        let before = llm.completions().len();
        llm.script([
            Answer::Text(form.into()),
            Answer::Text(format!("Order {} ships tomorrow.", 1001 + n)),
        ]);
        turn(&app, &format!("wamid.form{n}"), OUT_OF_SCOPE).await;
        let requests = llm.completions();
        assert_eq!(requests.len(), before + 2, "{form}");
        let messages = requests[before + 1]["messages"]
            .as_array()
            .expect("messages");
        let call = messages
            .iter()
            .find(|m| m["role"] == "assistant" && !m["tool_calls"].is_null())
            .expect("the call went back as a tool call");
        assert_eq!(call["content"], Value::Null, "not its text");
        let answer = messages
            .iter()
            .find(|m| m["role"] == "tool")
            .expect("its answer");
        assert_eq!(answer["tool_call_id"], call["tool_calls"][0]["id"]);
        assert!(
            answer["content"]
                .as_str()
                .unwrap_or_default()
                .contains("shipped")
        );
        assert_eq!(
            outbox(&app).await[n].text,
            format!("Order {} ships tomorrow.", 1001 + n)
        );
    }
    assert_eq!(
        *calls.lock().expect("lock"),
        vec!["/orders/1001", "/orders/1002", "/orders/1003"],
        "each run once"
    );
}

#[tokio::test]
async fn unfit_answers_go_to_a_retry_then_the_fallback_then_a_person() {
    let (app, primary, fallback) = with_fallback("").await;

    primary.script([
        Answer::Text("<tools></tools>".into()),
        Answer::Text("<tools></tools>".into()),
    ]);
    fallback.script([Answer::Text("From the backup.".into())]);
    turn(&app, "wamid.1", OUT_OF_SCOPE).await;
    assert_eq!(
        primary.completions().len(),
        2,
        "the primary, then its one retry"
    );
    let asked = said(&fallback.completions()[0]);
    assert!(asked.last().expect("messages").1.starts_with("[Sabi]"));
    assert_eq!(outbox(&app).await[0].text, "From the backup.");

    primary.script([Answer::Text(String::new()), Answer::Text("{}".into())]);
    fallback.script([Answer::CutOff("Dear customer, about".into())]);
    turn(&app, "wamid.2", "And which cinema?").await;
    assert_eq!(outbox(&app).await.len(), 1, "nothing unfit was sent");
    let review = review(&app).await;
    assert_eq!(review.len(), 1);
    assert_eq!(review[0].reason.as_str(), "model_output");
    let note = review[0].error.as_deref().unwrap_or_default();
    assert!(note.contains("empty, json, cut_off"), "{note}");
    assert_eq!(primary.completions().len(), 4, "not retried as a failure");
}

#[tokio::test]
async fn without_a_fallback_a_second_unfit_answer_goes_to_a_person() {
    let llm = FakeLlm::start().await;
    let dir = tempfile::tempdir().expect("tempdir");
    write_config(&dir, "http://127.0.0.1:9", "");
    let app = start(dir, &llm, &[]).await;
    llm.script([
        Answer::Text("<|im_start|>".into()),
        Answer::Text("<|im_start|>".into()),
    ]);
    turn(&app, "wamid.1", OUT_OF_SCOPE).await;
    assert!(outbox(&app).await.is_empty());
    let review = review(&app).await;
    assert_eq!(review[0].reason.as_str(), "model_output");
}

#[tokio::test]
async fn sampling_settings_and_transcription_options_reach_the_requests() {
    let llm = FakeLlm::start().await;
    let graph = FakeGraph::start("graph-token").await;
    graph.add_media("media.v", "audio/ogg; codecs=opus", b"OggS note".to_vec());
    llm.set_transcript("Which restaurant would you recommend?");
    let dir = tempfile::tempdir().expect("tempdir");
    write_config(
        &dir,
        "http://127.0.0.1:9",
        "temperature = 0.0\ntop_p = 0.9\nmax_tokens = 256\nseed = 7\n\
         transcribe_language = \"en\"\ntranscribe_prompt = \"Sabi Bank, abeg, wetin\"\n\
         extra = { repeat_penalty = 1.1, cache_prompt = true }\n",
    );
    let base = graph.base_url();
    let app = start(
        dir,
        &llm,
        &[
            ("SABI_WHATSAPP_ACCESS_TOKEN", "graph-token"),
            ("SABI_WHATSAPP_API_BASE", base.as_str()),
        ],
    )
    .await;
    assert_eq!(
        app.post_whatsapp_webhook(voice_webhook("wamid.v", "media.v"))
            .await
            .status(),
        200
    );
    app.scheduler.drain().await.expect("turn");
    let upload = String::from_utf8_lossy(&llm.transcriptions()[0]).into_owned();
    for (field, value) in [("language", "en"), ("prompt", "Sabi Bank, abeg, wetin")] {
        assert!(
            upload.contains(&format!("name=\"{field}\"\r\n\r\n{value}\r\n")),
            "{field}: {upload}"
        );
    }
    let request = &llm.completions()[0];
    assert_eq!(request["temperature"], json!(0.0));
    assert_eq!(request["top_p"], json!(0.9));
    assert_eq!(request["max_tokens"], json!(256));
    assert_eq!(request["seed"], json!(7));
    assert_eq!(request["repeat_penalty"], json!(1.1));
    assert_eq!(request["cache_prompt"], json!(true));
}
