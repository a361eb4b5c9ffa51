//! The agent against a fake OpenAI-compatible server and a fake business API: the prompt and
//! history it sends, tool calls, retries and the fallback provider, voice notes, and history
//! that survives a restart.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use sabi::agent::voice::CANNOT_LISTEN;
use sabi::clock::{At, Clock};
use sabi::store::{OutboxEntry, ReviewEntry, ReviewQuery};
use sabi::testing::graph::FakeGraph;
use sabi::testing::llm::{Answer, FakeLlm};
use serde_json::{Value, json};

use crate::helpers::{TestApp, eventually_some, get_json, ms, text_webhook};

pub(crate) const PROMPT: &str = "You are Ada, the assistant of Sabi Bank.";

/// A business API with one tool endpoint; records the paths it was called on.
pub(crate) async fn order_api() -> (String, Arc<Mutex<Vec<String>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = seen.clone();
    let app = axum::Router::new().route(
        "/orders/{id}",
        axum::routing::get(move |uri: axum::http::Uri| {
            let record = record.clone();
            async move {
                record.lock().expect("lock").push(uri.to_string());
                axum::Json(json!({"order": {"status": "shipped", "eta": "tomorrow"}}))
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (format!("http://{addr}"), seen)
}

/// `sabi.toml` with the prompt, fast retries, and the order tool.
/// Model calls back off on the app's manual clock, which moves only when a test moves it: no
/// backoff, so a retried call goes at once.
pub(crate) fn write_config(dir: &tempfile::TempDir, api: &str, extra: &str) {
    let config = format!(
        "[llm]\nsystem_prompt = {PROMPT:?}\nattempts = 2\nbackoff = \"0s\"\ntimeout = \"500ms\"\n{extra}\n\
         [[tools]]\nname = \"order_status\"\ndescription = \"Where an order is\"\n\
         parameters = {{ type = \"object\", properties = {{ order_id = {{ type = \"string\" }} }}, required = [\"order_id\"] }}\n\
         url = \"{api}/orders/{{order_id}}\"\ntimeout = \"2s\"\n"
    );
    std::fs::write(dir.path().join("sabi.toml"), config).expect("write sabi.toml");
}

pub(crate) async fn start(
    dir: tempfile::TempDir,
    llm: &FakeLlm,
    extra: &[(&str, &str)],
) -> TestApp {
    let base = llm.base_url();
    let mut env = vec![
        ("SABI_LLM_BASE_URL", base.as_str()),
        ("SABI_LLM_MODEL", "fake-model"),
        ("SABI_BATCH_WINDOW", "0"),
    ];
    env.extend_from_slice(extra);
    TestApp::spawn_in(dir, None, &env).await
}

/// The customer writes; the turn runs.
pub(crate) async fn turn(app: &TestApp, id: &str, text: &str) {
    let response = app
        .post_whatsapp_webhook(text_webhook(id, "2348031234567", text))
        .await;
    assert_eq!(response.status(), 200);
    app.scheduler.drain().await.expect("turn");
}

pub(crate) async fn outbox(app: &TestApp) -> Vec<OutboxEntry> {
    app.store.outbox(None).await.expect("outbox")
}

/// The open review queue, as the desk's first page lists it.
pub(crate) async fn review(app: &TestApp) -> Vec<ReviewEntry> {
    app.store
        .review_queue(ReviewQuery::default())
        .await
        .expect("review")
}

/// An app whose model is `primary`, with `fallback` configured behind it, and `extra`
/// configuration (tables after `[llm.fallback]`).
pub(crate) async fn with_fallback(extra: &str) -> (TestApp, FakeLlm, FakeLlm) {
    let primary = FakeLlm::start().await;
    let fallback = FakeLlm::start().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let config = format!(
        "[llm.fallback]\nbase_url = \"{}\"\nmodel = \"backup-model\"\n{extra}",
        fallback.base_url()
    );
    write_config(&dir, "http://127.0.0.1:9", &config);
    let app = start(dir, &primary, &[]).await;
    (app, primary, fallback)
}

fn roles_and_texts(request: &Value) -> Vec<(String, String)> {
    request["messages"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|m| {
            (
                m["role"].as_str().unwrap_or_default().to_owned(),
                m["content"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

pub(crate) const OUT_OF_SCOPE: &str =
    "Which restaurant in Lekki would you recommend for a birthday?";

#[tokio::test]
async fn the_model_gets_prompt_history_and_tools_and_its_answer_goes_once() {
    let llm = FakeLlm::start().await;
    let (api, calls) = order_api().await;
    let dir = tempfile::tempdir().expect("tempdir");
    write_config(&dir, &api, "");
    let app = start(dir, &llm, &[]).await;

    turn(&app, "wamid.1", "good morning").await; // answered by the router
    assert!(
        llm.completions().is_empty(),
        "routine questions never reach the model"
    );

    llm.script([
        Answer::ToolCall("order_status".into(), json!({"order_id": "48213"})),
        Answer::Text("Your order ships tomorrow.".into()),
    ]);
    turn(&app, "wamid.2", OUT_OF_SCOPE).await;

    let requests = llm.completions();
    assert_eq!(requests.len(), 2);
    let first = roles_and_texts(&requests[0]);
    assert_eq!(first[0].0, "system");
    assert!(first[0].1.starts_with(PROMPT), "{:?}", first[0]);
    assert!(
        first.contains(&("user".into(), "good morning".into())),
        "{first:?}"
    );
    assert!(
        first.iter().any(|(role, _)| role == "assistant"),
        "the earlier reply: {first:?}"
    );
    assert!(
        first
            .iter()
            .any(|(role, text)| role == "system" && text.contains("intent router"))
    );
    assert_eq!(first.last().map(|(_, t)| t.as_str()), Some(OUT_OF_SCOPE));
    assert_eq!(requests[0]["model"], "fake-model");
    assert_eq!(requests[0]["tools"][0]["function"]["name"], "order_status");

    assert_eq!(
        *calls.lock().expect("lock"),
        vec!["/orders/48213".to_owned()]
    );
    let tool_message = requests[1]["messages"]
        .as_array()
        .and_then(|m| m.iter().find(|m| m["role"] == "tool").cloned())
        .expect("the tool's answer went back to the model");
    assert_eq!(tool_message["tool_call_id"], "call_1");
    assert!(
        tool_message["content"]
            .as_str()
            .unwrap_or_default()
            .contains("shipped")
    );

    let replies = outbox(&app).await;
    assert_eq!(replies.len(), 2);
    assert_eq!(replies[1].text, "Your order ships tomorrow.");
    app.scheduler.drain().await.expect("nothing more");
    assert_eq!(outbox(&app).await.len(), 2, "answered once");
}

#[tokio::test]
async fn a_failing_tool_is_an_answer_for_the_model_not_a_crash() {
    let llm = FakeLlm::start().await;
    let dir = tempfile::tempdir().expect("tempdir");
    write_config(&dir, "http://127.0.0.1:9", "");
    let app = start(dir, &llm, &[]).await;
    llm.script([
        Answer::ToolCall("order_status".into(), json!({"order_id": "1"})),
        Answer::ToolCall("no_such_tool".into(), json!({})),
        Answer::Text("Sorry, I cannot look that up now.".into()),
    ]);
    turn(&app, "wamid.1", OUT_OF_SCOPE).await;
    let requests = llm.completions();
    assert_eq!(requests.len(), 3);
    let errors: Vec<String> = requests[2]["messages"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| m["content"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert_eq!(errors.len(), 2);
    assert!(errors.iter().all(|e| e.contains("error")), "{errors:?}");
    assert_eq!(
        outbox(&app).await[0].text,
        "Sorry, I cannot look that up now."
    );
}

#[tokio::test]
async fn failures_are_retried_then_the_fallback_answers_then_review() {
    let (app, primary, fallback) = with_fallback("\n[engine]\nmax_attempts = 2\n").await;

    // A 500 and a stalled call use up the primary's two tries; the fallback answers.
    primary.script([Answer::Status(500), Answer::Stall]);
    fallback.script([Answer::Text("From the backup.".into())]);
    turn(&app, "wamid.1", OUT_OF_SCOPE).await;
    assert_eq!(primary.completions().len(), 2);
    assert_eq!(fallback.completions()[0]["model"], "backup-model");
    assert_eq!(outbox(&app).await[0].text, "From the backup.");

    // Everything down: the turn fails, is retried after its backoff, then goes to a person.
    primary.script([
        Answer::Status(503),
        Answer::Status(429),
        Answer::Status(500),
        Answer::Status(500),
    ]);
    fallback.script([
        Answer::Status(500),
        Answer::Status(502),
        Answer::Status(500),
        Answer::Status(500),
    ]);
    turn(&app, "wamid.2", "And which cinema?").await;
    app.clock.advance(Duration::from_secs(6));
    app.scheduler.drain().await.expect("retry");
    let review = review(&app).await;
    assert_eq!(review.len(), 1);
    assert_eq!(review[0].reason.as_str(), "out_of_retries");
    assert_eq!(
        outbox(&app).await.len(),
        1,
        "no reply for the failed batch, none twice"
    );
}

pub(crate) fn voice_webhook(id: &str, media_id: &str) -> Vec<u8> {
    let body = json!({"object": "whatsapp_business_account", "entry": [{"id": "1", "changes": [{
        "field": "messages", "value": {
            "messaging_product": "whatsapp",
            "metadata": {"display_phone_number": "15550000000", "phone_number_id": "100000000000001"},
            "contacts": [{"profile": {"name": "Ada"}, "wa_id": "2348031234567"}],
            "messages": [{"from": "2348031234567", "id": id, "timestamp": (crate::helpers::START_MS / 1000).to_string(),
                "type": "audio", "audio": {"id": media_id, "mime_type": "audio/ogg; codecs=opus", "voice": true}}]}}]}]});
    sabi::whatsapp::wire::encode(&body).into_bytes()
}

#[tokio::test]
async fn a_voice_note_is_downloaded_transcribed_routed_and_answered() {
    let llm = FakeLlm::start().await;
    let graph = FakeGraph::start("graph-token").await;
    let audio = b"OggS fake opus voice note".to_vec();
    graph.add_media("media.voice1", "audio/ogg; codecs=opus", audio.clone());
    llm.set_transcript("Abeg wetin be my account balance?");
    let base = graph.base_url();
    let app = start(
        tempfile::tempdir().expect("tempdir"),
        &llm,
        &[
            ("SABI_WHATSAPP_ACCESS_TOKEN", "graph-token"),
            ("SABI_WHATSAPP_API_BASE", base.as_str()),
        ],
    )
    .await;
    assert_eq!(
        app.post_whatsapp_webhook(voice_webhook("wamid.v1", "media.voice1"))
            .await
            .status(),
        200
    );
    app.scheduler.drain().await.expect("turn");
    let uploads = llm.transcriptions();
    assert_eq!(uploads.len(), 1);
    let upload = String::from_utf8_lossy(&uploads[0]);
    assert!(
        upload.contains("OggS fake opus voice note"),
        "the downloaded audio was sent"
    );
    assert!(upload.contains("whisper-1"));
    let reply = &outbox(&app).await[0].text;
    assert!(
        reply.to_lowercase().contains("balance"),
        "routed as a balance question: {reply}"
    );
    assert!(
        llm.completions().is_empty(),
        "the router answered it locally"
    );
    let stored = app.inbox().await;
    let note = stored
        .iter()
        .find(|i| i.item.dedupe_key == "wamid.v1")
        .expect("the note");
    assert_eq!(
        note.item.text.as_deref(),
        Some("Abeg wetin be my account balance?"),
        "the transcript is kept for history and people"
    );

    // A voice note that cannot be fetched gets a kind answer, not silence.
    assert_eq!(
        app.post_whatsapp_webhook(voice_webhook("wamid.v2", "media.unknown"))
            .await
            .status(),
        200
    );
    app.clock.advance(Duration::from_secs(1));
    app.scheduler.drain().await.expect("turn");
    assert_eq!(outbox(&app).await[1].text, CANNOT_LISTEN);
}

#[tokio::test]
async fn a_third_turn_sees_the_first_two_from_the_store_after_a_restart() {
    let llm = FakeLlm::start().await;
    let dir = tempfile::tempdir().expect("tempdir");
    write_config(&dir, "http://127.0.0.1:9", "");
    let mut app = start(dir, &llm, &[]).await;
    llm.script([
        Answer::Text("First answer.".into()),
        Answer::Text("Second answer.".into()),
    ]);
    turn(&app, "wamid.1", OUT_OF_SCOPE).await;
    app.clock.advance(Duration::from_secs(1));
    turn(&app, "wamid.2", "And which cinema nearby?").await;

    // A new process on the same store: nothing of the conversation is in memory.
    let dir = std::mem::replace(&mut app.dir, tempfile::tempdir().expect("tempdir"));
    let now = app.clock.now();
    drop(app);
    let app = start(dir, &llm, &[]).await;
    app.clock.advance((now + ms(1_000)).since(app.clock.now()));
    llm.script([Answer::Text("Third answer.".into())]);
    turn(&app, "wamid.3", "Thanks, and is parking free?").await;

    let third = roles_and_texts(llm.completions().last().expect("a request"));
    let said: Vec<&str> = third
        .iter()
        .filter(|(role, _)| role == "user" || role == "assistant")
        .map(|(_, text)| text.as_str())
        .collect();
    assert_eq!(
        said,
        vec![
            OUT_OF_SCOPE,
            "First answer.",
            "And which cinema nearby?",
            "Second answer.",
            "Thanks, and is parking free?"
        ]
    );
}

#[tokio::test]
async fn usage_is_stored_per_turn_and_stats_count_who_answered() {
    let llm = FakeLlm::start().await;
    let dir = tempfile::tempdir().expect("tempdir");
    write_config(
        &dir,
        "http://127.0.0.1:9",
        "prompt_price = 2.0\ncompletion_price = 10.0\n",
    );
    let app = start(dir, &llm, &[]).await;
    turn(&app, "wamid.1", "good morning").await; // the router
    app.clock.advance(Duration::from_secs(1));
    turn(&app, "wamid.2", OUT_OF_SCOPE).await; // the agent: 100 + 20 tokens
    let stats = app.store.turn_stats(At::default()).await.expect("stats");
    assert_eq!((stats.local, stats.agent, stats.people), (1, 1, 0));
    assert_eq!((stats.prompt_tokens, stats.completion_tokens), (100, 20));
    assert!((stats.cost - (100.0 * 2.0 + 20.0 * 10.0) / 1e6).abs() < 1e-12);

    let printed = crate::helpers::json_lines(app.dir.path(), &["stats", "--json"]);
    assert_eq!(printed[0]["turns"], 2);
    assert_eq!(printed[0]["agent"], 1);
    assert!(printed[0]["cost_avoided"].as_f64().unwrap_or_default() > 0.0);
}

#[tokio::test]
async fn a_web_chat_question_shows_the_agent_s_stage_while_it_works() {
    let llm = FakeLlm::start().await;
    let dir = tempfile::tempdir().expect("tempdir");
    write_config(&dir, "http://127.0.0.1:9", "");
    let app = start(dir, &llm, &[]).await;
    llm.script([Answer::Stall, Answer::Stall]);
    let posted: Value = app
        .client
        .post(app.url("/chat"))
        .json(&json!({"session_id": "s-stage-0123456789abcdef01234", "question": OUT_OF_SCOPE}))
        .send()
        .await
        .expect("posted")
        .json()
        .await
        .expect("json");
    let id = posted["job_id"].as_str().expect("job id").to_owned();
    let scheduler = app.scheduler.clone();
    let turn = tokio::spawn(async move { scheduler.drain().await });
    eventually_some(
        "the stage shown while the model works",
        ms(5000),
        || async {
            let path = format!("/chat/{id}?session_id=s-stage-0123456789abcdef01234");
            let view = get_json(&app, &path).await;
            (view["status"] == "started" && view["stage"] == "writing the answer").then_some(())
        },
    )
    .await;
    turn.await.expect("turn task").expect("drained");
}

#[tokio::test]
async fn the_models_last_line_of_choices_is_offered_as_buttons() {
    let llm = FakeLlm::start().await;
    let dir = tempfile::tempdir().expect("tempdir");
    write_config(&dir, "http://127.0.0.1:9", "");
    let app = start(dir, &llm, &[]).await;
    llm.script([Answer::Text(
        "We deliver in Lekki, or you can pick it up.\nChoices: Delivery | Pickup".into(),
    )]);
    let session = "s-choices-0123456789abcdef01234";
    let posted: Value = app
        .client
        .post(app.url("/chat"))
        .json(&json!({"session_id": session, "question": OUT_OF_SCOPE}))
        .send()
        .await
        .expect("posted")
        .json()
        .await
        .expect("json");
    app.scheduler.drain().await.expect("turn");
    let system = roles_and_texts(&llm.completions()[0])[0].1.clone();
    assert!(system.contains("Choices: first | second"), "{system}");
    let id = posted["job_id"].as_str().expect("job id");
    let view = get_json(&app, &format!("/chat/{id}?session_id={session}")).await;
    assert_eq!(
        view["answer"],
        json!({"text": "We deliver in Lekki, or you can pick it up.", "options": ["Delivery", "Pickup"]}),
        "{view}"
    );
}

/// A team's own agent: checks Sabi's signature, answers by the customer's words.
async fn external_agent(secret: &'static str) -> (String, Arc<Mutex<Vec<Value>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = seen.clone();
    let app = axum::Router::new().route(
        "/agent",
        axum::routing::post(move |headers: axum::http::HeaderMap, body: axum::body::Bytes| {
            let record = record.clone();
            async move {
                let header = |name: &str| {
                    headers
                        .get(name)
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or_default()
                        .to_owned()
                };
                let timestamp = header(sabi::agent::external::TIMESTAMP_HEADER);
                let signed_bytes = [timestamp.as_bytes(), b".", &body].concat();
                let expected = sabi::whatsapp::sign(&secret.to_owned().into(), &signed_bytes);
                let signed = Some(header(sabi::agent::external::SIGNATURE_HEADER));
                if signed.as_deref() != Some(expected.as_str()) {
                    return (axum::http::StatusCode::UNAUTHORIZED, axum::Json(json!({})));
                }
                let batch: Value = serde_json::from_slice(&body).unwrap_or_default();
                record.lock().expect("lock").push(batch.clone());
                let text = batch["messages"][0]["text"].as_str().unwrap_or_default();
                let answer = if text.contains("visa") {
                    json!({"handoff": "asked for a person", "reply": "A colleague will reply soon."})
                } else {
                    json!({"reply": format!("Our own agent says hi to: {text}"), "options": ["Yes", "No"]})
                };
                (axum::http::StatusCode::OK, axum::Json(answer))
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (format!("http://{addr}/agent"), seen)
}

#[tokio::test]
async fn an_external_agent_gets_the_signed_batch_and_its_answer_is_delivered() {
    let (url, seen) = external_agent("agent-secret").await;
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        dir.path().join("sabi.toml"),
        format!("[external_agent]\nurl = {url:?}\nsecret = \"agent-secret\"\ntimeout = \"2s\"\n"),
    )
    .expect("write sabi.toml");
    let app = TestApp::spawn_in(dir, None, &[("SABI_BATCH_WINDOW", "0")]).await;
    turn(&app, "wamid.1", OUT_OF_SCOPE).await;
    app.clock.advance(Duration::from_secs(1));
    turn(
        &app,
        "wamid.2",
        "Can you write me a letter for my visa application?",
    )
    .await;

    let batches = seen.lock().expect("lock").clone();
    assert_eq!(batches.len(), 2, "the signature checked out both times");
    assert_eq!(batches[0]["conversation"]["customer"], "2348031234567");
    assert!(batches[0]["routing"]["intent"].is_string());
    assert_eq!(batches[1]["history"][0]["text"], OUT_OF_SCOPE);
    let replies = outbox(&app).await;
    assert_eq!(
        replies[0].text,
        format!("Our own agent says hi to: {OUT_OF_SCOPE}")
    );
    assert_eq!(replies[1].text, "A colleague will reply soon.");
    let review = review(&app).await;
    assert_eq!(review[0].reason.as_str(), "handoff_asked");
}

#[tokio::test]
async fn with_redaction_no_phone_or_account_number_reaches_the_model() {
    let llm = FakeLlm::start().await;
    let dir = tempfile::tempdir().expect("tempdir");
    write_config(&dir, "http://127.0.0.1:9", "redact = true\n");
    let app = start(dir, &llm, &[]).await;
    let question = "Which restaurant in Lekki is good for a birthday? My number is 08031234567, account 0123456789";
    turn(&app, "wamid.1", question).await;
    let sent = llm.completions()[0].to_string();
    assert!(
        !sent.contains("08031234567") && !sent.contains("0123456789"),
        "{sent}"
    );
    assert!(sent.contains("[number ending 4567]"));
}

#[tokio::test]
async fn several_tool_calls_run_together_and_each_answer_names_its_call() {
    let llm = FakeLlm::start().await;
    let (api, calls) = order_api().await;
    let dir = tempfile::tempdir().expect("tempdir");
    write_config(&dir, &api, "");
    let app = start(dir, &llm, &[]).await;
    llm.script([
        Answer::ToolCalls(vec![
            ("order_status".into(), json!({"order_id": "111"})),
            ("order_status".into(), json!({"order_id": "222"})),
        ]),
        Answer::Text("Both ship tomorrow.".into()),
    ]);
    turn(&app, "wamid.1", OUT_OF_SCOPE).await;
    let mut paths = calls.lock().expect("lock").clone();
    paths.sort();
    assert_eq!(paths, ["/orders/111", "/orders/222"]);
    let second = &llm.completions()[1];
    let ids: Vec<&str> = second["messages"]
        .as_array()
        .map(|m| {
            m.iter()
                .filter(|m| m["role"] == "tool")
                .filter_map(|m| m["tool_call_id"].as_str())
                .collect()
        })
        .unwrap_or_default();
    assert_eq!(ids, ["call_1", "call_2"]);
    assert_eq!(outbox(&app).await[0].text, "Both ship tomorrow.");
}

#[tokio::test]
async fn the_last_round_offers_no_tools_and_a_slow_turn_fails_in_time() {
    let llm = FakeLlm::start().await;
    let (api, _) = order_api().await;
    let dir = tempfile::tempdir().expect("tempdir");
    write_config(&dir, &api, "max_tool_rounds = 1\nturn_timeout = \"1s\"\n");
    let app = start(dir, &llm, &[]).await;
    llm.script([
        Answer::ToolCall("order_status".into(), json!({"order_id": "1"})),
        Answer::Text("Done looking.".into()),
    ]);
    turn(&app, "wamid.1", OUT_OF_SCOPE).await;
    let requests = llm.completions();
    assert!(requests[0].get("tools").is_some());
    assert!(
        requests[1].get("tools").is_none(),
        "the model must answer now"
    );
    assert_eq!(outbox(&app).await[0].text, "Done looking.");

    // Stalled calls: the turn gives up at its limit and is retried later; nothing is sent.
    llm.script([Answer::Stall, Answer::Stall, Answer::Stall, Answer::Stall]);
    app.clock.advance(Duration::from_secs(1));
    turn(&app, "wamid.2", "And which cinema?").await;
    assert_eq!(outbox(&app).await.len(), 1);
    let stats = app.store.turn_stats(At::default()).await.expect("stats");
    assert_eq!(stats.agent, 1, "the failed turn is not counted as answered");
}

#[tokio::test]
async fn voice_notes_beside_typed_text_and_in_sandbox_mode() {
    let llm = FakeLlm::start().await;
    let dir = tempfile::tempdir().expect("tempdir");
    write_config(&dir, "http://127.0.0.1:9", "");
    // Sandbox mode: no Graph API to fetch media from, so a lone voice note gets the kind answer.
    let app = start(dir, &llm, &[]).await;
    assert_eq!(
        app.post_whatsapp_webhook(voice_webhook("wamid.v1", "media.1"))
            .await
            .status(),
        200
    );
    app.scheduler.drain().await.expect("turn");
    assert_eq!(outbox(&app).await[0].text, CANNOT_LISTEN);
    assert!(llm.completions().is_empty());
}

#[tokio::test]
async fn an_unheard_voice_note_beside_typed_text_does_not_silence_the_text() {
    let llm = FakeLlm::start().await;
    let graph = FakeGraph::start("graph-token").await;
    let base = graph.base_url();
    let app = start(
        tempfile::tempdir().expect("tempdir"),
        &llm,
        &[
            ("SABI_WHATSAPP_ACCESS_TOKEN", "graph-token"),
            ("SABI_WHATSAPP_API_BASE", base.as_str()),
        ],
    )
    .await;
    let typed = text_webhook("wamid.t1", "2348031234567", OUT_OF_SCOPE);
    assert_eq!(app.post_whatsapp_webhook(typed).await.status(), 200);
    let voice = voice_webhook("wamid.v1", "media.missing");
    assert_eq!(app.post_whatsapp_webhook(voice).await.status(), 200);
    app.scheduler.drain().await.expect("one turn for both");
    let asked = roles_and_texts(&llm.completions()[0]);
    let said = &asked.last().expect("the batch").1;
    assert!(
        said.contains(OUT_OF_SCOPE) && said.contains("could not be transcribed"),
        "{said}"
    );
    assert!(outbox(&app).await[0].text.starts_with("fake answer"));
}

/// A customer answering a broadcast: the model sees the broadcast, as the customer read it,
/// before their message.
#[tokio::test]
async fn a_reply_to_a_broadcast_reaches_the_model_with_the_broadcast_before_it() {
    use sabi::store::{Limits, NewBroadcast, NewRecipient, Outcome, RecipientClaim};
    let llm = FakeLlm::start().await;
    let dir = tempfile::tempdir().expect("tempdir");
    write_config(&dir, "http://127.0.0.1:9", "");
    let app = start(dir, &llm, &[]).await;
    let hour_ago = app.clock.now() - Duration::from_secs(3_600);
    app.store
        .create_broadcast(NewBroadcast {
            key: None,
            name: "Diwali eve".into(),
            template: "diwali_offer".into(),
            language: "en".into(),
            business: "100000000000001".into(),
            now: hour_ago,
            start_at: hour_ago,
            until: None,
            rate: 20,
            body: Some("Happy Diwali, {{1}}! {{2}} off tonight.".into()),
            hours: None,
            recipients: vec![NewRecipient {
                to: "2348031234567".into(),
                params: vec!["Ada".into(), "20%".into()],
                line: None,
                skipped: None,
                tz: None,
            }],
        })
        .await
        .expect("kept");
    let claim = RecipientClaim {
        now: hour_ago,
        lease: Duration::from_secs(60),
        limit: 10,
        halted: Vec::new(),
        cooldown: Duration::ZERO,
        daily_limit: None,
    };
    let job = app
        .store
        .claim_recipients(claim)
        .await
        .expect("claimed")
        .remove(0);
    let sent = Outcome::Accepted {
        wamid: "wamid.diwali".into(),
    };
    app.store
        .record_recipient(job.id, job.attempt, hour_ago, sent, Limits::NONE)
        .await
        .expect("recorded");

    llm.script([Answer::Text("It covers the whole shop.".into())]);
    turn(&app, "wamid.1", OUT_OF_SCOPE).await;
    let request = roles_and_texts(llm.completions().last().expect("a request"));
    let said: Vec<(&str, &str)> = request
        .iter()
        .filter(|(role, _)| role != "system")
        .map(|(role, text)| (role.as_str(), text.as_str()))
        .collect();
    assert_eq!(
        said,
        [
            ("assistant", "Happy Diwali, Ada! 20% off tonight."),
            ("user", OUT_OF_SCOPE)
        ]
    );
}

/// A business API whose answers are `size` bytes of JSON; records the paths it was called on.
async fn big_api(size: usize) -> (String, Arc<Mutex<Vec<String>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = seen.clone();
    let app = axum::Router::new().route(
        "/orders/{id}",
        axum::routing::get(move |uri: axum::http::Uri| {
            let record = record.clone();
            async move {
                record.lock().expect("lock").push(uri.to_string());
                axum::Json(json!({"order": {"notes": "ab".repeat(size / 2)}}))
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (format!("http://{addr}"), seen)
}

/// The tool messages of a completion request.
fn tool_messages(request: &Value) -> Vec<Value> {
    request["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|m| m["role"] == "tool")
        .cloned()
        .collect()
}

/// One question asking for 40 tool calls in a round: 8 run (`llm.max_tool_calls`), the model
/// reads an error for each of the others, and each answer it reads is cut at 32 KiB.
#[tokio::test]
async fn a_round_runs_at_most_eight_tool_calls_and_reads_answers_cut_to_32_kib() {
    let llm = FakeLlm::start().await;
    let (api, calls) = big_api(200_000).await;
    let dir = tempfile::tempdir().expect("tempdir");
    write_config(&dir, &api, "");
    let app = start(dir, &llm, &[]).await;
    let fan_out = (0..40)
        .map(|n| {
            (
                "order_status".to_owned(),
                json!({"order_id": format!("{n}")}),
            )
        })
        .collect();
    llm.script([
        Answer::ToolCalls(fan_out),
        Answer::Text("Your orders are on their way.".into()),
    ]);
    turn(&app, "wamid.fan", OUT_OF_SCOPE).await;
    assert_eq!(
        calls.lock().expect("lock").len(),
        8,
        "8 requests reached the API"
    );
    let requests = llm.completions();
    assert_eq!(requests.len(), 2);
    let answers = tool_messages(&requests[1]);
    assert_eq!(answers.len(), 40, "every call is answered");
    for answer in &answers[..8] {
        let text = answer["content"].as_str().expect("text");
        assert!(text.len() <= 32 * 1024, "cut: {}", text.len());
        assert!(text.len() > 30 * 1024, "not emptied: {}", text.len());
    }
    for answer in &answers[8..] {
        let text = answer["content"].as_str().expect("text");
        assert!(text.contains("not run") && text.contains('8'), "{text}");
    }
    assert_eq!(outbox(&app).await[0].text, "Your orders are on their way.");
}

/// A turn whose prompt would pass `llm.turn_prompt_tokens` is not sent: it goes to a person.
#[tokio::test]
async fn a_turn_that_would_pass_its_prompt_budget_goes_to_a_person() {
    let llm = FakeLlm::start().await;
    let (api, _calls) = big_api(30_000).await;
    let dir = tempfile::tempdir().expect("tempdir");
    write_config(&dir, &api, "turn_prompt_tokens = 10000\n");
    let app = start(dir, &llm, &[]).await;
    let lookups = (0..4)
        .map(|n| {
            (
                "order_status".to_owned(),
                json!({"order_id": format!("{n}")}),
            )
        })
        .collect();
    llm.script([
        Answer::ToolCalls(lookups),
        Answer::Text("Your orders are on their way.".into()),
    ]);
    turn(&app, "wamid.budget", OUT_OF_SCOPE).await;
    assert_eq!(
        llm.completions().len(),
        1,
        "120 KB of answers were never sent"
    );
    assert!(outbox(&app).await.is_empty());
    let items = review(&app).await;
    assert_eq!(items.len(), 1);
    assert!(
        items[0]
            .error
            .as_deref()
            .unwrap_or_default()
            .contains("prompt budget"),
        "{:?}",
        items[0].error
    );
}

/// A string argument whose schema sets no `maxLength` gets `llm.max_argument_chars` (1,000):
/// the model is offered the bound, and a longer argument (or 200 KB of them, past the 16 KiB
/// any call's arguments may have) never leaves.
#[tokio::test]
async fn string_arguments_are_bounded_by_default() {
    let llm = FakeLlm::start().await;
    let (api, calls) = order_api().await;
    let dir = tempfile::tempdir().expect("tempdir");
    write_config(&dir, &api, "");
    let app = start(dir, &llm, &[]).await;
    llm.script([
        Answer::ToolCall("order_status".into(), json!({"order_id": "9".repeat(1001)})),
        Answer::ToolCall(
            "order_status".into(),
            json!({"order_id": "9".repeat(200_000)}),
        ),
        Answer::Text("Please send your order number again.".into()),
    ]);
    turn(&app, "wamid.long", OUT_OF_SCOPE).await;
    assert!(
        calls.lock().expect("lock").is_empty(),
        "nothing reached the API"
    );
    let requests = llm.completions();
    assert_eq!(requests.len(), 3);
    let offered = &requests[0]["tools"][0]["function"]["parameters"]["properties"]["order_id"];
    assert_eq!(offered["maxLength"], 1000);
    for (n, request) in requests[1..].iter().enumerate() {
        let error = tool_messages(request)[n]["content"]
            .as_str()
            .expect("text")
            .to_owned();
        assert!(error.contains("error"), "{error}");
        assert!(error.len() < 2000, "the argument is not read back whole");
    }
}
