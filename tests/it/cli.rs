//! The `sabi` binary as an operator uses it: `send` to a running server, a clean stop on
//! SIGTERM, a bad setting stopping start-up with its name, `check`, `config`, settling a
//! review item from the shell, output piped into a reader that stops early (`| head`), and
//! an audience file as a spreadsheet exports it.

use std::time::Duration;

use crate::helpers::{
    START_MS, SabiProcess, TestApp, inbox_json, json_lines, sabi_command, text_webhook_at,
};

#[test]
fn send_posts_a_signed_webhook_that_is_stored_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sabi = SabiProcess::start(dir.path());
    let url = sabi.url("/webhook/whatsapp");
    for _ in 0..2 {
        let output = sabi_command(dir.path())
            .args([
                "send",
                "Abeg, wetin be my balance? 🙏",
                "--id",
                "wamid.cli-1",
                "--url",
                &url,
            ])
            .output()
            .expect("sabi send runs");
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(String::from_utf8_lossy(&output.stdout).starts_with("200 wamid.cli-1"));
    }
    let inbox = inbox_json(dir.path());
    assert_eq!(inbox.len(), 1, "sent twice, stored once");
    assert_eq!(inbox[0]["text"], "Abeg, wetin be my balance? 🙏");
    assert_eq!(inbox[0]["external_id"], "wamid.cli-1");
}

#[test]
fn sigterm_stops_the_server_cleanly() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Started is listening: the signal comes to a server that is up, not one still starting.
    SabiProcess::start(dir.path()).terminate();
}

#[test]
fn a_bad_setting_stops_start_up_naming_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let output = sabi_command(dir.path())
        .args(["serve"])
        .env("SABI_BATCH_WINDOW", "soon")
        .output()
        .expect("sabi serve runs");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("SABI_BATCH_WINDOW") && stderr.contains("soon"),
        "{stderr}"
    );
}

/// `sabi` run off the async threads, its exit status and stdout.
async fn sabi_output(dir: &std::path::Path, args: &[&str], env: &[(&str, &str)]) -> (bool, String) {
    let mut command = sabi_command(dir);
    command.args(args);
    for (k, v) in env {
        command.env(k, v);
    }
    let output = tokio::task::spawn_blocking(move || command.output())
        .await
        .expect("joined")
        .expect("sabi runs");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
    )
}

#[tokio::test]
async fn check_reaches_the_store_the_graph_api_and_the_llm() {
    let graph = sabi::testing::graph::FakeGraph::start("check-token").await;
    let llm = sabi::testing::llm::FakeLlm::start().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let (graph_base, llm_base) = (graph.base_url(), llm.base_url());
    let env = [
        ("SABI_WHATSAPP_ACCESS_TOKEN", "check-token"),
        ("SABI_WHATSAPP_API_BASE", graph_base.as_str()),
        ("SABI_LLM_BASE_URL", llm_base.as_str()),
        ("SABI_LLM_MODEL", "fake-model"),
    ];
    // A check never creates the store: none yet is a failure, said plainly.
    let (ok, out) = sabi_output(dir.path(), &["check"], &env).await;
    assert!(!ok && out.contains("no database at"), "{out}");
    assert!(
        !dir.path().join("sabi.db").exists(),
        "the check created nothing"
    );
    sabi_output(dir.path(), &["inbox"], &env).await; // opens (creates) the store
    let (ok, out) = sabi_output(dir.path(), &["check"], &env).await;
    assert!(ok, "{out}");
    assert!(
        out.contains("store") && out.contains("the access token is accepted"),
        "{out}"
    );
    assert!(out.contains("the key is accepted"), "{out}");

    graph.expire_token();
    let (ok, out) = sabi_output(dir.path(), &["check"], &env).await;
    assert!(!ok);
    assert!(
        out.contains("FAIL") && out.contains("the access token is refused"),
        "{out}"
    );

    let unreachable = [
        ("SABI_LLM_BASE_URL", "http://127.0.0.1:9/v1"),
        ("SABI_LLM_MODEL", "m"),
    ];
    let (ok, out) = sabi_output(dir.path(), &["check"], &unreachable).await;
    assert!(!ok);
    assert!(out.contains("cannot be reached"), "{out}");
}

