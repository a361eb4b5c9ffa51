//! Real-model bench: Sabi's agent against a real model on this CPU, one short conversation at
//! a time, as a customer meets it. `bench/real-model.sh` starts the model kit and runs this
//! once per chat template; alone, with no model named, it only says so.
//!
//! A release `sabi serve` (router off, so every message reaches the model) sends its replies to
//! a fake Graph API, and its tools call a business API of the bench's own that records who asked
//! what. For each scenario the bench posts a signed webhook (a text, or a voice note made with
//! espeak-ng) and waits for the reply or the review item. It prints each conversation, then:
//! right tool decisions, what the guard stopped and why, turn latency p50/p95, model tokens
//! per turn, and the two counts of grounding (Sabi's [`sabi::agent::grounding`] rules, held to
//! what the bench knows was said: the customer's words, the business API's answers to that
//! customer, the system prompt and the tools' descriptions): made-up figures that reached a
//! customer, and answers the guard refused as `ungrounded` whose figures were all in fact given
//! (both targets 0).
//!
//! Environment: `REAL_MODEL_URL` (the OpenAI-compatible base, `/v1`), `REAL_MODEL_NAME`,
//! `REAL_MODEL_TEMPLATE` (a label for the report), `REAL_MODEL_VOICES` (a folder holding
//! `balance.wav` and `order.wav`).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::Path;
use axum::http::{HeaderMap, StatusCode};
use secrecy::SecretString;
use serde_json::{Value, json};

use sabi::agent::grounding::Ground;
use sabi::testing::graph::FakeGraph;
use sabi::testing::webhook::signed;

#[path = "support/node.rs"]
#[allow(dead_code, reason = "each bench uses part of the shared node")]
mod support;

use support::Node;

const SECRET: &str = "real-model-bench-secret";
const GRAPH_TOKEN: &str = "real-model-bench-graph";
const ADMIN: &str = "real-model-bench-admin";
/// How long one conversation may take before it counts as unanswered.
const PATIENCE: Duration = Duration::from_secs(300);

/// One short conversation: what the customer says, and the tool a right decision calls.
struct Scenario {
    kind: &'static str,
    says: Says,
    tool: Option<&'static str>,
}

enum Says {
    Text(&'static str),
    /// A voice note: the file in `REAL_MODEL_VOICES`, and what it says.
    Voice(&'static str, &'static str),
}

impl Says {
    fn words(&self) -> &'static str {
        match self {
            Says::Text(words) | Says::Voice(_, words) => words,
        }
    }
}

const fn text(kind: &'static str, says: &'static str, tool: Option<&'static str>) -> Scenario {
    Scenario {
        kind,
        says: Says::Text(says),
        tool,
    }
}

const BALANCE: Option<&str> = Some("get_balance");
const ORDER: Option<&str> = Some("order_status");

