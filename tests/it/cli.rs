//! The `sabi` binary as an operator uses it: `send` to a running server, a clean stop on
//! SIGTERM, and a bad setting stopping start-up with its name.

use std::process::Command;
use std::time::{Duration, Instant};

use crate::helpers::{SabiProcess, inbox_json, sabi_command};

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
    let mut child = sabi_command(dir.path())
        .args(["serve"])
        .env("SABI_LISTEN", "127.0.0.1:0")
        .spawn()
        .expect("sabi serve starts");
    std::thread::sleep(Duration::from_millis(500));
    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(killed.success());
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            assert!(status.success(), "exit status {status}");
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "sabi serve did not stop on SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
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