#[tokio::test]
async fn check_loads_the_intents_file_and_names_pattern_words_that_never_match() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (_, out) = sabi_output(dir.path(), &["check"], &[]).await;
    let line = |out: &str| {
        out.lines()
            .find(|l| l.starts_with("router"))
            .map(str::to_owned)
            .unwrap_or_else(|| panic!("no router line:\n{out}"))
    };
    assert!(
        line(&out).contains("ok") && line(&out).contains("intents loaded"),
        "{out}"
    );

    // "abeg" is read as "please" before any pattern runs: the pattern can never match.
    let intents = dir.path().join("intents.toml");
    std::fs::write(
        &intents,
        "[lexicon]\nplease = [\"abeg\"]\n\n[[intent]]\nname = \"hours\"\naction = \"reply\"\n\
         reply = \"9 to 5.\"\npatterns = ['^abeg when do you open']\n",
    )
    .expect("writes");
    let file = intents.to_string_lossy().into_owned();
    let (ok, out) = sabi_output(dir.path(), &["check"], &[("SABI_INTENTS_FILE", &file)]).await;
    assert!(!ok);
    assert!(line(&out).contains("FAIL"), "{out}");
    assert!(
        out.contains("line 8: hours.patterns: \"abeg\" is read as \"please\""),
        "{out}"
    );

    std::fs::write(
        &intents,
        "[[intent]]\nname = \"hours\"\naction = \"shout\"\n",
    )
    .expect("writes");
    let (ok, out) = sabi_output(dir.path(), &["check"], &[("SABI_INTENTS_FILE", &file)]).await;
    assert!(!ok);
    assert!(
        line(&out).contains("FAIL") && out.contains("the intents file"),
        "{out}"
    );
}

#[tokio::test]
async fn config_prints_the_example_and_the_effective_settings_without_secrets() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (ok, example) = sabi_output(dir.path(), &["config", "--example"], &[]).await;
    assert!(ok);
    assert!(example.contains("[whatsapp]") && example.contains("batch_window = \"20s\""));
    assert!(
        example.contains("#[[tools]]"),
        "optional tables shown commented out"
    );
    let (ok, effective) = sabi_output(
        dir.path(),
        &["config"],
        &[
            ("SABI_BATCH_WINDOW", "5s"),
            ("SABI_ADMIN_TOKEN", "do-not-print-this-token"),
        ],
    )
    .await;
    assert!(ok);
    assert!(effective.contains("batch_window = \"5s\""), "{effective}");
    assert!(
        !effective.contains("do-not-print-this-token")
            && !effective.contains(crate::helpers::SECRET)
    );
}

/// `sabi review reply` from a shell: a configuration without an access token could not send a
/// WhatsApp reply, so the command refuses and the item stays open, unless `--sandbox` asks to
/// keep the reply; with a token the reply is queued for the sender.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn review_reply_from_the_shell_refuses_to_strand_a_reply_in_sandbox() {
    let app = TestApp::spawn().await;
    let an_hour_ago = START_MS / 1000 - 3600;
    for (id, from) in [
        ("wamid.old1", "2348000000001"),
        ("wamid.old2", "2348000000002"),
    ] {
        let body = text_webhook_at(id, from, "hello?", an_hour_ago);
        assert_eq!(app.post_whatsapp_webhook(body).await.status(), 200);
    }
    app.clock.advance(Duration::from_secs(60));
    app.scheduler.drain().await.expect("drain");
    let open = || async {
        app.store
            .review_queue(sabi::store::ReviewQuery::default())
            .await
            .expect("review")
    };
    let items = open().await;
    assert_eq!(items.len(), 2, "too old for an automatic reply");

    let reply = |id: i64, extra: &[&str], token: Option<&str>| {
        let mut command = sabi_command(app.dir.path());
        command.args(["review", "reply", &id.to_string(), "A person answers"]);
        command.args(extra);
        if let Some(token) = token {
            command.env("SABI_WHATSAPP_ACCESS_TOKEN", token);
        }
        command.output().expect("sabi runs")
    };
    let refused = reply(items[0].id, &[], None);
    assert!(!refused.status.success());
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(said.contains("never sent"), "{said}");
    assert_eq!(open().await.len(), 2, "the item is still open");

    assert!(reply(items[0].id, &["--sandbox"], None).status.success());
    assert!(reply(items[1].id, &[], Some("a-token")).status.success());
    assert!(open().await.is_empty());
    let outbox = app.store.outbox(None).await.expect("outbox");
    let state_of = |customer: &str| {
        outbox
            .iter()
            .find(|o| o.conversation.customer == customer && o.text == "A person answers")
            .map(|o| o.state.to_string())
    };
    assert_eq!(
        state_of(&items[0].conversation.customer).as_deref(),
        Some("sandbox")
    );
    assert_eq!(
        state_of(&items[1].conversation.customer).as_deref(),
        Some("queued")
    );
}