/// Written for this bench: English and Pidgin, each kind of decision an assistant meets.
const SCENARIOS: &[Scenario] = &[
    text(
        "balance",
        "What is the balance on account 0123456789?",
        BALANCE,
    ),
    text(
        "balance",
        "Please check my balance, account number 2034567811",
        BALANCE,
    ),
    text(
        "balance",
        "How much money dey my account 3012345678?",
        BALANCE,
    ),
    text("balance", "Abeg check balance for 0098765432", BALANCE),
    text(
        "balance",
        "My account is 1122334455. What's my balance?",
        BALANCE,
    ),
    text("balance", "balance 2233445566 pls", BALANCE),
    text(
        "balance",
        "I wan know how much remain for my account 3344556677",
        BALANCE,
    ),
    text(
        "balance",
        "Good evening, kindly tell me the available balance of 4455667788",
        BALANCE,
    ),
    text("balance, no account", "What is my account balance?", None),
    text("balance, no account", "Abeg how much dey my account?", None),
    text("balance, no account", "check my balance", None),
    text("balance, no account", "I need to know my balance now", None),
    text("balance, no account", "Wetin be my balance?", None),
    text(
        "tool failure",
        "What is the balance on account 0000000000?",
        BALANCE,
    ),
    text(
        "tool failure",
        "Abeg check balance for account 0000000000",
        BALANCE,
    ),
    text("tool failure", "Balance of 0000000000 please", BALANCE),
    text(
        "no balance given",
        "What is the balance on account 1111111111?",
        BALANCE,
    ),
    text(
        "no balance given",
        "Abeg how much remain for account 1111111111?",
        BALANCE,
    ),
    text(
        "quotes an amount",
        "I sent 15,000 naira to my brother yesterday and he never received it",
        None,
    ),
    text(
        "quotes an amount",
        "Una debit me N2,500 two times for one airtime, abeg reverse am",
        None,
    ),
    text(
        "quotes an amount",
        "My transfer of 45k on 3 March failed but the money left my account",
        None,
    ),
    text("order", "Where is my card order 48213?", ORDER),
    text("order", "Has my cheque book order 77120 shipped?", ORDER),
    text("order", "Abeg wetin happen to my order 55102?", ORDER),
    text("order", "Track order 90211 for me", ORDER),
    text(
        "out of domain",
        "Which restaurant in Lekki is good for a birthday?",
        None,
    ),
    text(
        "out of domain",
        "Who will win the Premier League this year?",
        None,
    ),
    text("out of domain", "Give me a recipe for jollof rice", None),
    text(
        "out of domain",
        "Wetin be the weather for Abuja tomorrow?",
        None,
    ),
    text("out of domain", "Write me a poem about the sea", None),
    text("out of domain", "How do I fix my generator?", None),
    text("hand-off", "I want to speak to a human being", None),
    text("hand-off", "Abeg connect me to customer care person", None),
    text("hand-off", "Let me talk to an agent, not a bot", None),
    text("hand-off", "Put me through to your staff please", None),
    text("greeting", "Good morning", None),
    text("greeting", "How far, how you dey?", None),
    Scenario {
        kind: "voice: balance",
        says: Says::Voice("balance.wav", "What is the balance on account 0123456789?"),
        tool: BALANCE,
    },
    Scenario {
        kind: "voice: order",
        says: Says::Voice("order.wav", "Where is my card order 48213?"),
        tool: ORDER,
    },
];

const SYSTEM_PROMPT: &str = "You are Ada, the WhatsApp assistant of Sabi Bank in Nigeria. \
Reply in one to three short sentences, in the customer's language (English or Nigerian Pidgin). \
Use the tools to look up balances and orders. Only help with Sabi Bank matters. \
If the customer asks for a person, tell them a colleague will reply soon.";

fn main() {
    let (Ok(url), Ok(model)) = (
        std::env::var("REAL_MODEL_URL"),
        std::env::var("REAL_MODEL_NAME"),
    ) else {
        println!(
            "real-model bench: no model named (REAL_MODEL_URL, REAL_MODEL_NAME); run bench/real-model.sh"
        );
        return;
    };
    let template = std::env::var("REAL_MODEL_TEMPLATE").unwrap_or_else(|_| "as served".into());
    let voices = std::env::var("REAL_MODEL_VOICES").ok();
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(run(url, model, template, voices));
}

/// Who asked the business API for what, and what it answered: (customer header, path, answer;
/// empty when it failed).
type Calls = Arc<Mutex<Vec<(String, String, String)>>>;

/// One conversation's result.
struct Outcome {
    right: bool,
    took: Duration,
    ending: Ending,
    /// The reply's figures that nothing said gave.
    made_up: Vec<String>,
    /// Answers refused as ungrounded whose figures had all been given.
    refused_grounded: usize,
}

/// The message of the guard's log line, and the field naming the figures it refused.
const STOPPED: &str = "the guard stopped a model answer";

