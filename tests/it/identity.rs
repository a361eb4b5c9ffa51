//! Tools act for the person a turn answers, never for whoever the model or a message names: the
//! `customer` argument comes from the verified identity, arguments are checked against the
//! tool's schema and cut to what it declares, anonymous web visitors get only public tools, a
//! signed-in visitor is vouched for by their site, and every request says (and signs) who it
//! acts for.

use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::http::{HeaderMap, Method, Uri};
use sabi::testing::llm::{Answer, FakeLlm};
use secrecy::SecretString;
use serde_json::{Value, json};

use crate::helpers::{TestApp, text_webhook};

const TOOLS_SECRET: &str = "tools-secret-for-tests";
const IDENTITY_SECRET: &str = "identity-secret-for-tests";
const CUSTOMER: &str = "2348031234567";

/// What the business API saw of one request.
#[derive(Debug, Clone)]
struct Seen {
    method: String,
    target: String,
    customer: String,
    request_id: String,
    signed: bool,
    /// The same request with `X-Sabi-Customer` swapped for another customer's would verify.
    replayable_as_another: bool,
    body: Value,
}

/// A business API that records every request, and checks its signature as the README shows.
async fn business_api() -> (String, Arc<Mutex<Vec<Seen>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = seen.clone();
    let app = axum::Router::new().fallback(
        move |method: Method, uri: Uri, headers: HeaderMap, body: Bytes| {
            let record = record.clone();
            async move {
                let header = |name: &str| {
                    headers
                        .get(name)
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or_default()
                        .to_owned()
                };
                let target = uri
                    .path_and_query()
                    .map(ToString::to_string)
                    .unwrap_or_default();
                let body_text = String::from_utf8_lossy(&body).into_owned();
                // As the README's snippet checks it.
                let expected = |customer: &str| {
                    let message = format!(
                        "{}\n{}\n{method}\n{target}\n{customer}\n{body_text}",
                        header("x-sabi-timestamp"),
                        header("x-sabi-request-id"),
                    );
                    sabi::whatsapp::sign(
                        &SecretString::from(TOOLS_SECRET.to_owned()),
                        message.as_bytes(),
                    )
                };
                let signature = header("x-sabi-signature-256");
                let customer = header("x-sabi-customer");
                let signed = signature == expected(&customer);
                let replayable_as_another = signature == expected("whatsapp:2348000000000");
                record.lock().expect("lock").push(Seen {
                    method: method.to_string(),
                    target,
                    request_id: header("x-sabi-request-id"),
                    signed,
                    replayable_as_another,
                    customer,
                    body: serde_json::from_str(&body_text).unwrap_or(Value::Null),
                });
                axum::Json(json!({"ok": true, "balance": "N5,000"}))
            }
        },
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

async fn start(llm: &FakeLlm, api: &str) -> TestApp {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = format!(
        "[llm]\nattempts = 1\ntimeout = \"2s\"\n\n\
         [[tools]]\nname = \"orders\"\ndescription = \"The customer's orders\"\n\
         url = \"{api}/orders?customer={{customer}}\"\n\n\
         [[tools]]\nname = \"note\"\ndescription = \"Leave a note\"\nmethod = \"POST\"\n\
         url = \"{api}/notes\"\n\
         parameters = {{ type = \"object\", additionalProperties = false, required = [\"note\"], \
           properties = {{ customer = {{ type = \"string\" }}, note = {{ type = \"string\", maxLength = 20 }}, \
           kind = {{ enum = [\"praise\", \"complaint\"] }} }} }}\n\n\
         [[tools]]\nname = \"hours\"\ndescription = \"Opening hours\"\npublic = true\n\
         url = \"{api}/hours\"\n"
    );
    std::fs::write(dir.path().join("sabi.toml"), config).expect("sabi.toml");
    let base = llm.base_url();
    TestApp::spawn_in(
        dir,
        None,
        &[
            ("SABI_LLM_BASE_URL", base.as_str()),
            ("SABI_LLM_MODEL", "fake-model"),
            ("SABI_BATCH_WINDOW", "0"),
            ("SABI_TOOLS_SECRET", TOOLS_SECRET),
            ("SABI_WEBCHAT_IDENTITY_SECRET", IDENTITY_SECRET),
        ],
    )
    .await
}

/// What the tools answered the model, in order.
fn tool_answers(llm: &FakeLlm) -> Vec<String> {
    let requests = llm.completions();
    let last = requests.last().cloned().unwrap_or_default();
    last["messages"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .filter(|m| m["role"] == "tool")
        .filter_map(|m| m["content"].as_str().map(str::to_owned))
        .collect()
}

/// The names (and parameters) of the tools the model was offered first.
fn offered(llm: &FakeLlm) -> Vec<(String, Value)> {
    llm.completions()[0]["tools"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|t| {
            (
                t["function"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                t["function"]["parameters"].clone(),
            )
        })
        .collect()
}

const QUESTION: &str = "Which restaurant in Lekki would you recommend for a birthday?";

#[tokio::test]
async fn a_whatsapp_customer_s_tools_act_for_that_customer_whatever_the_model_says() {
    let llm = FakeLlm::start().await;
    let (api, seen) = business_api().await;
    let app = start(&llm, &api).await;
    llm.script([
        Answer::ToolCall("orders".into(), json!({"customer": "2348099999999"})),
        Answer::ToolCall(
            "note".into(),
            json!({"note": "hello", "to": "2348099999999", "customer": "2348099999999"}),
        ),
        Answer::ToolCall("note".into(), json!({"note": "this note is far too long"})),
        Answer::ToolCall("note".into(), json!({"note": "hello", "kind": "praise"})),
        Answer::Text("Done.".into()),
    ]);
    let response = app
        .post_whatsapp_webhook(text_webhook("wamid.i1", CUSTOMER, QUESTION))
        .await;
    assert_eq!(response.status(), 200);
    app.scheduler.drain().await.expect("turn");

    let offered = offered(&llm);
    let names: Vec<&str> = offered.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["orders", "note", "hours"]);
    let note = &offered[1].1;
    assert!(note["properties"].get("customer").is_none(), "{note}");

    let seen = seen.lock().expect("lock").clone();
    assert_eq!(seen.len(), 2, "two calls passed their checks: {seen:?}");
    assert_eq!(seen[0].method, "GET");
    assert_eq!(seen[0].target, format!("/orders?customer={CUSTOMER}"));
    assert_eq!(seen[0].customer, format!("whatsapp:{CUSTOMER}"));
    assert!(seen[0].signed, "signed as documented");
    assert_eq!(seen[1].method, "POST");
    assert_eq!(
        seen[1].body,
        json!({"note": "hello", "kind": "praise", "customer": CUSTOMER})
    );
    assert!(seen[1].signed);
    // The signature covers who the request acts for and its id: a captured request replayed
    // as another customer fails, and each request's id is new, for the API to refuse repeats.
    assert!(seen.iter().all(|s| !s.replayable_as_another), "{seen:?}");
    assert_eq!(seen[0].request_id.len(), 32, "{seen:?}");
    assert_ne!(seen[0].request_id, seen[1].request_id);

    let answers = tool_answers(&llm);
    assert!(answers[1].contains("to"), "names the field: {}", answers[1]);
    assert!(
        answers[2].contains("note"),
        "names the field: {}",
        answers[2]
    );
}

#[tokio::test]
async fn an_anonymous_visitor_gets_public_tools_only_and_nothing_that_acts_for_a_customer() {
    let llm = FakeLlm::start().await;
    let (api, seen) = business_api().await;
    let app = start(&llm, &api).await;
    llm.script([
        Answer::ToolCall("orders".into(), json!({"customer": CUSTOMER})),
        Answer::ToolCall("hours".into(), json!({})),
        Answer::Text("We open at nine.".into()),
    ]);
    let asked = app
        .client
        .post(app.url("/chat"))
        .json(&json!({"session_id": "anon-session-1-0123456789abcdef01234", "question": QUESTION}))
        .send()
        .await
        .expect("posted");
    assert_eq!(asked.status(), 202);
    app.scheduler.drain().await.expect("turn");

    let names: Vec<String> = offered(&llm).into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["hours"]);
    let seen = seen.lock().expect("lock").clone();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0].target, "/hours");
    assert_eq!(seen[0].customer, "anonymous");
    assert!(tool_answers(&llm)[0].contains("no tool named"));
}

