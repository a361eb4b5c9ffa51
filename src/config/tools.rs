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

/// The tools with every string in their `parameters` schemas bounded: a string with no
/// `maxLength` of its own gets `max_chars`, so the model is offered the bound and a call with a
/// longer argument is refused before any request.
pub fn bounded_strings(tools: &[ToolConfig], max_chars: usize) -> Vec<ToolConfig> {
    tools
        .iter()
        .cloned()
        .map(|mut tool| {
            if let Some(schema) = &mut tool.parameters {
                bound(schema, max_chars);
            }
            tool
        })
        .collect()
}

fn bound(schema: &mut Value, max_chars: usize) {
    match schema {
        Value::Object(fields) => {
            let string = match fields.get("type") {
                Some(Value::String(kind)) => kind == "string",
                Some(Value::Array(kinds)) => kinds.iter().any(|k| k == "string"),
                _ => false,
            };
            if string && !fields.contains_key("maxLength") && !fields.contains_key("enum") {
                fields.insert("maxLength".into(), Value::from(max_chars));
            }
            fields.values_mut().for_each(|v| bound(v, max_chars));
        }
        Value::Array(items) => items.iter_mut().for_each(|v| bound(v, max_chars)),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_without_a_bound_get_one_and_others_keep_theirs() {
        let tool: ToolConfig = toml::from_str(
            r#"
            name = "t"
            url = "https://api.example/x"
            parameters = { type = "object", properties = { a = { type = "string" }, b = { type = "string", maxLength = 10 }, c = { type = "array", items = { type = ["string", "null"] } }, d = { type = "integer" } } }
            "#,
        )
        .expect("tool");
        let bounded = bounded_strings(&[tool], 1000);
        let props = &bounded[0].parameters.as_ref().expect("schema")["properties"];
        assert_eq!(props["a"]["maxLength"], 1000);
        assert_eq!(props["b"]["maxLength"], 10);
        assert_eq!(props["c"]["items"]["maxLength"], 1000);
        assert!(props["d"].get("maxLength").is_none());
    }
}