async fn run(url: String, model: String, template: String, voices: Option<String>) {
    let graph = FakeGraph::start(GRAPH_TOKEN).await;
    let (api, calls) = business_api().await;
    let node = Node::start(
        "all",
        &config(&api, &url, &model),
        SECRET,
        &[
            ("SABI_WHATSAPP_ACCESS_TOKEN", GRAPH_TOKEN),
            ("SABI_WHATSAPP_API_BASE", &graph.base_url()),
        ],
        // Sabi's own log, with the guard's warnings, follows the bench's lines.
        |line| line.contains("guard") || line.contains("ERROR"),
    );
    let client = reqwest::Client::new();
    println!("real-model bench: {model} ({template}), one conversation at a time");
    let mut results = Vec::new();
    for (n, scenario) in SCENARIOS.iter().enumerate() {
        let customer = format!("2348{:09}", 100_000_000 + n);
        let body = match &scenario.says {
            Says::Text(text) => text_webhook(&customer, n, text),
            Says::Voice(file, _) => {
                let Some(bytes) = voices
                    .as_ref()
                    .and_then(|d| std::fs::read(std::path::Path::new(d).join(file)).ok())
                else {
                    println!("  {:<22} skipped: no {file}", scenario.kind);
                    continue;
                };
                let media = format!("media.{n}");
                graph.add_media(&media, "audio/wav", bytes);
                voice_webhook(&customer, n, &media)
            }
        };
        let logged = node.shown().len();
        let started = Instant::now();
        post(&client, &node, body).await;
        let ending = wait_for(&client, &node, &graph, &customer).await;
        let took = started.elapsed();
        let answered: Vec<(String, String)> = lock(&calls)
            .iter()
            .filter(|(who, _, _)| *who == format!("whatsapp:{customer}"))
            .map(|(_, path, answer)| (path.clone(), answer.clone()))
            .collect();
        let asked: Vec<String> = answered.iter().map(|(path, _)| path.clone()).collect();
        // What was in fact said to the model: the truth its figures are held to.
        let mut said = Ground::default();
        for text in [
            SYSTEM_PROMPT,
            BALANCE_TOOL,
            ORDER_TOOL,
            scenario.says.words(),
        ] {
            said.add(text);
        }
        for (_, answer) in &answered {
            said.add(answer);
        }
        let made_up = match &ending {
            Ending::Replied(text) => said.ungrounded(text),
            _ => Vec::new(),
        };
        // The guard's line is written before the reply goes; give its reader a moment.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let refused_grounded = node.shown()[logged..]
            .iter()
            .filter(|line| line.contains(STOPPED) && line.contains("ungrounded"))
            .filter(|line| said.ungrounded(&refused_figures(line).join(" ")).is_empty())
            .count();
        let tools: Vec<&str> = asked
            .iter()
            .map(|p| {
                if p.starts_with("/balance") {
                    "get_balance"
                } else {
                    "order_status"
                }
            })
            .collect();
        let right = match scenario.tool {
            Some(tool) => tools.contains(&tool),
            None => tools.is_empty(),
        };
        let figures = match (made_up.is_empty(), refused_grounded) {
            (true, 0) => String::new(),
            (true, n) => format!(" [{n} grounded answer(s) REFUSED]"),
            (false, _) => format!(" [MADE UP: {}]", made_up.join(", ")),
        };
        println!(
            "  {:<22} {:>6.1} s  {:<5} tools {:<28} {}{figures}",
            scenario.kind,
            took.as_secs_f64(),
            if right { "right" } else { "WRONG" },
            format!("{asked:?}"),
            ending.shown()
        );
        results.push(Outcome {
            right,
            took,
            ending,
            made_up,
            refused_grounded,
        });
    }
    report(&client, &node, &template, &results).await;
}

/// How a conversation ended.
enum Ending {
    Replied(String),
    Review(String),
    Nothing,
}

impl Ending {
    fn shown(&self) -> String {
        // A model's text reaches this terminal: control characters are shown, not obeyed.
        let excerpt = |t: &str| {
            t.chars()
                .take(90)
                .map(|c| if c.is_control() { ' ' } else { c })
                .collect::<String>()
        };
        match self {
            Ending::Replied(text) => format!("replied: {}", excerpt(text)),
            Ending::Review(why) => format!("to a person: {}", excerpt(why)),
            Ending::Nothing => "no answer in time".into(),
        }
    }
}

