//! Every corpus webhook, signed as Meta signed it, posted to a running `sabi serve`; what
//! `sabi inbox --json` then prints must carry every fact of the manifest.
//!
//! `SABI_WEBHOOK_CORPUS` points the first test at another corpus of the same layout; the
//! second reads the 2026 corpus (tests/data/webhooks-2026): owner echoes, BSUIDs without a
//! number, a changed BSUID, per-message pricing, the app's history and state sync.

use serde_json::Value;

use crate::helpers::{SabiProcess, corpus_dir, inbox_json};

/// The secret the corpus manifest's signatures were made with.
const CORPUS_SECRET: &str = "wa-corpus-test-app-secret";

struct Case {
    file: String,
    body: Vec<u8>,
    signature: String,
    items: Vec<Value>,
}

fn cases(dir: &std::path::Path) -> Vec<Case> {
    let manifest = std::fs::read_to_string(dir.join("expected.jsonl"))
        .unwrap_or_else(|e| panic!("reading {}/expected.jsonl: {e}", dir.display()));
    manifest
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|line| {
            let entry: Value = serde_json::from_str(line).expect("manifest line");
            let file = entry["file"].as_str().expect("file").to_owned();
            let body = std::fs::read(dir.join(&file)).expect("corpus file");
            assert_eq!(
                entry["expect"], "ack-200",
                "{file}: only ack-200 cases are known"
            );
            Case {
                signature: entry["x_hub_signature_256"]
                    .as_str()
                    .expect("signature")
                    .to_owned(),
                items: entry["items"].as_array().expect("items").clone(),
                file,
                body,
            }
        })
        .collect()
}

#[tokio::test]
async fn every_corpus_file_is_acknowledged_and_its_facts_stored() {
    every_file_acknowledged_and_its_facts_stored(&corpus_dir()).await;
}

#[tokio::test]
async fn every_2026_corpus_file_is_acknowledged_and_its_facts_stored() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/webhooks-2026");
    every_file_acknowledged_and_its_facts_stored(&dir).await;
}

async fn every_file_acknowledged_and_its_facts_stored(dir: &std::path::Path) {
    let cases = cases(dir);
    assert!(!cases.is_empty());
    let dir = tempfile::tempdir().expect("tempdir");
    let sabi = SabiProcess::start_with(dir.path(), &[("SABI_WHATSAPP_APP_SECRET", CORPUS_SECRET)]);
    let client = reqwest::Client::new();
    // Twice: Meta redelivers, and a redelivery must change nothing.
    for round in 0..2 {
        for case in &cases {
            let response = client
                .post(sabi.url("/webhook/whatsapp"))
                .header("content-type", "application/json")
                .header("x-hub-signature-256", &case.signature)
                .body(case.body.clone())
                .send()
                .await
                .expect("posted");
            assert_eq!(response.status(), 200, "{} (round {round})", case.file);
        }
    }
    let stored = inbox_json(dir.path());
    let expected: Vec<(&str, &Value)> = cases
        .iter()
        .flat_map(|c| c.items.iter().map(move |item| (c.file.as_str(), item)))
        .collect();
    assert_eq!(
        stored.len(),
        expected.len(),
        "one stored item per manifest item"
    );
    for ((file, want), got) in expected.iter().zip(&stored) {
        for (key, value) in want.as_object().expect("item object") {
            assert_eq!(
                got.get(key),
                Some(value),
                "{file}: key {key:?}\n  want {want}\n  got  {got}"
            );
        }
    }
}
