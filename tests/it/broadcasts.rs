//! Broadcasts sent end to end: Sabi whole against the fake Graph API, a broadcast kept in its
//! store, its template sent to each recipient once with their parameters, at the broadcast's
//! rate, with Meta's marketing limit holding a recipient and an opt-out failing one, while a
//! customer who writes meanwhile is answered.

use std::sync::Arc;
use std::time::Duration;

use sabi::clock::{Clock, SystemClock};
use sabi::store::{BroadcastState, NewBroadcast, NewRecipient, RecipientState};

use crate::helpers::{PATIENCE, eventually_seen, eventually_some};
use crate::sender::{Parts, Sending, customer};

const RECIPIENTS: usize = 60;

fn broadcast(rate: u32) -> NewBroadcast {
    let now = SystemClock.now();
    NewBroadcast {
        key: Some("diwali-eve".into()),
        name: "Diwali eve".into(),
        template: "diwali_offer".into(),
        language: "en".into(),
        business: "100000000000001".into(),
        now,
        start_at: now,
        until: None,
        rate,
        body: None,
        hours: None,
        recipients: (0..RECIPIENTS)
            .map(|n| NewRecipient {
                to: format!("23480900000{n:02}"),
                params: vec![format!("Customer {n}"), format!("{n}% off")],
                line: Some(n as u64 + 2),
                skipped: None,
                tz: None,
            })
            .collect(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_recipient_gets_the_template_once_at_the_rate_and_replies_still_go() {
    let sabi = Sending::start(Arc::new(Parts(1)), &[]).await;
    // The first two sends: Meta's marketing limit for that user, then an opt-out.
    sabi.fake.fail_next(&[(400, 131_049), (400, 131_050)]);
    let (b, created) = sabi
        .store
        .create_broadcast(broadcast(40))
        .await
        .expect("kept");
    assert!(created);
    let start = tokio::time::Instant::now();
    eventually_some(
        "the broadcast to start",
        Duration::from_secs(10),
        || async { (sabi.fake.accepted().len() >= 5).then_some(()) },
    )
    .await;
    sabi.customer_writes("wamid.in1", &customer(1), "hello", 0)
        .await;
    let patience = Duration::from_secs(30).saturating_sub(start.elapsed());
    let ended = sabi
        .broadcast_when(b.id, patience, |now| {
            now.state == BroadcastState::Running
                && now.counts["queued"] + now.counts["sending"] == 0
        })
        .await;
    assert_eq!(
        (
            ended.counts["accepted"],
            ended.counts["held"],
            ended.counts["failed"]
        ),
        (RECIPIENTS as u64 - 2, 1, 1),
        "{ended:?}"
    );
    let failed = sabi
        .store
        .broadcast_recipients(b.id, Some(RecipientState::Failed), 10)
        .await
        .expect("recipients");
    assert_eq!(failed[0].error_code, Some(131_050));

    let templates: Vec<_> = sabi
        .fake
        .received()
        .into_iter()
        .filter(|r| r.body["type"] == "template")
        .collect();
    assert_eq!(templates.len(), RECIPIENTS, "one request per recipient");
    let mut seen = std::collections::HashSet::new();
    for sent in &templates {
        let to = sent.recipient().expect("to").to_owned();
        let n: usize = to[to.len() - 2..].parse().expect("numbered");
        assert!(seen.insert(to.clone()), "{to} twice");
        let params = &sent.body["template"]["components"][0]["parameters"];
        assert_eq!(params[0]["text"], format!("Customer {n}"));
        assert_eq!(params[1]["text"], format!("{n}% off"));
        assert_eq!(sent.body["template"]["name"], "diwali_offer");
    }
    // 40 a second: no window of one second holds more.
    let times: Vec<_> = templates.iter().map(|r| r.at).collect();
    for (i, first) in times.iter().enumerate() {
        let within = times[i..]
            .iter()
            .take_while(|t| t.duration_since(*first) < Duration::from_secs(1))
            .count();
        assert!(within <= 40, "{within} sends in one second");
    }
    // The customer who wrote during the broadcast was answered.
    let replies: Vec<_> = sabi
        .fake
        .accepted()
        .into_iter()
        .filter(|r| r.body["type"] != "template" && r.recipient() == Some(customer(1).as_str()))
        .collect();
    assert_eq!(replies.len(), 1, "the reply went out during the broadcast");
}

/// `sabi broadcast` as an operator uses it: a dry run keeps nothing, a file that cannot be
/// used is refused with what is wrong, the same key twice gives one broadcast, and pause,
/// resume and cancel follow the rules.
#[test]
fn the_broadcast_commands_create_once_per_key_and_control_broadcasts() {
    use crate::helpers::{json_lines, sabi_command};
    let dir = tempfile::tempdir().expect("tempdir");
    let csv = dir.path().join("audience.csv");
    std::fs::write(
        &csv,
        "name,phone,city\nAda,+2348031234567,Lagos\nBola,nope,Ibadan\n\
         Chi,08031234567,Enugu\nDayo,08039999999,Abuja\n",
    )
    .expect("written");
    let create = |extra: &[&str]| {
        let mut args = vec![
            "broadcast",
            "create",
            "--name",
            "Diwali",
            "--template",
            "diwali_offer",
            "--language",
            "en",
            "--audience",
            csv.to_str().expect("utf-8"),
            "--param",
            "name",
            "--param",
            "city",
            "--from",
            "100000000000001",
            "--country",
            "234",
            "--json",
        ];
        args.extend_from_slice(extra);
        json_lines(dir.path(), &args)
    };
    let dry = create(&["--dry-run"]);
    assert_eq!(
        (dry[0]["to_send"].as_u64(), dry[0]["recipients"].as_u64()),
        (Some(2), Some(4))
    );
    let lines: Vec<u64> = dry[0]["skipped"]
        .as_array()
        .expect("skipped")
        .iter()
        .filter_map(|s| s["line"].as_u64())
        .collect();
    assert_eq!(
        lines,
        [3, 4],
        "the bad row and the repeated number, by line"
    );
    assert!(
        json_lines(dir.path(), &["broadcast", "ls", "--json"]).is_empty(),
        "a dry run keeps nothing"
    );

    let first = create(&[
        "--key",
        "diwali-1",
        "--quiet-hours",
        "21:00-08:00",
        "--tz",
        "Africa/Lagos",
    ]);
    let again = create(&["--key", "diwali-1"]);
    assert_eq!(first[0]["id"], again[0]["id"]);
    assert_eq!(first[0]["counts"]["queued"], 2);
    assert_eq!(
        (first[0]["quiet_hours"].as_str(), first[0]["tz"].as_str()),
        (Some("21:00-08:00"), Some("Africa/Lagos"))
    );
    let unknown_zone = sabi_command(dir.path())
        .args([
            "broadcast",
            "create",
            "--name",
            "x",
            "--template",
            "t",
            "--language",
            "en",
        ])
        .args(["--audience", csv.to_str().expect("utf-8"), "--from", "1"])
        .args(["--quiet-hours", "21:00-08:00", "--tz", "Mars/Olympus"])
        .output()
        .expect("sabi runs");
    assert!(!unknown_zone.status.success());
    let said = String::from_utf8_lossy(&unknown_zone.stderr);
    assert!(said.contains("not a known zone"), "{said}");
    assert_eq!(
        json_lines(dir.path(), &["broadcast", "ls", "--json"]).len(),
        1
    );

    // Nine in the morning on each recipient's clock: these are in Nigeria (their country has
    // one zone), so it starts at 08:00Z; a wall-clock time needs a zone for those without one
    // (the United States has several).
    let local = ["--at", "2030-01-01T09:00", "--until", "2030-01-01 18:00"];
    let american = dir.path().join("american.csv");
    std::fs::write(&american, "phone\n+15551234567\n").expect("written");
    let no_zone = sabi_command(dir.path())
        .args(["broadcast", "create", "--name", "x", "--template", "t"])
        .args(["--language", "en", "--from", "1"])
        .args(["--audience", american.to_str().expect("utf-8")])
        .args(local)
        .output()
        .expect("sabi runs");
    assert!(!no_zone.status.success());
    let said = String::from_utf8_lossy(&no_zone.stderr);
    assert!(said.contains("--tz"), "{said}");
    let morning = create(&[&local[..], &["--tz", "Europe/London", "--dry-run"]].concat());
    assert_eq!(morning[0]["to_send"], 2, "{morning:?}");
    let morning = create(&[&local[..], &["--tz", "Europe/London"]].concat());
    assert_eq!(
        (
            morning[0]["start_at"].as_i64(),
            morning[0]["until"].as_i64(),
            morning[0]["local_start"].as_str()
        ),
        (
            Some(1_893_484_800_000),
            Some(1_893_484_800_000 + 9 * 3_600_000),
            Some("2030-01-01T09:00:00")
        ),
        "Lagos's clock, not the broadcast's London"
    );
    assert_eq!(morning[0]["state"], "scheduled");
    let id = morning[0]["id"].to_string();
    json_lines(dir.path(), &["broadcast", "cancel", &id, "--json"]);

    let bad = sabi_command(dir.path())
        .args([
            "broadcast",
            "create",
            "--name",
            "x",
            "--template",
            "t",
            "--language",
            "en",
        ])
        .args([
            "--audience",
            csv.to_str().expect("utf-8"),
            "--param",
            "town",
        ])
        .args(["--from", "100000000000001"])
        .output()
        .expect("sabi runs");
    assert!(!bad.status.success());
    let said = String::from_utf8_lossy(&bad.stderr);
    assert!(said.contains("no column \"town\""), "{said}");

    let id = first[0]["id"].to_string();
    let paused = json_lines(
        dir.path(),
        &["broadcast", "pause", &id, "--reason", "checking", "--json"],
    );
    assert_eq!(
        (
            paused[0]["state"].as_str(),
            paused[0]["paused_because"].as_str()
        ),
        (Some("paused"), Some("checking"))
    );
    let cancelled = json_lines(dir.path(), &["broadcast", "cancel", &id, "--json"]);
    assert_eq!(cancelled[0]["counts"]["cancelled"], 2);
    let resume = sabi_command(dir.path())
        .args(["broadcast", "resume", &id])
        .output()
        .expect("sabi runs");
    assert!(!resume.status.success(), "a cancelled broadcast stays so");
}

/// The admin API's broadcasts: the review API's token, a dry run that keeps nothing, recipients
/// given as a list or as a CSV file, one broadcast per key, recipients by state, and pause,
/// resume and cancel as the rules allow.
#[tokio::test]
async fn the_admin_api_creates_lists_and_controls_broadcasts() {
    use crate::helpers::TestApp;
    use serde_json::{Value, json};
    const TOKEN: &str = "admin-token-for-broadcasts";
    let app = TestApp::spawn_with(None, &[("SABI_ADMIN_TOKEN", TOKEN)]).await;
    let call = |method: reqwest::Method, path: &str, body: Option<Value>| {
        let mut request = app.client.request(method, app.url(path)).bearer_auth(TOKEN);
        if let Some(body) = body {
            request = request.json(&body);
        }
        async move {
            let response = request.send().await.expect("sent");
            let status = response.status().as_u16();
            (
                status,
                response.json::<Value>().await.unwrap_or(Value::Null),
            )
        }
    };
    let unauthorised = app
        .client
        .get(app.url("/admin/broadcasts"))
        .send()
        .await
        .expect("sent");
    assert_eq!(unauthorised.status(), 401);

    let listed = json!({
        "name": "Diwali eve", "template": {"name": "diwali_offer", "language": "en"},
        "from": "100000000000001", "country": "234", "key": "api-1",
        "recipients": [
            {"to": "+2348031234567", "params": ["Ada"]},
            {"to": "08031234567", "params": ["Ada again"]},
            {"to": "not a number", "params": ["Bola"]},
            {"to": "2348039999999", "params": ["Chi"]},
        ],
    });
    let mut dry = listed.clone();
    dry["dry_run"] = json!(true);
    let (status, answer) = call(reqwest::Method::POST, "/admin/broadcasts", Some(dry)).await;
    assert_eq!(
        (status, answer["to_send"].as_u64()),
        (200, Some(2)),
        "{answer}"
    );
    let (_, all) = call(reqwest::Method::GET, "/admin/broadcasts", None).await;
    assert_eq!(
        all["broadcasts"].as_array().map(Vec::len),
        Some(0),
        "a dry run keeps nothing"
    );

    let (status, made) = call(
        reqwest::Method::POST,
        "/admin/broadcasts",
        Some(listed.clone()),
    )
    .await;
    assert_eq!(
        (status, made["created"].as_bool()),
        (200, Some(true)),
        "{made}"
    );
    let (_, again) = call(reqwest::Method::POST, "/admin/broadcasts", Some(listed)).await;
    assert_eq!(again["created"].as_bool(), Some(false));
    let id = made["broadcast"]["id"].as_i64().expect("id");
    assert_eq!(
        again["broadcast"]["id"].as_i64(),
        Some(id),
        "one broadcast per key"
    );
    assert_eq!(made["broadcast"]["counts"]["queued"], 2);
    assert_eq!(made["broadcast"]["counts"]["skipped"], 2);

    let (_, skipped) = call(
        reqwest::Method::GET,
        &format!("/admin/broadcasts/{id}/recipients?state=skipped"),
        None,
    )
    .await;
    let reasons: Vec<&str> = skipped["recipients"]
        .as_array()
        .expect("recipients")
        .iter()
        .filter_map(|r| r["skipped"].as_str())
        .collect();
    assert_eq!(reasons, ["duplicate", "invalid"]);
    let (status, _) = call(
        reqwest::Method::GET,
        &format!("/admin/broadcasts/{id}/recipients?state=lost"),
        None,
    )
    .await;
    assert_eq!(status, 422);

    let csv = json!({
        "name": "From a file", "template": {"name": "diwali_offer", "language": "en"},
        "from": "100000000000001", "params": ["name"],
        "audience_csv": "phone,name\n2348031234567,Ada\n",
    });
    let (status, from_file) = call(reqwest::Method::POST, "/admin/broadcasts", Some(csv)).await;
    assert_eq!(
        (status, from_file["broadcast"]["recipients"].as_u64()),
        (200, Some(1))
    );
    let bad = json!({
        "name": "Bad", "template": {"name": "t", "language": "en"}, "from": "1",
        "params": ["town"], "audience_csv": "phone,name\n2348031234567,Ada\n",
    });
    let (status, said) = call(reqwest::Method::POST, "/admin/broadcasts", Some(bad)).await;
    assert_eq!(status, 422, "{said}");

    let path = |action: &str| format!("/admin/broadcasts/{id}/{action}");
    let (status, paused) = call(
        reqwest::Method::POST,
        &path("pause"),
        Some(json!({"reason": "checking"})),
    )
    .await;
    assert_eq!((status, paused["state"].as_str()), (200, Some("paused")));
    assert_eq!(paused["paused_because"], "checking");
    let (_, resumed) = call(reqwest::Method::POST, &path("resume"), None).await;
    assert_eq!(resumed["state"], "running");
    let (_, cancelled) = call(reqwest::Method::POST, &path("cancel"), None).await;
    assert_eq!(
        (
            cancelled["state"].as_str(),
            cancelled["counts"]["cancelled"].as_u64()
        ),
        (Some("cancelled"), Some(2))
    );
    let (status, _) = call(reqwest::Method::POST, &path("resume"), None).await;
    assert_eq!(status, 404, "a cancelled broadcast stays so");
    let (status, _) = call(reqwest::Method::GET, "/admin/broadcasts/9999", None).await;
    assert_eq!(status, 404);
}

/// Meta's `user_preferences` webhook, signed as Meta signs it.
fn preference_webhook(customer: &str, value: &str) -> Vec<u8> {
    let now = SystemClock.now().unix_seconds();
    let body = serde_json::json!({
        "object": "whatsapp_business_account",
        "entry": [{"id": "240011223344556", "changes": [{"field": "user_preferences", "value": {
            "messaging_product": "whatsapp",
            "metadata": {"display_phone_number": "2347000000001", "phone_number_id": "100000000000001"},
            "contacts": [{"wa_id": customer, "profile": {"name": "Amaka Eze"}}],
            "user_preferences": [{"wa_id": customer, "detail": "User requested to change marketing messages",
                "category": "marketing_messages", "value": value, "timestamp": now}],
        }}]}],
    });
    sabi::whatsapp::wire::encode(&body).into_bytes()
}

/// Every text `to` was sent, in order.
fn texts_to(sabi: &Sending, to: &str) -> Vec<String> {
    sabi.fake
        .accepted()
        .iter()
        .filter(|r| r.recipient() == Some(to))
        .filter_map(|r| r.text().map(str::to_owned))
        .collect()
}

async fn wait_for_texts(sabi: &Sending, to: &str, count: usize) -> Vec<String> {
    eventually_seen("the texts", PATIENCE, || async {
        let texts = texts_to(sabi, to);
        if texts.len() >= count {
            Ok(texts)
        } else {
            Err(format!("{to} got {texts:?}"))
        }
    })
    .await
}

/// Opting out three ways (a stop keyword, Meta's `user_preferences`, Meta's 131050 refusal) keeps
/// every later broadcast from the customer while service replies still go; START opts back in,
/// each change confirmed once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn customers_opt_out_by_keyword_by_meta_and_by_refusal_and_back_in() {
    use sabi::config::Config;
    use sabi::store::SkipReason;
    const ANSWER: &str = "Our shop opens at nine.";
    const ADMIN: &str = "admin-token-for-opt-outs";
    let sabi = Sending::start(
        Arc::new(crate::sender::Says(ANSWER.into())),
        &[("SABI_ADMIN_TOKEN", ADMIN)],
    )
    .await;
    let defaults = Config::defaults().expect("defaults").broadcast;
    let (ada, bola, chi) = ("2348031111111", "2348032222222", "2348033333333");

    sabi.customer_writes("wamid.stop1", ada, "Abeg no send me again o", 0)
        .await;
    assert_eq!(wait_for_texts(&sabi, ada, 1).await[0], defaults.stop_reply);
    sabi.customer_writes("wamid.stop2", ada, "STOP", 0).await;
    sabi.customer_writes("wamid.q1", ada, "When do you open?", 0)
        .await;
    let texts = wait_for_texts(&sabi, ada, 2).await;
    assert_eq!(
        texts,
        [defaults.stop_reply.clone(), ANSWER.to_owned()],
        "a repeated stop is not confirmed twice, and questions are still answered"
    );

    let body = preference_webhook(bola, "stop");
    sabi.post_webhook(body).await;

    // A dry run through the admin API leaves both out, saying why.
    let (_, dry) = sabi
        .post_broadcast(
            ADMIN,
            serde_json::json!({
                "name": "Diwali eve", "template": {"name": "diwali_offer", "language": "en"},
                "from": "100000000000001", "recipients": [{"to": ada}, {"to": bola}, {"to": chi}],
                "dry_run": true,
            }),
        )
        .await;
    assert_eq!(dry["to_send"], 1, "{dry}");
    let left_out: Vec<(&str, &str)> = dry["skipped"]
        .as_array()
        .expect("skipped")
        .iter()
        .map(|s| {
            (
                s["to"].as_str().unwrap_or(""),
                s["reason"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(left_out, [(ada, "opted_out"), (bola, "opted_out")]);

    // Kept without that check, the claim still skips them; Meta refuses Chi with 131050.
    sabi.fake.fail_next(&[(400, 131_050)]);
    let now = SystemClock.now();
    let (b, _) = sabi
        .store
        .create_broadcast(NewBroadcast {
            key: None,
            now,
            start_at: now,
            recipients: [ada, bola, chi]
                .iter()
                .map(|to| NewRecipient {
                    to: (*to).to_owned(),
                    params: vec!["Friend".into(), "10% off".into()],
                    line: None,
                    skipped: None,
                    tz: None,
                })
                .collect(),
            ..broadcast(20)
        })
        .await
        .expect("kept");
    let ended = wait_for_state(&sabi, b.id, BroadcastState::Finished).await;
    assert_eq!((ended.counts["skipped"], ended.counts["failed"]), (2, 1));
    let skipped = sabi
        .store
        .broadcast_recipients(b.id, Some(RecipientState::Skipped), 10)
        .await
        .expect("recipients");
    assert!(
        skipped
            .iter()
            .all(|r| r.skipped == Some(SkipReason::OptedOut))
    );
    let asked = [ada, bola, chi].map(str::to_owned);
    let mut out: Vec<String> = sabi
        .store
        .opted_out(&asked)
        .await
        .expect("read")
        .into_iter()
        .collect();
    out.sort();
    assert_eq!(out, [ada, bola, chi]);

    sabi.customer_writes("wamid.start", ada, "Start", 0).await;
    let texts = wait_for_texts(&sabi, ada, 3).await;
    assert_eq!(texts[2], defaults.start_reply);
    let out = sabi.store.opted_out(&asked).await.expect("read");
    assert!(!out.contains(ada), "Ada is in again");
    let templates = sabi
        .fake
        .received()
        .into_iter()
        .filter(|r| r.body["type"] == "template")
        .count();
    assert_eq!(templates, 1, "only Chi's send was tried");
}

async fn wait_for_state(
    sabi: &Sending,
    id: i64,
    state: BroadcastState,
) -> sabi::store::BroadcastView {
    sabi.broadcast_when(id, PATIENCE, |b| b.state == state)
        .await
}

/// Meta refuses the template mid-broadcast (132015, paused): the broadcast pauses with nobody
/// lost; Meta's APPROVED webhook resumes it and everyone gets it once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_template_pauses_the_broadcast_and_its_approval_resumes_it() {
    let sabi = Sending::start(Arc::new(Parts(1)), &[]).await;
    sabi.fake.fail_next(&[(400, 132_015)]);
    let (b, _) = sabi
        .store
        .create_broadcast(broadcast(20))
        .await
        .expect("kept");
    let paused = wait_for_state(&sabi, b.id, BroadcastState::Paused).await;
    assert_eq!(paused.paused_by, Some(sabi::store::PausedBy::Template));
    // The few sends claimed with the refused one end as they may; then nothing goes.
    sabi.broadcast_when(b.id, PATIENCE, |now| now.counts["sending"] == 0)
        .await;
    let sent_while_paused = sabi.fake.accepted().len();
    // A paused broadcast sends nothing, so there is no event to wait for: quiet for longer
    // than the broadcaster's pace is the proof.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert_eq!(
        sabi.fake.accepted().len(),
        sent_while_paused,
        "nothing goes while paused"
    );
    let metrics = sabi.metrics().await;
    assert!(metrics.contains("sabi_broadcasts_paused 1"), "{metrics}");
    let queued = format!(
        "sabi_broadcast_recipients{{broadcast=\"{}\",state=\"queued\"}}",
        b.id
    );
    assert!(metrics.contains(&queued), "{metrics}");

    let approved = serde_json::json!({
        "object": "whatsapp_business_account",
        "entry": [{"id": "240011223344556", "time": SystemClock.now().unix_seconds(),
            "changes": [{"field": "message_template_status_update", "value": {
                "event": "APPROVED", "message_template_id": 1_689_556_908_120_042_i64,
                "message_template_name": "diwali_offer", "message_template_language": "en",
                "reason": "NONE", "message_template_category": "MARKETING"}}]}],
    });
    sabi.post_webhook(sabi::whatsapp::wire::encode(&approved).into_bytes())
        .await;
    let ended = sabi
        .broadcast_when(b.id, PATIENCE, |now| {
            assert!(
                now.state != BroadcastState::Paused || now.paused_by.is_none(),
                "{now:?}"
            );
            now.counts["queued"] + now.counts["sending"] == 0
        })
        .await;
    assert_eq!(ended.counts["accepted"], RECIPIENTS as u64, "{ended:?}");
    let metrics = sabi.metrics().await;
    assert!(metrics.contains("sabi_broadcasts_paused 0"), "{metrics}");
    assert!(
        metrics.contains(&format!(
            "sabi_broadcast_sends_total{{outcome=\"accepted\"}} {RECIPIENTS}"
        )),
        "{metrics}"
    );
    let mut seen = std::collections::HashSet::new();
    for sent in sabi
        .fake
        .accepted()
        .iter()
        .filter(|r| r.body["type"] == "template")
    {
        assert!(
            seen.insert(sent.recipient().expect("to").to_owned()),
            "sent twice"
        );
    }
    assert_eq!(seen.len(), RECIPIENTS);
}

/// Before anything is kept, Meta is asked about the template: one that does not exist in the
/// language, or is not APPROVED, refuses the broadcast; a row whose parameters the body does not
/// take is left out; the body is kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_template_is_checked_with_meta_before_anything_is_kept() {
    use serde_json::json;
    const ADMIN: &str = "admin-token-for-preflight";
    const BODY: &str = "Happy Diwali, {{1}}! {{2}} off tonight only.";
    let sabi = Sending::start(
        Arc::new(Parts(1)),
        &[
            ("SABI_ADMIN_TOKEN", ADMIN),
            ("SABI_WHATSAPP_BUSINESS_ACCOUNT_ID", "240011223344556"),
        ],
    )
    .await;
    sabi.fake
        .add_template("diwali_offer", "en", "APPROVED", BODY);
    sabi.fake
        .add_template("diwali_offer_v2", "en", "PAUSED", BODY);
    let create = |template: &str, language: &str, dry_run: bool| {
        let body = json!({
            "name": "Diwali eve", "template": {"name": template, "language": language},
            "from": "100000000000001", "dry_run": dry_run,
            "recipients": [
                {"to": "2348031111111", "params": ["Ada", "20%"]},
                {"to": "2348032222222", "params": ["Bola"]},
            ],
        });
        sabi.post_broadcast(ADMIN, body)
    };

    sabi.fake.set_messaging_limit("TIER_2K");
    let (status, dry) = create("diwali_offer", "en", true).await;
    assert_eq!(status, 200, "{dry}");
    assert_eq!(
        (dry["to_send"].as_u64(), dry["template_checked"].as_bool()),
        (Some(1), Some(true))
    );
    assert_eq!(
        dry["messaging_limit"],
        json!({"per_day": 250, "source": "setting", "meta": 2000, "unread": null}),
        "the broadcaster keeps to the setting's 250 below Meta's tier"
    );
    assert!(
        dry["notes"]
            .to_string()
            .contains("set it to 2000 to go faster"),
        "{dry}"
    );
    sabi.fake.set_messaging_limit("TIER_50");
    let (_, lower) = create("diwali_offer", "en", true).await;
    assert_eq!(
        lower["messaging_limit"],
        json!({"per_day": 50, "source": "meta", "meta": 50, "unread": null}),
        "Meta refuses beyond its tier, whatever the setting says"
    );
    assert!(
        lower["notes"]
            .to_string()
            .contains("set whatsapp.messaging_limit = 50"),
        "{lower}"
    );
    sabi.fake.set_messaging_limit("TIER_2K");
    assert_eq!(dry["skipped"][0]["to"], "2348032222222");
    assert_eq!(dry["skipped"][0]["reason"], "invalid");
    assert!(
        dry["skipped"][0]["why"]
            .as_str()
            .is_some_and(|w| w.contains("takes 2")),
        "{dry}"
    );

    for (template, language, says) in [
        (
            "diwali_offer",
            "fr",
            "does not exist in \\\"fr\\\" on the business account (it has en)",
        ),
        ("diwali_offer_v2", "en", "PAUSED, not APPROVED"),
        ("no_such_template", "en", "does not exist"),
    ] {
        let (status, refused) = create(template, language, false).await;
        assert_eq!(status, 422, "{refused}");
        assert!(refused.to_string().contains(says), "{refused}");
    }
    assert!(
        sabi.store.broadcasts(10).await.expect("listed").is_empty(),
        "nothing kept"
    );

    let (status, made) = create("diwali_offer", "en", false).await;
    assert_eq!(status, 200, "{made}");
    assert_eq!(made["broadcast"]["body"], BODY);
    assert_eq!(made["broadcast"]["counts"]["skipped"], 1);
}

/// Meta's messaging limit and the cooldown, end to end: with two customers a day allowed, a
/// first broadcast reaches two; a second one's dry run leaves out the customer sent one today
/// and says the others wait for headroom, and once kept, nobody more is sent to.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_messaging_limit_holds_a_broadcast_back_and_the_cooldown_skips() {
    use serde_json::{Value, json};
    const ADMIN: &str = "admin-token-for-limits";
    let sabi = Sending::start(
        Arc::new(Parts(1)),
        &[("SABI_ADMIN_TOKEN", ADMIN), ("SABI_MESSAGING_LIMIT", "2")],
    )
    .await;
    let create = |to: &[&str], dry_run: bool| {
        let recipients: Vec<Value> = to
            .iter()
            .map(|t| json!({"to": t, "params": ["x"]}))
            .collect();
        let body = json!({
            "name": "Diwali eve", "template": {"name": "diwali_offer", "language": "en"},
            "from": "100000000000001", "dry_run": dry_run, "recipients": recipients,
        });
        let created = sabi.post_broadcast(ADMIN, body);
        async move { created.await.1 }
    };
    let (a, b, c, d) = (
        "2348031111111",
        "2348032222222",
        "2348033333333",
        "2348034444444",
    );
    let first = create(&[a, b, c], false).await;
    let id = first["broadcast"]["id"].as_i64().expect("id");
    // Two reached: the third waits for headroom.
    sabi.broadcast_when(id, Duration::from_secs(20), |now| {
        now.counts["accepted"] == 2
    })
    .await;
    // The third is not sent: there is no event to wait for, so quiet for longer than the
    // broadcaster's pace is the proof.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let now = sabi.store.broadcast(id).await.expect("read").expect("kept");
    assert_eq!(
        (now.counts["accepted"], now.counts["queued"]),
        (2, 1),
        "{now:?}"
    );

    let dry = create(&[a, c, d], true).await;
    assert_eq!(dry["headroom"], 0, "{dry}");
    assert_eq!(dry["wait_for_headroom"], 2, "{dry}");
    assert_eq!(dry["skipped"][0]["to"], a, "{dry}");
    assert_eq!(dry["skipped"][0]["reason"], "cooldown", "{dry}");
    let day = 24 * 3_600_000;
    let first_sent = sabi
        .store
        .broadcast_recipients(id, Some(RecipientState::Accepted), 10)
        .await
        .expect("read")
        .iter()
        .filter_map(|r| r.sent_at)
        .min()
        .expect("sent");
    // Nobody more today: the two go as the places taken free, by a day after the dry run at
    // the latest (a day after the first send at the earliest), at 20 a second.
    let finishes = dry["finishes_at"].as_i64().expect("finishes_at");
    let latest = SystemClock.now().millis() + day + 100;
    assert!(
        (first_sent.millis() + day + 100..=latest).contains(&finishes),
        "{dry}"
    );
    assert_eq!(
        (dry["per_day"].as_u64(), dry["days"].as_u64()),
        (Some(2), Some(1)),
        "{dry}"
    );
    let sent = sabi.fake.accepted().len();
    assert_eq!(sent, 2);

    let shown = crate::helpers::sabi_command(sabi.dir())
        .env("SABI_MESSAGING_LIMIT", "2")
        .args(["broadcast", "show", &id.to_string(), "--json"])
        .output()
        .expect("sabi runs");
    let said = String::from_utf8_lossy(&shown.stdout);
    assert!(
        shown.status.success(),
        "{}",
        String::from_utf8_lossy(&shown.stderr)
    );
    let shown: Value = serde_json::from_str(said.trim()).expect("json");
    let waiting = &shown["waiting"];
    assert_eq!(waiting["reason"], "messaging_limit", "{shown}");
    assert_eq!(
        waiting["next_at"].as_i64(),
        Some(first_sent.millis() + day),
        "{shown}"
    );
    assert!(
        waiting["message"]
            .as_str()
            .is_some_and(|m| m.contains("2 customers reached in the last 24 hours, of 2 a day")),
        "{shown}"
    );
}

/// The report: who got it, read it, answered it or opted out after it, the replies minute by
/// minute after the send, and the cost at `broadcast.prices`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_report_counts_replies_opt_outs_and_cost() {
    use serde_json::Value;
    const ADMIN: &str = "admin-token-for-reports";
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        dir.path().join("sabi.toml"),
        "[broadcast]\nprices = { \"234\" = 0.05, \"44\" = 0.07 }\ncurrency = \"USD\"\n",
    )
    .expect("config written");
    let sabi = Sending::launch(
        dir,
        Some(Arc::new(Parts(1))),
        &[("SABI_ADMIN_TOKEN", ADMIN)],
        true,
    )
    .await;
    sabi.fake.send_statuses(true);
    let now = SystemClock.now();
    use serde_json::json;
    let customers: Vec<String> = (0..10).map(|n| format!("23480700000{n:02}")).collect();
    // Two came from an ad: Meta does not charge for their template.
    sabi.fake.free_entry_point(&customers[8]);
    sabi.fake.free_entry_point(&customers[9]);
    let (b, _) = sabi
        .store
        .create_broadcast(NewBroadcast {
            key: None,
            now,
            start_at: now,
            recipients: customers
                .iter()
                .map(|to| NewRecipient {
                    to: to.clone(),
                    params: vec!["Friend".into(), "10% off".into()],
                    line: None,
                    skipped: None,
                    tz: None,
                })
                .collect(),
            ..broadcast(50)
        })
        .await
        .expect("kept");
    let start = tokio::time::Instant::now();
    sabi.broadcast_when(b.id, Duration::from_secs(20), |now| {
        now.counts["delivered"] == 10
    })
    .await;
    for (n, text) in ["Is it for shoes too?", "hi", "how much", "STOP"]
        .iter()
        .enumerate()
    {
        sabi.customer_writes(&format!("wamid.reply{n}"), &customers[n], text, 0)
            .await;
    }
    let patience = Duration::from_secs(20).saturating_sub(start.elapsed());
    let report = eventually_seen("the opt-out in the report", patience, || async {
        let report: Value = sabi
            .client
            .get(format!("{}/admin/broadcasts/{}/report", sabi.url, b.id))
            .bearer_auth(ADMIN)
            .send()
            .await
            .expect("report")
            .json()
            .await
            .expect("json");
        if report["rates"]["opted_out"] == 0.1 {
            Ok(report)
        } else {
            Err(report.to_string())
        }
    })
    .await;
    assert_eq!(report["sent"], 10, "{report}");
    assert_eq!(report["rates"]["delivered"], 1.0, "{report}");
    assert_eq!(report["rates"]["replied"], 0.4, "{report}");
    assert_eq!(report["reply_curve"][0], 4, "{report}");
    assert_eq!(report["replies_later"], 0, "{report}");
    let cost = &report["cost"];
    assert!(
        (cost["estimated"].as_f64().expect("estimated") - 0.5).abs() < 1e-9,
        "{report}"
    );
    assert!(
        (cost["actual"].as_f64().expect("actual") - 0.4).abs() < 1e-9,
        "as Meta's pricing says: {report}"
    );
    assert_eq!(
        (&cost["billed"], &cost["free"], &cost["awaiting_pricing"]),
        (&json!(8), &json!(2), &json!(0)),
        "{report}"
    );
    assert_eq!(cost["unpriced"], 0, "{report}");
}

