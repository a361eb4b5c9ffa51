//! A surge: what the engine does when everybody writes at once (the broadcast's replies). The
//! model provider's budget is shared by every turn: a 429 pauses them together.

use std::sync::Arc;
use std::time::Duration;

use sabi::agent::budget::Limits;
use sabi::agent::llm::{ChatMessage, Llm, LlmContext, Provider, Providers, Retries, Sampling};
use sabi::clock::{At, ManualClock};
use sabi::metrics::Metrics;
use sabi::testing::llm::{Answer, FakeLlm};

use sabi::store::ReviewQuery;

use crate::helpers::{
    START_MS, SabiProcess, TestApp, eventually, json_lines, post_webhook, sabi_command,
    text_webhook_at,
};

/// A provider served by `fake`, with room for four calls at once.
fn provider(fake: &FakeLlm, model: &str) -> (Provider, Limits) {
    let provider = Provider {
        base_url: fake.base_url(),
        api_key: None,
        model: model.into(),
    };
    let limits = Limits {
        concurrent: 4,
        requests_per_minute: None,
        tokens_per_minute: None,
    };
    (provider, limits)
}

fn context(clock: Arc<ManualClock>, metrics: Arc<Metrics>, retries: Retries) -> LlmContext {
    LlmContext {
        timeout: Duration::from_secs(10),
        retries,
        sampling: Sampling::default(),
        clock,
        metrics,
    }
}

fn client(fake: &FakeLlm, clock: Arc<ManualClock>, metrics: Arc<Metrics>) -> Arc<Llm> {
    let retries = Retries {
        attempts: 3,
        backoff: Duration::from_secs(1),
    };
    let context = context(clock, metrics, retries);
    Arc::new(Llm::new(provider(fake, "fake-model"), None, context).expect("client"))
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
            llm.complete(&messages, &[], Providers::All, &llm.waits())
                .await
        })
    };
    let first = ask(llm.clone(), "first");
    eventually("the first call", || async { fake.completions().len() == 1 }).await;
    // The 429 came back: the provider is paused for 30 s, for the first turn's retry and for
    // turns that had not called yet.
    eventually("the provider paused", || async {
        metrics.encode().contains("sabi_llm_paused 1")
    })
    .await;
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

/// `sabi plan` for Diwali eve: a row per number of turns at once with what customers would see,
/// and a recommendation that keeps the 95th percentile wait within the holding threshold.
#[test]
fn sabi_plan_sizes_the_surge_and_says_what_customers_see() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Everybody in one send: a business whose messaging limit is unlimited.
    let plan = json_lines(
        dir.path(),
        &[
            "plan",
            "--audience",
            "18000",
            "--messaging-limit",
            "unlimited",
            "--json",
        ],
    );
    let plan = &plan[0];
    let rows = plan["rows"].as_array().expect("rows");
    let recommended = &plan["recommended"];
    let slots: Vec<u64> = rows.iter().filter_map(|r| r["slots"].as_u64()).collect();
    let best = recommended["slots"].as_u64().expect("slots");
    assert_eq!(
        slots,
        [5, best, best * 2],
        "the seed's 5, the recommendation, twice it"
    );
    for field in [
        "peak_arrivals_per_s",
        "utilisation",
        "p50_wait_s",
        "p95_wait_s",
        "max_wait_s",
        "max_queue",
        "holding_messages",
        "review_spill",
        "model_calls",
        "peak_model_calls_per_min",
        "peak_tokens_per_min",
    ] {
        assert!(rows[0][field].is_number(), "{field}: {}", rows[0]);
    }
    assert!(rows[0]["p95_wait_s"].as_f64() > rows[1]["p95_wait_s"].as_f64());
    assert!(rows[1]["p95_wait_s"].as_f64().expect("p95") <= 60.0);
    assert!(rows[0]["holding_messages"].as_u64() > Some(0));
    assert_eq!(recommended["meets_target"], true);

    // A measured curve: everyone who replies does so in the first minute.
    let curve = dir.path().join("curve.json");
    std::fs::write(&curve, "[100, 0, 0]").expect("written");
    let fast = json_lines(
        dir.path(),
        &[
            "plan",
            "--audience",
            "18000",
            "--messaging-limit",
            "unlimited",
            "--reply-curve",
            curve.to_str().expect("utf-8"),
            "--slots",
            "5",
            "--json",
        ],
    );
    assert!(
        fast[0]["rows"][0]["max_queue"].as_u64() > rows[0]["max_queue"].as_u64(),
        "replies at once queue more"
    );

    let bad = sabi_command(dir.path())
        .args(["plan", "--audience", "100", "--llm-latency", "5"])
        .output()
        .expect("sabi runs");
    assert!(!bad.status.success());
    let said = String::from_utf8_lossy(&bad.stderr);
    assert!(said.contains("--llm-latency"), "{said}");
}