async fn report(client: &reqwest::Client, node: &Node, template: &str, results: &[Outcome]) {
    let metrics = client
        .get(node.url("/metrics"))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    let counted = |prefix: &str| -> BTreeMap<String, f64> {
        metrics
            .lines()
            .filter_map(|l| l.strip_prefix(prefix))
            .filter_map(|l| {
                let (label, value) = l.split_once("} ")?;
                let label = label.split('"').nth(1)?.to_owned();
                Some((label, value.trim().parse().ok()?))
            })
            .collect()
    };
    let guard = counted("sabi_llm_guard_total{");
    let tokens = counted("sabi_llm_tokens_total{");
    let mut latencies: Vec<Duration> = results.iter().map(|o| o.took).collect();
    latencies.sort();
    let at = |q: f64| {
        latencies
            .get(((latencies.len() as f64 - 1.0) * q).round() as usize)
            .map_or(f64::NAN, Duration::as_secs_f64)
    };
    let right = results.iter().filter(|o| o.right).count();
    let replied = results
        .iter()
        .filter(|o| matches!(o.ending, Ending::Replied(_)))
        .count();
    let reviewed = results
        .iter()
        .filter(|o| matches!(o.ending, Ending::Review(_)))
        .count();
    let made_up: Vec<&str> = results
        .iter()
        .flat_map(|o| o.made_up.iter().map(String::as_str))
        .collect();
    let refused_grounded: usize = results.iter().map(|o| o.refused_grounded).sum();
    let turns = results.len().max(1) as f64;
    println!(
        "{template}: {right}/{} right tool decisions; {replied} replied, {reviewed} to a person, {} unanswered; guard stopped {:?}; made-up figures sent to customers {} {made_up:?} (target 0); grounded answers refused {refused_grounded} (target 0); turn p50 {:.1} s, p95 {:.1} s; tokens per turn: {:.0} prompt, {:.0} completion",
        results.len(),
        results.len() - replied - reviewed,
        guard,
        made_up.len(),
        at(0.5),
        at(0.95),
        tokens.get("prompt").copied().unwrap_or(0.0) / turns,
        tokens.get("completion").copied().unwrap_or(0.0) / turns,
    );
}