/// A large broadcast at 200 a second: every one-second window within the rate, each recipient
/// once with their parameters, and customers who write meanwhile answered at once: replies go
/// first (behind the queue, a reply would wait up to the 25 s the broadcast takes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_thousand_recipients_keep_the_rate_and_replies_go_first() {
    const RECIPIENTS: usize = 5_000;
    const RATE: usize = 200;
    const WRITERS: usize = 20;
    let sabi = Sending::start(
        Arc::new(Parts(1)),
        &[
            ("SABI_OUTBOUND_RATE", "260"),
            ("SABI_MESSAGING_LIMIT", "unlimited"),
        ],
    )
    .await;
    let now = SystemClock.now();
    let (b, _) = sabi
        .store
        .create_broadcast(NewBroadcast {
            key: None,
            now,
            start_at: now,
            recipients: (0..RECIPIENTS)
                .map(|n| NewRecipient {
                    to: format!("2348{n:09}"),
                    params: vec![format!("Customer {n}"), format!("code{n}")],
                    line: None,
                    skipped: None,
                    tz: None,
                })
                .collect(),
            ..broadcast(RATE as u32)
        })
        .await
        .expect("kept");
    // Customers write while it drains, a few seconds apart.
    let mut written = Vec::new();
    for n in 0..WRITERS {
        tokio::time::sleep(Duration::from_millis(400)).await;
        let who = customer(900 + n);
        written.push((who.clone(), tokio::time::Instant::now()));
        sabi.customer_writes(&format!("wamid.during{n}"), &who, "hello", 0)
            .await;
    }
    let ended = sabi
        .broadcast_when(b.id, Duration::from_secs(180), |now| {
            now.counts["queued"] + now.counts["sending"] == 0
        })
        .await;
    assert_eq!(ended.counts["accepted"], RECIPIENTS as u64, "{ended:?}");

    let received = sabi.fake.received();
    let templates: Vec<_> = received
        .iter()
        .filter(|r| r.body["type"] == "template")
        .collect();
    assert_eq!(templates.len(), RECIPIENTS, "one request per recipient");
    let mut seen = std::collections::HashSet::new();
    for sent in &templates {
        let to = sent.recipient().expect("to");
        assert!(seen.insert(to.to_owned()), "{to} twice");
        let n: usize = to[4..].parse().expect("numbered");
        let params = &sent.body["template"]["components"][0]["parameters"];
        assert_eq!(params[0]["text"], format!("Customer {n}"));
        assert_eq!(params[1]["text"], format!("code{n}"));
    }
    let times: Vec<_> = templates.iter().map(|r| r.at).collect();
    for (i, first) in times.iter().enumerate() {
        let within = times[i..]
            .iter()
            .take_while(|t| t.duration_since(*first) < Duration::from_secs(1))
            .count();
        assert!(within <= RATE, "{within} sends in one second");
    }
    // Behind the broadcast a reply would wait for its whole drain; going first, it waits for a
    // turn and a send slot. A quarter of the drain tells the two apart on a loaded machine.
    let drain = Duration::from_secs((RECIPIENTS / RATE) as u64);
    for (who, wrote) in written {
        let reply = received
            .iter()
            .find(|r| r.body["type"] == "text" && r.recipient() == Some(who.as_str()))
            .unwrap_or_else(|| panic!("{who} got no reply"));
        let waited = reply.at.duration_since(wrote);
        assert!(
            waited < drain / 4,
            "{who}'s reply waited {waited:?}, as if behind the broadcast's {drain:?}"
        );
    }
}

