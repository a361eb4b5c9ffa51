//! `sabi check`: is this configuration ready to run? It looks at the store (without creating or
//! migrating it), and reaches the Graph API and the LLM with the configured credentials, saying
//! what is wrong in plain words.

use std::time::Duration;

use secrecy::{ExposeSecret, SecretString};

use crate::config::Config;
use crate::store;

/// How one check went.
pub struct Finding {
    pub what: &'static str,
    pub ok: bool,
    pub says: String,
}

fn finding(what: &'static str, ok: bool, says: impl Into<String>) -> Finding {
    Finding {
        what,
        ok,
        says: says.into(),
    }
}

/// Every check, in order. The configuration itself was valid, or `config` would not exist.
pub async fn run(config: &Config) -> Vec<Finding> {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap_or_default();
    let mut findings = vec![finding("configuration", true, "valid")];
    findings.push(check_store(config).await);
    findings.push(check_graph(config, &http).await);
    findings.push(check_llm(config, &http).await);
    findings
}

/// Looks without touching: a check against a live store never creates or migrates it.
async fn check_store(config: &Config) -> Finding {
    match store::probe(&config.store).await {
        Ok(says) => finding("store", true, says),
        Err(e) => finding("store", false, e.to_string()),
    }
}

async fn check_graph(config: &Config, http: &reqwest::Client) -> Finding {
    let whatsapp = &config.whatsapp;
    let Some(token) = &whatsapp.access_token else {
        return finding(
            "Graph API",
            true,
            "sandbox mode (no access token): replies are kept, never sent",
        );
    };
    let url = format!("{}/me", whatsapp.graph_base());
    match get(http, &url, Some(token)).await {
        Ok(200) => finding(
            "Graph API",
            true,
            format!("{url}: the access token is accepted"),
        ),
        Ok(401) => finding(
            "Graph API",
            false,
            format!("{url}: the access token is refused (expired or revoked?)"),
        ),
        Ok(status) => finding(
            "Graph API",
            false,
            format!("{url} answered HTTP {status}: check whatsapp.api_base and the token"),
        ),
        Err(e) => finding("Graph API", false, format!("{url} cannot be reached: {e}")),
    }
}

async fn check_llm(config: &Config, http: &reqwest::Client) -> Finding {
    let llm = &config.llm;
    let Some(base) = &llm.base_url else {
        return finding(
            "LLM",
            true,
            "no agent configured: the router answers what it can, an acknowledgement the rest",
        );
    };
    let url = format!("{}/models", base.trim_end_matches('/'));
    match get(http, &url, llm.api_key.as_ref()).await {
        Ok(200) => finding(
            "LLM",
            true,
            format!("{url}: reachable, the key is accepted"),
        ),
        Ok(401 | 403) => finding("LLM", false, format!("{url}: the API key is refused")),
        Ok(404) => finding(
            "LLM",
            false,
            format!("{url} answered 404: does llm.base_url end with its API version (like /v1)?"),
        ),
        Ok(status) => finding("LLM", false, format!("{url} answered HTTP {status}")),
        Err(e) => finding("LLM", false, format!("{url} cannot be reached: {e}")),
    }
}

async fn get(
    http: &reqwest::Client,
    url: &str,
    token: Option<&SecretString>,
) -> Result<u16, reqwest::Error> {
    let mut request = http.get(url);
    if let Some(token) = token {
        request = request.bearer_auth(token.expose_secret());
    }
    Ok(request.send().await?.status().as_u16())
}