/// The reply the fake Graph API got for `customer`, or their review item.
async fn wait_for(
    client: &reqwest::Client,
    node: &Node,
    graph: &FakeGraph,
    customer: &str,
) -> Ending {
    let started = Instant::now();
    while started.elapsed() < PATIENCE {
        let replies: Vec<String> = graph
            .accepted()
            .iter()
            .filter(|r| r.is_message() && r.recipient() == Some(customer))
            .filter_map(|r| r.text().map(str::to_owned))
            .collect();
        if !replies.is_empty() {
            return Ending::Replied(replies.join(" / "));
        }
        let review: Value = client
            .get(node.url(&format!("/admin/review?customer={customer}")))
            .bearer_auth(ADMIN)
            .send()
            .await
            .expect("review")
            .json()
            .await
            .expect("json");
        if let Some(item) = review["items"].as_array().and_then(|i| i.first()) {
            return Ending::Review(format!(
                "{} {}",
                item["reason"].as_str().unwrap_or_default(),
                item["error"].as_str().unwrap_or_default()
            ));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ending::Nothing
}

/// The tools' descriptions, as the model reads them in their definitions.
const BALANCE_TOOL: &str =
    "The available balance of one of the customer's accounts. The 10-digit account number";
const ORDER_TOOL: &str = "Where a card or cheque-book order is. The order number";

/// The figures a guard log line names (`figures=["$0", "12 March"]`).
fn refused_figures(line: &str) -> Vec<String> {
    line.split_once("figures=[")
        .and_then(|(_, rest)| rest.split_once(']'))
        .map(|(list, _)| {
            list.split("\", \"")
                .map(|figure| figure.trim_matches('"').to_owned())
                .filter(|figure| !figure.is_empty())
                .collect()
        })
        .unwrap_or_default()
}

fn config(api: &str, url: &str, model: &str) -> String {
    format!(
        r#"[llm]
base_url = "{url}"
model = "{model}"
api_key = "none"
system_prompt = {SYSTEM_PROMPT:?}
temperature = 0.0
max_tokens = 300
timeout = "120s"
turn_timeout = "280s"
attempts = 1
max_tool_rounds = 2

[router]
enabled = false

[admin]
token = "{ADMIN}"

[[tools]]
name = "get_balance"
description = "The available balance of one of the customer's accounts"
parameters = {{ type = "object", properties = {{ account = {{ type = "string", pattern = "^[0-9]{{10}}$", description = "The 10-digit account number" }} }}, required = ["account"] }}
url = "{api}/balance/{{account}}"
timeout = "5s"

[[tools]]
name = "order_status"
description = "Where a card or cheque-book order is"
parameters = {{ type = "object", properties = {{ order_id = {{ type = "string", description = "The order number" }} }}, required = ["order_id"] }}
url = "{api}/orders/{{order_id}}"
timeout = "5s"
"#
    )
}

/// The business's API: balances (account 0000000000 is down; 1111111111 answers without one)
/// and orders.
async fn business_api() -> (String, Calls) {
    let calls: Calls = Arc::default();
    let (balance_calls, order_calls) = (calls.clone(), calls.clone());
    let who = |headers: &HeaderMap| {
        headers
            .get("x-sabi-customer")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned()
    };
    let app = axum::Router::new()
        .route(
            "/balance/{account}",
            axum::routing::get(
                move |Path(account): Path<String>, headers: HeaderMap| async move {
                    let path = format!("/balance/{account}");
                    let answer = match account.as_str() {
                        "0000000000" => {
                            lock(&balance_calls).push((who(&headers), path, String::new()));
                            return Err(StatusCode::SERVICE_UNAVAILABLE);
                        }
                        "1111111111" => json!({
                            "account": account, "status": "balance temporarily unavailable"
                        }),
                        _ => json!({
                            "account": account, "available_balance": "52,340.10", "currency": "NGN"
                        }),
                    };
                    lock(&balance_calls).push((who(&headers), path, answer.to_string()));
                    Ok(axum::Json(answer))
                },
            ),
        )
        .route(
            "/orders/{id}",
            axum::routing::get(
                move |Path(id): Path<String>, headers: HeaderMap| async move {
                    let answer = json!({"order": id, "status": "shipped", "arrives": "in 2 days"});
                    lock(&order_calls).push((
                        who(&headers),
                        format!("/orders/{id}"),
                        answer.to_string(),
                    ));
                    axum::Json(answer)
                },
            ),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (format!("http://{addr}"), calls)
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

fn now_s() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn text_webhook(customer: &str, n: usize, text: &str) -> Value {
    sabi::whatsapp::wire::text_webhook(
        "100000000000001",
        customer,
        "Bench",
        &format!("wamid.bench{n}"),
        now_s(),
        text,
    )
}

fn voice_webhook(customer: &str, n: usize, media: &str) -> Value {
    json!({"object": "whatsapp_business_account", "entry": [{"id": "1", "changes": [{
        "field": "messages", "value": {
            "messaging_product": "whatsapp",
            "metadata": {"display_phone_number": "15550000000", "phone_number_id": "100000000000001"},
            "contacts": [{"profile": {"name": "Bench"}, "wa_id": customer}],
            "messages": [{"from": customer, "id": format!("wamid.bench{n}"), "timestamp": now_s().to_string(),
                "type": "audio", "audio": {"id": media, "mime_type": "audio/wav", "voice": true}}]}}]}]})
}

async fn post(client: &reqwest::Client, node: &Node, body: Value) {
    let body = sabi::whatsapp::wire::encode(&body).into_bytes();
    let response = signed(client, &node.url("/webhook/whatsapp"), SECRET, body)
        .send()
        .await
        .expect("webhook");
    assert_eq!(response.status(), 200, "the webhook was taken");
}