/// In sandbox mode (no access token) `sabi serve` runs a broadcast through every rule and
/// records each send instead of making it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_broadcast_runs_every_rule_and_records_its_sends() {
    use crate::helpers::{SabiProcess, json_lines};
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        dir.path().join("audience.csv"),
        "phone,name\n+2348031111111,Ada\nnope,Bola\n+2348032222222,Chi\n+2348033333333,Dayo\n",
    )
    .expect("written");
    let created = json_lines(
        dir.path(),
        &[
            "broadcast",
            "create",
            "--name",
            "Try it",
            "--template",
            "diwali_offer",
            "--language",
            "en",
            "--audience",
            "audience.csv",
            "--param",
            "name",
            "--from",
            "100000000000001",
            "--json",
        ],
    );
    let id = created[0]["id"].as_i64().expect("id").to_string();
    let _sabi = SabiProcess::start(dir.path());
    let shown = eventually_seen(
        "the broadcast finished",
        Duration::from_secs(20),
        || async {
            let shown = json_lines(dir.path(), &["broadcast", "show", &id, "--json"]);
            if shown[0]["state"] == "finished" {
                Ok(shown)
            } else {
                Err(format!("{shown:?}"))
            }
        },
    )
    .await;
    assert_eq!(shown[0]["counts"]["accepted"], 3, "{shown:?}");
    assert_eq!(shown[0]["counts"]["skipped"], 1, "{shown:?}");
    let sent = json_lines(
        dir.path(),
        &[
            "broadcast",
            "show",
            &id,
            "--recipients",
            "accepted",
            "--json",
        ],
    );
    assert_eq!(sent.len(), 4, "the broadcast and its three sends: {sent:?}");
    for r in &sent[1..] {
        assert!(
            r["wamid"]
                .as_str()
                .is_some_and(|w| w.starts_with("sandbox.")),
            "{r}"
        );
    }
    // `watch` of an ended broadcast draws its last state and returns.
    let watched = crate::helpers::sabi_command(dir.path())
        .args(["broadcast", "watch", &id])
        .output()
        .expect("sabi runs");
    assert!(watched.status.success());
    let line = String::from_utf8_lossy(&watched.stdout);
    assert!(
        line.contains("100% 3/4 sent") && line.contains("finished"),
        "{line}"
    );
}