#[tokio::test]
async fn a_signed_in_visitor_is_vouched_for_by_the_site_and_a_wrong_hash_is_refused() {
    let llm = FakeLlm::start().await;
    let (api, seen) = business_api().await;
    let app = start(&llm, &api).await;
    let hash = sabi::whatsapp::sign(&SecretString::from(IDENTITY_SECRET.to_owned()), b"user-42");
    let hash = hash.trim_start_matches("sha256=");

    let wrong = app
        .client
        .post(app.url("/chat"))
        .json(
            &json!({"session_id": "s-web-1-0123456789abcdef01234", "question": QUESTION,
                      "user_id": "user-43", "user_hash": hash}),
        )
        .send()
        .await
        .expect("posted");
    assert_eq!(wrong.status(), 401);
    let body: Value = wrong.json().await.expect("json");
    assert_eq!(body["code"], "bad_identity");

    llm.script([
        Answer::ToolCall("orders".into(), json!({"customer": "user-1"})),
        Answer::Text("Your order is on its way.".into()),
    ]);
    let right = app
        .client
        .post(app.url("/chat"))
        .json(
            &json!({"session_id": "s-web-1-0123456789abcdef01234", "question": QUESTION,
                      "user_id": "user-42", "user_hash": hash}),
        )
        .send()
        .await
        .expect("posted");
    assert_eq!(right.status(), 202);
    app.scheduler.drain().await.expect("turn");
    let seen = seen.lock().expect("lock").clone();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0].target, "/orders?customer=user-42");
    assert_eq!(seen[0].customer, "web:user-42");
}