/// `sabi plan` as an owner reads it: at Meta's default messaging limit 18,000 customers take
/// 72 days, a surge a day; sends the number cannot take are capped beside the replies; Meta's
/// fees and the model's in the configured currency; what the model provider must allow, and a
/// warning when its configured limit is below it; bad inputs named.
#[test]
fn sabi_plan_tells_the_days_the_pace_the_costs_and_the_providers_limits() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("sabi.toml");
    std::fs::write(
        &config,
        "[llm]\nprompt_price = 150\ncompletion_price = 600\nrequests_per_minute = 20\n\
         [broadcast]\ncurrency = \"NGN\"\nprices = { \"234\" = 38.5 }\n",
    )
    .expect("written");
    let plan = |args: &[&str]| {
        sabi_command(dir.path())
            .env("SABI_CONFIG", &config)
            .arg("plan")
            .args(args)
            .output()
            .expect("sabi runs")
    };
    let json = |args: &[&str]| {
        let out = plan(args);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice::<serde_json::Value>(&out.stdout).expect("JSON")
    };
    let codes = |made: &serde_json::Value| -> Vec<String> {
        made["warnings"]
            .as_array()
            .expect("warnings")
            .iter()
            .filter_map(|w| w["code"].as_str().map(str::to_owned))
            .collect()
    };

    let limited = json(&["--audience", "18000", "--json"]);
    let sends = &limited["sends"];
    assert_eq!(
        (sends["per_day"].as_u64(), sends["days"].as_u64()),
        (Some(250), Some(72))
    );
    assert!(
        sends["last_send_s"].as_f64() > Some(71.0 * 86_400.0),
        "{sends}"
    );
    assert_eq!(
        limited["sizing"]["recipients"], 250,
        "one day's surge is played"
    );
    assert_eq!(codes(&limited), ["messaging_limit"]);
    let said = limited["warnings"][0]["message"].as_str().expect("message");
    assert!(
        said.contains("72 days") && said.contains("whatsapp.messaging_limit"),
        "{said}"
    );
    let costs = &limited["costs"];
    assert_eq!(costs["currency"], "NGN");
    assert_eq!(costs["country"], "234");
    assert_eq!(costs["meta"].as_f64(), Some(18_000.0 * 38.5));
    assert!(costs["model"].as_f64() > Some(0.0), "{costs}");
    assert_eq!(limited["provider"]["rpm_limit"], 20);

    // Everybody at once, faster than the number: capped, and the model's limit is too low.
    let fast = json(&[
        "--audience",
        "2000",
        "--messaging-limit",
        "unlimited",
        "--send-rate",
        "1000",
        "--json",
    ]);
    assert_eq!(codes(&fast), ["send_rate", "llm_budget"]);
    let rate = fast["sends"]["rate"].as_f64().expect("rate");
    assert!((70.0..80.0).contains(&rate), "{}", fast["sends"]);
    assert!(fast["provider"]["requests_per_minute"].as_u64() > Some(20));
    assert!(fast["recommended"]["send_rate"].as_f64() < Some(rate));

    let text = plan(&["--audience", "18000"]);
    assert!(text.status.success());
    let text = String::from_utf8_lossy(&text.stdout);
    for part in [
        "250 a day",
        "What customers see",
        "What to run",
        "What it costs (NGN)",
        "693,000.00",
        "messaging_limit: 18,000 customers",
    ] {
        assert!(text.contains(part), "{part} missing from:\n{text}");
    }
    assert!(
        !text.contains("slots") && !text.contains("utilisation"),
        "{text}"
    );

    for (args, named) in [
        (&["--messaging-limit", "0"][..], "--messaging-limit"),
        (&["--send-rate", "0"], "--send-rate"),
        (&["--country", "nigeria"], "--country"),
        (&["--llm-tokens", "3000"], "--llm-tokens"),
        (&["--llm-rpm", "0"], "--llm-rpm"),
        (&["--slots", "0"], "--slots"),
    ] {
        let out = plan(&[&["--audience", "100"][..], args].concat());
        assert!(!out.status.success(), "{args:?}");
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(
            said.contains(named) && said.contains(args[1]),
            "{args:?}: {said}"
        );
    }
}