/// `sabi` with its stdout a pipe whose reader is already gone, as in `sabi inbox | head` once
/// `head` has read its lines. Called inside a runtime: the pipe is tokio's.
fn with_closed_stdout(dir: &std::path::Path, args: &[&str]) -> std::process::Output {
    let (writer, reader) = tokio::net::unix::pipe::pipe().expect("a pipe");
    drop(reader);
    let writer = writer.into_blocking_fd().expect("the pipe's write end");
    sabi_command(dir)
        .args(args)
        .stdout(writer)
        .output()
        .expect("sabi runs")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_stdout_ends_every_command_quietly_and_with_success() {
    let app = TestApp::spawn().await;
    // Something to list: an old message handed to people, a broadcast with queued recipients.
    let body = text_webhook_at(
        "wamid.pipe",
        "2348031234567",
        "hello?",
        START_MS / 1000 - 3600,
    );
    assert_eq!(app.post_whatsapp_webhook(body).await.status(), 200);
    app.clock.advance(Duration::from_secs(60));
    app.scheduler.drain().await.expect("drain");
    let dir = app.dir.path();
    let audience = dir.join("audience.csv");
    std::fs::write(
        &audience,
        "phone,name\n+2348031234567,Ada\n+2348039999999,Bola\n",
    )
    .expect("written");
    let created = json_lines(
        dir,
        &[
            "broadcast",
            "create",
            "--name",
            "Diwali",
            "--template",
            "diwali_offer",
            "--language",
            "en",
            "--param",
            "name",
            "--from",
            "100000000000001",
            "--audience",
            audience.to_str().expect("utf-8"),
            "--json",
        ],
    );
    let id = created[0]["id"].to_string();
    for args in [
        &["broadcast", "show", &id, "--recipients", "queued"][..],
        &["broadcast", "ls"],
        &["inbox"],
        &["inbox", "--json"],
        &["review"],
        &["review", "--json"],
        &["export", "2348031234567"],
        &["export", "2348031234567", "--json"],
        &["config", "--example"],
        &["route", "hello"],
    ] {
        let output = with_closed_stdout(dir, args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "sabi {args:?}: {stderr}");
        assert!(
            !stderr.contains("panicked") && !stderr.contains("Broken pipe"),
            "sabi {args:?}: {stderr}"
        );
    }
}

#[test]
fn an_audience_file_as_a_spreadsheet_exports_it_makes_a_broadcast() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).expect("written");
        path.to_str().expect("utf-8").to_owned()
    };
    // A European spreadsheet's export: a byte-order mark, ';', CRLF, local numbers.
    let exported = file(
        "exported.csv",
        "\u{feff}Phone Number;First Name;Offer\r\n0803 123 4567;Ada;10%\r\n0803 999 9999;Bola;5%\r\n\r\n",
    );
    let renamed = file(
        "renamed.csv",
        "first name;offer;number\nAda;10%;08031234567\n",
    );
    let dry_run = |audience: &str, extra: &[&str]| {
        sabi_command(dir.path())
            .env("SABI_DEFAULT_COUNTRY", "234")
            .args(["broadcast", "create", "--name", "Diwali", "--template"])
            .args([
                "diwali_offer",
                "--language",
                "en",
                "--from",
                "100000000000001",
            ])
            .args([
                "--audience",
                audience,
                "--param",
                "first_name",
                "--dry-run",
                "--json",
            ])
            .args(extra)
            .output()
            .expect("sabi runs")
    };
    let sent = |output: std::process::Output| {
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let plan: serde_json::Value =
            serde_json::from_slice(&output.stdout).expect("one JSON document");
        plan["to_send"].clone()
    };
    assert_eq!(sent(dry_run(&exported, &[])), 2);

    let refused = dry_run(&renamed, &[]);
    assert!(!refused.status.success());
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(
        said.contains("no phone column among first name, offer, number (separated by ';')")
            && said.contains("--phone-column"),
        "{said}"
    );
    assert_eq!(sent(dry_run(&renamed, &["--phone-column", "Number"])), 1);
}

#[test]
fn local_numbers_without_a_country_are_named_and_nothing_is_kept() {
    let dir = tempfile::tempdir().expect("tempdir");
    let audience = dir.path().join("local.csv");
    let rows: String = (0..30).map(|n| format!("0803 123 {n:04}\n")).collect();
    std::fs::write(&audience, format!("phone\n{rows}")).expect("written");
    let create = |extra: &[&str]| {
        sabi_command(dir.path())
            .args(["broadcast", "create", "--name", "Diwali", "--template"])
            .args([
                "diwali_offer",
                "--language",
                "en",
                "--from",
                "100000000000001",
            ])
            .arg("--audience")
            .arg(&audience)
            .args(extra)
            .output()
            .expect("sabi runs")
    };
    let dry = create(&["--dry-run"]);
    assert!(dry.status.success());
    let said = String::from_utf8_lossy(&dry.stdout);
    assert!(said.contains("nobody would get it"), "{said}");
    assert!(
        said.contains("is a local number: give its country with --country"),
        "{said}"
    );
    assert_eq!(said.matches("left out, line").count(), 10, "{said}");
    assert!(
        said.contains("... and 20 more left out (20 invalid)"),
        "{said}"
    );

    let kept = create(&[]);
    assert!(!kept.status.success());
    let said = String::from_utf8_lossy(&kept.stderr);
    assert!(
        said.contains("not kept: every one of the 30 rows is left out"),
        "{said}"
    );
    let listed = sabi_command(dir.path())
        .args(["broadcast", "ls"])
        .output()
        .expect("sabi runs");
    assert!(listed.stdout.is_empty(), "nothing was kept");
}