/// A bare STOP after a reply that asked a question is taken for its answer, but once a broadcast
/// came after that reply it is the opt-out it usually is, confirmed at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bare_stop_after_a_broadcast_opts_out_even_when_a_question_came_before() {
    use sabi::config::Config;
    const QUESTION: &str = "Shall I keep retrying your transfer?";
    let sabi = Sending::start(Arc::new(crate::sender::Says(QUESTION.into())), &[]).await;
    let defaults = Config::defaults().expect("defaults").broadcast;
    let ada = "2348031111111";
    sabi.customer_writes("wamid.t1", ada, "my transfer is pending", 0)
        .await;
    assert_eq!(wait_for_texts(&sabi, ada, 1).await, [QUESTION]);

    let now = SystemClock.now();
    let (b, _) = sabi
        .store
        .create_broadcast(NewBroadcast {
            key: None,
            now,
            start_at: now,
            recipients: vec![NewRecipient {
                to: ada.to_owned(),
                params: vec!["Ada".into(), "10% off".into()],
                line: None,
                skipped: None,
                tz: None,
            }],
            ..broadcast(20)
        })
        .await
        .expect("kept");
    let ended = wait_for_state(&sabi, b.id, BroadcastState::Finished).await;
    assert_eq!(ended.counts.get("accepted"), Some(&1), "{ended:?}");

    sabi.customer_writes("wamid.t2", ada, "STOP", 0).await;
    let texts = wait_for_texts(&sabi, ada, 3).await;
    assert_eq!(
        texts[1..],
        ["diwali_offer", &defaults.stop_reply],
        "{texts:?}"
    );
    let out = sabi.store.opted_out(&[ada.to_owned()]).await.expect("read");
    assert!(out.contains(ada));
}

