//! What WhatsApp costs, as a business reads it: Meta's priced statuses posted to a running
//! `sabi serve` are counted once each in `/metrics`, and `sabi stats` prices them at
//! `whatsapp.prices`, or says which prices are missing instead of a partial sum.

use std::path::Path;

use serde_json::Value;

use crate::helpers::{SabiProcess, sabi_command, webhook_request};

/// Statuses of three messages, priced as Meta prices them in 2026 (from the 2026 corpus,
/// `tests/data/webhooks-2026/05_statuses_pmp_pricing_bsuid_wire.json`): a charged utility
/// message to a Nigerian number, a free service reply to a customer known by a BSUID alone, a
/// free marketing message from an ad's entry point.
const PRICED: &str = include_str!("../data/webhooks-2026/05_statuses_pmp_pricing_bsuid_wire.json");

/// A charged marketing message to a British number, which the prices below do not cover.
const UNPRICED: &str = r#"{"object":"whatsapp_business_account","entry":[{"id":"240011223344556","changes":[{"field":"messages","value":{"messaging_product":"whatsapp","metadata":{"display_phone_number":"2347000000001","phone_number_id":"118822334455667"},"statuses":[{"id":"wamid.OUT04","status":"delivered","timestamp":"1781100500","recipient_id":"447700900123","pricing":{"pricing_model":"PMP","category":"marketing","type":"regular"}}]}}]}]}"#;

const CONFIG: &str = "[whatsapp.prices]\nutility = { \"234\" = 0.0067 }\n\
                      [broadcast]\nprices = { \"234\" = 0.0516 }\ncurrency = \"USD\"\n";

fn stats(dir: &Path, config: &str) -> Value {
    let output = sabi_command(dir)
        .env("SABI_CONFIG", config)
        .args(["stats", "--json"])
        .output()
        .expect("sabi stats runs");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice::<Value>(&output.stdout).expect("one JSON object")["whatsapp"].clone()
}

async fn post(sabi: &SabiProcess, client: &reqwest::Client, body: &str) {
    let response = webhook_request(client, &sabi.url(""), body.as_bytes().to_vec())
        .send()
        .await
        .expect("posted");
    assert_eq!(response.status(), 200);
}

#[tokio::test]
async fn priced_statuses_are_counted_once_and_stats_price_them_or_say_what_is_missing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("sabi.toml");
    std::fs::write(&config, CONFIG).expect("config");
    let config = config.to_str().expect("utf-8 path").to_owned();
    let sabi = SabiProcess::start_with(dir.path(), &[("SABI_CONFIG", config.as_str())]);
    let client = reqwest::Client::new();
    // Meta redelivers: each message is still counted once.
    post(&sabi, &client, PRICED).await;
    post(&sabi, &client, PRICED).await;
    let metrics = client
        .get(sabi.url("/metrics"))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    for sample in [
        r#"sabi_whatsapp_priced_total{category="utility",type="regular"} 1"#,
        r#"sabi_whatsapp_priced_total{category="service",type="free_customer_service"} 1"#,
        r#"sabi_whatsapp_priced_total{category="marketing_lite",type="free_entry_point"} 1"#,
    ] {
        assert!(metrics.contains(sample), "{sample} in {metrics}");
    }
    let bill = stats(dir.path(), &config);
    assert_eq!(
        (bill["billed"].as_u64(), bill["free"].as_u64()),
        (Some(1), Some(2)),
        "{bill}"
    );
    assert_eq!(bill["cost"].as_f64(), Some(0.0067), "{bill}");
    assert_eq!(bill["currency"], "USD");
    assert_eq!(
        bill["by_category"]["utility"]["cost"].as_f64(),
        Some(0.0067)
    );
    assert_eq!(bill["by_category"]["service"]["free"], 1);

    post(&sabi, &client, UNPRICED).await;
    let bill = stats(dir.path(), &config);
    assert_eq!(bill["cost"], Value::Null, "never a partial sum: {bill}");
    assert_eq!(bill["unpriced"]["messages"], 1);
    assert_eq!(
        bill["unpriced"]["missing"],
        serde_json::json!(["marketing 4477"])
    );
    assert_eq!(
        bill["by_category"]["utility"]["cost"].as_f64(),
        Some(0.0067)
    );
    let text = sabi_command(dir.path())
        .env("SABI_CONFIG", &config)
        .arg("stats")
        .output()
        .expect("sabi stats runs");
    let text = String::from_utf8(text.stdout).expect("utf-8");
    assert!(
        text.contains("whatsapp     2 billed, 2 free; cost unknown: 1 billed message(s) have no price in whatsapp.prices (marketing 4477)"),
        "{text}"
    );
}
