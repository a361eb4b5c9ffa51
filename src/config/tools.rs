//! The agent's tools as configured: one HTTP endpoint each.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;

/// One tool as configured.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct ToolConfig {
    pub name: String,
    /// What the tool does, for the agent.
    #[serde(default)]
    pub description: String,
    /// JSON-schema of the arguments: offered to the agent (without `customer`), and every call
    /// is checked against it.
    #[serde(default)]
    pub parameters: Option<Value>,
    #[serde(default = "default_method")]
    pub method: String,
    /// `https://api.example/balance?customer={customer}`
    pub url: String,
    /// Header values may name environment variables: `Bearer ${BANK_API_TOKEN}`.
    #[serde(default)]
    #[serde(skip_serializing)]
    pub headers: BTreeMap<String, String>,
    #[serde(default = "default_timeout", with = "crate::config::duration")]
    pub timeout: Duration,
    /// Offered to anonymous web visitors too (opening hours, a branch finder): only for tools
    /// that reveal nothing about a customer.
    #[serde(default)]
    pub public: bool,
}

fn default_method() -> String {
    "GET".into()
}

fn default_timeout() -> Duration {
    Duration::from_secs(5)
}