/// In sandbox too, what Meta would refuse on the day is refused before anything is kept: a
/// template name Meta does not allow, a language that is not one of its codes, a phone number
/// where the phone-number id goes, a rate of 0, and a start or deadline already past. A rate
/// above the number's pace is capped, saying so.
#[test]
fn a_broadcast_that_cannot_go_as_asked_is_refused_before_anything_is_kept() {
    use crate::helpers::{json_lines, sabi_command};
    let dir = tempfile::tempdir().expect("tempdir");
    let csv = dir.path().join("audience.csv");
    std::fs::write(&csv, "phone\n+2348031234567\n+2348037654321\n").expect("written");
    let audience = csv.to_str().expect("utf-8");
    let create = |changed: &[&str]| {
        let mut args = vec![
            "broadcast",
            "create",
            "--name",
            "Diwali",
            "--template",
            "diwali_offer",
            "--language",
            "en",
            "--from",
            "100000000000001",
            "--audience",
            audience,
        ];
        for pair in changed.chunks(2) {
            match args.iter().position(|a| *a == pair[0]) {
                Some(i) => args[i + 1] = pair[1],
                None => args.extend_from_slice(pair),
            }
        }
        sabi_command(dir.path())
            .args(&args)
            .output()
            .expect("sabi runs")
    };
    for (changed, says) in [
        (
            &["--template", ""][..],
            "--template: the template's name is empty",
        ),
        (&["--template", "Diwali Offer"], "like \"diwali_offer\""),
        (
            &["--language", "english"],
            "--language: \"english\" is not one of Meta's template language codes; English is en",
        ),
        (
            &["--from", "+234 803 000 0000"],
            "--from: \"+234 803 000 0000\" is a phone number; --from takes the phone-number id from WhatsApp Manager",
        ),
        (
            &["--rate", "0"],
            "--rate: 0 messages a second sends nothing",
        ),
        (
            &["--at", "2020-11-11T18:00:00Z"],
            "--at: the start (2020-11-11 18:00 UTC) was",
        ),
        (
            &["--until", "2020-11-12T18:00:00Z"],
            "--until: the deadline (2020-11-12 18:00 UTC) was",
        ),
    ] {
        let output = create(changed);
        let said = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{changed:?} was kept");
        assert!(said.contains(says), "{changed:?}: {said}");
    }
    assert!(
        json_lines(dir.path(), &["broadcast", "ls", "--json"]).is_empty(),
        "nothing kept"
    );

    let fast = create(&["--rate", "1000", "--dry-run", "--json"]);
    let dry: serde_json::Value = serde_json::from_slice(&fast.stdout).expect("json");
    assert_eq!(dry["rate"], 80, "the number's pace, whatsapp.outbound_rate");
    assert!(
        dry["notes"][0]
            .as_str()
            .is_some_and(|n| n.contains("1000 a second is above the number's pace")),
        "{dry}"
    );

    // Kept inside its quiet hours: `show` says they end, and when.
    let hour = 3_600_000;
    let now = SystemClock.now().millis();
    let this_hour = now / hour * hour;
    let h = this_hour / hour % 24;
    let quiet = format!("{h:02}:00-{:02}:00", (h + 2) % 24);
    let kept = create(&["--quiet-hours", &quiet, "--tz", "UTC", "--json", "--yes"]);
    assert!(
        kept.status.success(),
        "{}",
        String::from_utf8_lossy(&kept.stderr)
    );
    let kept: serde_json::Value = serde_json::from_slice(&kept.stdout).expect("json");
    let shown = json_lines(
        dir.path(),
        &["broadcast", "show", &kept["id"].to_string(), "--json"],
    );
    assert_eq!(shown[0]["waiting"]["reason"], "quiet_hours", "{shown:?}");
    assert_eq!(
        shown[0]["waiting"]["next_at"],
        this_hour + 2 * hour,
        "{shown:?}"
    );
}