/// A batch that aged in Sabi's own queue (a surge) is answered, late; one that reached Sabi
/// late goes to people; `engine.queued_review_after` caps the queue's wait when set.
#[tokio::test]
async fn a_batch_that_waited_in_the_queue_is_answered_not_sent_to_people() {
    for (cap, answered) in [(None, true), (Some("30m"), false)] {
        let extra: Vec<(&str, &str)> = cap
            .map(|cap| ("SABI_QUEUED_REVIEW_AFTER", cap))
            .into_iter()
            .collect();
        let app = TestApp::spawn_with(None, &extra).await;
        let now_s = START_MS / 1000;
        let body = text_webhook_at("wamid.surge", "2348031234567", "How far my order?", now_s);
        assert_eq!(app.post_whatsapp_webhook(body).await.status(), 200);
        // Nobody was free for an hour.
        app.clock.advance(Duration::from_secs(3_600));
        assert_eq!(app.scheduler.drain().await.expect("drain"), 1);
        let outbox = app.store.outbox(None).await.expect("outbox");
        let review = app
            .store
            .review_queue(ReviewQuery::default())
            .await
            .expect("review");
        assert_eq!(
            (outbox.len(), review.len()),
            (usize::from(answered), usize::from(!answered))
        );
        if !answered {
            assert_eq!(review[0].reason.as_str(), "too_old");
        }
    }
}

/// `/metrics` tells an autoscaler how long a batch falling due now would wait, and how long
/// turns waited in the queue.
#[tokio::test]
async fn the_expected_wait_and_the_queue_wait_are_in_the_metrics() {
    let app = TestApp::spawn().await;
    let now_s = START_MS / 1000;
    for n in 0..6 {
        let body = text_webhook_at(
            &format!("wamid.q{n}"),
            &format!("23480312345{n:02}"),
            "hello",
            now_s,
        );
        assert_eq!(app.post_whatsapp_webhook(body).await.status(), 200);
    }
    // The batch window passes, then two minutes with no worker.
    app.clock.advance(Duration::from_secs(20 + 120));
    let scrape = || async {
        app.client
            .get(app.url("/metrics"))
            .send()
            .await
            .expect("scraped")
            .text()
            .await
            .expect("text")
    };
    let text = scrape().await;
    let gauge = |text: &str, name: &str| -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("{name} in {text}"))
    };
    assert_eq!(gauge(&text, "sabi_due"), 6.0);
    assert!(
        gauge(&text, "sabi_expected_wait_seconds") >= 120.0,
        "{text}"
    );
    assert_eq!(app.scheduler.drain().await.expect("drain"), 6);
    let text = scrape().await;
    assert_eq!(gauge(&text, "sabi_queue_wait_seconds_count"), 6.0);
    assert_eq!(
        gauge(&text, "sabi_expected_wait_seconds"),
        0.0,
        "nobody waits now"
    );
}

/// Customers far back in the queue are told how long their answer will take, once, and the
/// answer follows; nobody is told while the queue is short.
#[tokio::test]
async fn customers_far_back_in_the_queue_get_one_holding_message_then_the_answer() {
    let app = TestApp::spawn().await;
    let now_s = START_MS / 1000;
    let customers: Vec<String> = (0..5).map(|n| format!("23480312300{n:02}")).collect();
    for (n, customer) in customers.iter().enumerate() {
        let body = text_webhook_at(
            &format!("wamid.w{n}"),
            customer,
            "Una get this shoe for size 44?",
            now_s,
        );
        assert_eq!(app.post_whatsapp_webhook(body).await.status(), 200);
    }
    // The batch window passes: they have waited no time yet.
    app.clock.advance(Duration::from_secs(20));
    assert_eq!(app.holder.look().await.expect("looked"), 0, "a short wait");
    // Nobody free for a minute and a half: past engine.hold_after (60 s).
    app.clock.advance(Duration::from_secs(90));
    assert_eq!(app.holder.look().await.expect("looked"), 5);
    assert_eq!(
        app.holder.look().await.expect("looked"),
        0,
        "once per batch"
    );
    let held = app.store.outbox(None).await.expect("outbox");
    assert_eq!(held.len(), 5);
    assert!(
        held.iter().all(|p| p.text.contains("in about 2 minutes")),
        "{:?}",
        held[0].text
    );
    assert_eq!(app.scheduler.drain().await.expect("drain"), 5);
    let outbox = app.store.outbox(None).await.expect("outbox");
    for customer in &customers {
        let parts: Vec<&str> = outbox
            .iter()
            .filter(|p| &p.conversation.customer == customer)
            .map(|p| p.text.as_str())
            .collect();
        assert_eq!(parts.len(), 2, "{parts:?}");
        assert!(parts[0].contains("Many people are writing"), "{parts:?}");
    }
    let metrics = app
        .client
        .get(app.url("/metrics"))
        .send()
        .await
        .expect("scraped")
        .text()
        .await
        .expect("text");
    assert!(
        metrics.contains("sabi_holding_messages_total 5"),
        "{metrics}"
    );
}