/// Meta's messaging limit, told honestly: 1,200 customers at 250 a day take five days, and the
/// dry run says when the last goes. More than 1,000 customers are kept only when confirmed:
/// with no terminal to ask on, --yes does it. `watch --json` prints the broadcast as a JSON
/// line until it ends; `show` says why a scheduled one waits.
#[test]
fn a_large_broadcast_says_when_it_ends_and_is_kept_only_when_confirmed() {
    use crate::helpers::{json_lines, sabi_command};
    let dir = tempfile::tempdir().expect("tempdir");
    let csv = dir.path().join("audience.csv");
    let rows: String = (0..1_200).map(|n| format!("+234803{n:07}\n")).collect();
    std::fs::write(&csv, format!("phone\n{rows}")).expect("written");
    let args = |extra: &[&'static str]| -> Vec<String> {
        let mut args: Vec<String> = [
            "broadcast",
            "create",
            "--name",
            "Diwali",
            "--template",
            "diwali_offer",
            "--language",
            "en",
            "--from",
            "100000000000001",
            "--rate",
            "20",
            "--audience",
        ]
        .iter()
        .map(|a| (*a).to_owned())
        .collect();
        args.push(csv.to_str().expect("utf-8").to_owned());
        args.extend(extra.iter().map(|a| (*a).to_owned()));
        args
    };
    let run = |extra: &[&'static str]| {
        sabi_command(dir.path())
            .args(args(extra))
            .output()
            .expect("sabi runs")
    };

    let before = sabi::clock::SystemClock.now().millis();
    let dry = run(&["--dry-run", "--json"]);
    let dry: serde_json::Value = serde_json::from_slice(&dry.stdout).expect("json");
    assert_eq!(
        (dry["per_day"].as_u64(), dry["days"].as_u64()),
        (Some(250), Some(5)),
        "{dry}"
    );
    assert_eq!(dry["messaging_limit"]["source"], "setting", "{dry}");
    // The fifth day's 200 go at 20 a second: 10 s after four days.
    let last = before + 4 * 24 * 3_600_000 + 10_000;
    let finishes = dry["finishes_at"].as_i64().expect("finishes_at");
    assert!((last..last + 60_000).contains(&finishes), "{dry}");
    let text = run(&["--dry-run"]);
    let said = String::from_utf8_lossy(&text.stdout);
    let day = sabi::broadcast::checks::rfc3339(sabi::clock::At::from_millis(finishes));
    assert!(
        said.contains(&format!(
            "1,200 recipients at 250 customers a day (whatsapp.messaging_limit): 5 days, the last by {}",
            &day[..10]
        )),
        "{said}"
    );

    let unasked = run(&[]);
    assert!(!unasked.status.success());
    let said = String::from_utf8_lossy(&unasked.stderr);
    assert!(
        said.contains("goes to 1,200 customers") && said.contains("add --yes"),
        "{said}"
    );
    assert!(json_lines(dir.path(), &["broadcast", "ls", "--json"]).is_empty());

    let kept = run(&["--yes", "--json", "--at", "2099-01-01T09:00:00Z"]);
    assert!(
        kept.status.success(),
        "{}",
        String::from_utf8_lossy(&kept.stderr)
    );
    let kept: serde_json::Value = serde_json::from_slice(&kept.stdout).expect("json");
    let id = kept["id"].to_string();
    let shown = json_lines(dir.path(), &["broadcast", "show", &id, "--json"]);
    assert_eq!(shown[0]["waiting"]["reason"], "start", "{shown:?}");
    assert_eq!(
        shown[0]["waiting"]["next_at"], 4_070_941_200_000_i64,
        "{shown:?}"
    );

    json_lines(dir.path(), &["broadcast", "cancel", &id, "--json"]);
    let watched = json_lines(dir.path(), &["broadcast", "watch", &id, "--json"]);
    assert_eq!(watched.len(), 1, "an ended broadcast: one line, then done");
    assert_eq!(watched[0]["state"], "cancelled");
    assert_eq!(watched[0]["counts"]["cancelled"], 1_200);
    assert!(watched[0]["waiting"].is_null(), "{watched:?}");
}