/// While the primary provider is paused by a 429, turns go to the fallback.
#[tokio::test]
async fn a_paused_provider_is_passed_over_for_the_fallback() {
    let primary = FakeLlm::start().await;
    let fallback = FakeLlm::start().await;
    primary.script([Answer::Throttled(600)]);
    let clock = ManualClock::new(At::from_millis(1_781_000_000_000));
    let retries = Retries {
        attempts: 2,
        backoff: Duration::ZERO,
    };
    let context = context(clock, Metrics::new(), retries);
    let llm = Llm::new(
        provider(&primary, "primary"),
        Some(provider(&fallback, "backup")),
        context,
    )
    .expect("client");
    let messages = [ChatMessage::new("user", "hello")];
    for _ in 0..2 {
        let answer = llm
            .complete(&messages, &[], Providers::All, &llm.waits())
            .await
            .expect("answered");
        assert_eq!(answer.model, "backup");
    }
    assert_eq!(
        primary.completions().len(),
        1,
        "asked once, then passed over"
    );
    assert_eq!(fallback.completions().len(), 2);
}

/// `sabi plan --local-share auto` reads the router's share of this store's last week, and
/// `--reply-curve auto` this store's latest finished broadcast; each says so when there is
/// nothing to read.
#[tokio::test]
async fn sabi_plan_reads_what_this_store_measured() {
    let dir = tempfile::tempdir().expect("tempdir");
    let plan = |extra: &[&str]| {
        sabi_command(dir.path())
            .args(["plan", "--audience", "100", "--slots", "5", "--json"])
            .args(extra)
            .output()
            .expect("sabi runs")
    };
    let none = plan(&["--local-share", "auto"]);
    assert!(!none.status.success());
    let said = String::from_utf8_lossy(&none.stderr);
    assert!(said.contains("no answered turns"), "{said}");
    let none = plan(&["--reply-curve", "auto"]);
    let said = String::from_utf8_lossy(&none.stderr);
    assert!(said.contains("no finished broadcast"), "{said}");

    // Two turns now, answered without the model (the sandbox's acknowledgement).
    let sabi = SabiProcess::start_with(dir.path(), &[("SABI_BATCH_WINDOW", "0")]);
    let client = reqwest::Client::new();
    let now_s = i64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("after 1970")
            .as_secs(),
    )
    .expect("fits");
    for n in 0..2 {
        let body = text_webhook_at(
            &format!("wamid.m{n}"),
            &format!("2348031111{n:03}"),
            "hi",
            now_s,
        );
        let response = post_webhook(&client, &sabi.url(""), body).await;
        assert_eq!(response.status(), 200);
    }
    eventually("the measured local share", || async {
        let measured = plan(&["--local-share", "auto"]);
        measured.status.success()
            && serde_json::from_slice::<serde_json::Value>(&measured.stdout)
                .is_ok_and(|json| json["scenario"]["local_share"] == 1.0)
    })
    .await;
}

/// `sabi simulate` plays the surge against the real engine on virtual time: every message is
/// answered; with one slot and slow model turns the queue builds, far-back customers get a
/// holding message first, and more slots shorten the waits. The figures are the plan's.
#[test]
fn sabi_simulate_measures_the_surge_on_the_real_engine() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = json_lines(
        dir.path(),
        &[
            "simulate",
            "--audience",
            "200",
            "--reply-rate",
            "0.5",
            "--llm-latency",
            "15,20",
            "--slots",
            "1,8",
            "--json",
        ],
    );
    let out = &out[0];
    // 200 are within a day's messaging limit: one surge of all of them.
    assert_eq!(out["sends"]["days"], 1, "{}", out["sends"]);
    assert_eq!(out["sizing"]["recipients"], 200);
    assert_eq!(out["warnings"], serde_json::json!([]));
    let rows = out["rows"].as_array().expect("rows");
    let planned = out["planned"].as_array().expect("planned rows");
    assert_eq!(rows.len(), 2);
    assert_eq!(planned.len(), 2);
    for row in rows {
        let customers = &row["customers"];
        assert!(customers["messages"].as_u64() > Some(100), "{customers}");
        assert_eq!(
            customers["answered"], customers["messages"],
            "every message answered: {customers}"
        );
        assert!(row["turns"].as_u64() > Some(50), "{row}");
        assert!(customers["model_calls"].as_u64() > Some(0), "{customers}");
    }
    let (one, eight) = (&rows[0], &rows[1]);
    assert_eq!(one["slots"], 1);
    assert!(
        one["p95_wait_s"].as_f64().expect("p95") > 60.0,
        "one slot queues: {one}"
    );
    assert!(
        one["holding_messages"].as_u64() > Some(0),
        "far-back customers hear first: {one}"
    );
    assert!(one["p95_wait_s"].as_f64() > eight["p95_wait_s"].as_f64());
    assert_eq!(eight["holding_messages"], 0, "{eight}");
    assert_eq!(one["review_spill"], 0, "the queue's wait is not lateness");
}

/// Answers at once what the router answers alone ("thank you"); holds every other turn until
/// the gate opens, as a slow model would.
struct Gated(Arc<tokio::sync::Semaphore>);

#[async_trait::async_trait]
impl sabi::turn::TurnHandler for Gated {
    async fn handle(
        &self,
        batch: &sabi::domain::Batch,
    ) -> Result<sabi::turn::TurnOutcome, sabi::turn::TurnError> {
        if batch
            .messages
            .iter()
            .any(|m| m.text.as_deref() != Some("thank you"))
        {
            self.0.acquire().await.expect("open").forget();
        }
        let answer = sabi::domain::ReplyPart::text("answered");
        Ok(sabi::turn::TurnOutcome::Reply(vec![answer]))
    }
}

/// The customers answered so far, from the outbox.
async fn answered(app: &TestApp) -> Vec<String> {
    let outbox = app.store.outbox(None).await.expect("outbox");
    outbox
        .into_iter()
        .map(|p| p.conversation.customer)
        .collect()
}

/// Turns the router answers alone never wait behind model turns: every slot the queue may hold
/// is taken by a model turn and more wait, yet a customer's "thank you" is answered at once,
/// in the slot model turns never take.
#[tokio::test]
async fn a_routine_turn_never_waits_behind_model_turns() {
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let handler = Arc::new(Gated(gate.clone()));
    let app = TestApp::spawn_with(Some(handler), &[("SABI_TURNS", "2")]).await;
    let stop = tokio_util::sync::CancellationToken::new();
    tokio::spawn(app.scheduler.clone().run(stop.clone()));
    let now_s = START_MS / 1000;
    for n in 0..3 {
        let customer = format!("23480312301{n:02}");
        let body = text_webhook_at(
            &format!("wamid.q{n}"),
            &customer,
            "Who will win the league?",
            now_s,
        );
        assert_eq!(app.post_whatsapp_webhook(body).await.status(), 200);
    }
    app.clock.advance(Duration::from_secs(20));
    let body = text_webhook_at("wamid.q9", "2348031230199", "thank you", now_s + 20);
    assert_eq!(app.post_whatsapp_webhook(body).await.status(), 200);
    app.clock.advance(Duration::from_secs(20));
    // Time goes on while the test waits: a worker whose due work could not all be claimed
    // looks again a tenth of a poll later.
    eventually("the first answer", || async {
        app.clock.advance(Duration::from_millis(100));
        !answered(&app).await.is_empty()
    })
    .await;
    assert_eq!(
        answered(&app).await,
        ["2348031230199"],
        "the model turns still wait"
    );
    gate.add_permits(3);
    eventually("the model turns to end", || async {
        app.clock.advance(Duration::from_millis(100));
        answered(&app).await.len() >= 4
    })
    .await;
    stop.cancel();
}