/// The admin API refuses what the command line refuses, naming the field, and keeps nothing:
/// a past start or deadline, a language that is not Meta's code, a phone number as `from`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_api_refuses_a_broadcast_that_cannot_go_as_asked() {
    use serde_json::{Value, json};
    const ADMIN: &str = "admin-token-for-checks";
    let sabi = Sending::start(Arc::new(Parts(1)), &[("SABI_ADMIN_TOKEN", ADMIN)]).await;
    let create = |changed: Value| {
        let mut body = json!({
            "name": "Diwali eve", "template": {"name": "diwali_offer", "language": "en"},
            "from": "100000000000001", "recipients": [{"to": "2348031111111"}],
        });
        for (field, value) in changed.as_object().expect("fields") {
            body[field] = value.clone();
        }
        sabi.post_broadcast(ADMIN, body)
    };
    let past = SystemClock.now().millis() - 60_000;
    for (changed, says) in [
        (json!({"at": past}), "the start"),
        (
            json!({"until": "2020-11-11T18:00:00Z"}),
            "the deadline (2020-11-11 18:00 UTC) was",
        ),
        (
            json!({"template": {"name": "diwali_offer", "language": "english"}}),
            "English is en",
        ),
        (json!({"from": "+234 803 000 0000"}), "is a phone number"),
        (json!({"rate": 0}), "sends nothing"),
        // Nine o'clock on 2020-01-01 has passed on every clock.
        (
            json!({"at": "2020-01-01T09:00", "tz": "Africa/Lagos"}),
            "the start",
        ),
        (
            json!({"at": 300_000_000_000_000_i64}),
            "after the year 9999",
        ),
        (
            json!({"recipients": [{"to": "0803 111 1111"}]}),
            "every recipient is left out",
        ),
    ] {
        let (status, refused) = create(changed.clone()).await;
        assert_eq!(status, 422, "{changed}: {refused}");
        assert!(
            refused["message"]
                .as_str()
                .is_some_and(|m| m.contains(says)),
            "{changed}: {refused}"
        );
    }
    assert!(
        sabi.store.broadcasts(10).await.expect("listed").is_empty(),
        "nothing kept"
    );

    let (status, made) = create(json!({"rate": 500, "key": "diwali-2027"})).await;
    assert_eq!(status, 200, "{made}");
    assert_eq!(made["broadcast"]["rate"], 80, "{made}");
    assert!(
        made["notes"][0]
            .as_str()
            .is_some_and(|n| n.contains("whatsapp.outbound_rate")),
        "{made}"
    );
    // A retry with the key gets what was kept, even once what it asks could no longer be.
    let (status, again) = create(json!({"at": past, "key": "diwali-2027"})).await;
    assert_eq!(status, 200, "{again}");
    assert_eq!(again["created"], false, "{again}");
    assert_eq!(again["broadcast"]["id"], made["broadcast"]["id"], "{again}");
}
