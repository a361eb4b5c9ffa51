//! Tools: the business's own HTTP endpoints (balances, order status, ...), declared in
//! configuration, not code. The router's reply templates call them, and so does the agent.
//!
//! A tool is a method, a URL whose `{name}` placeholders are filled (URL-encoded) from the call's
//! arguments, headers whose `${VAR}` references are read from the environment once at start, and
//! a timeout. GET and DELETE send the arguments only through the URL; other methods also send
//! them as a JSON body. The answer must be JSON.

use std::collections::BTreeMap;
use std::time::Duration;

use reqwest::Method;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use serde::Deserialize;
use serde_json::{Map, Value};

/// One tool as configured.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct ToolConfig {
    pub name: String,
    /// What the tool does, for the agent.
    #[serde(default)]
    pub description: String,
    /// JSON-schema of the arguments, for the agent.
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
}

fn default_method() -> String {
    "GET".into()
}

fn default_timeout() -> Duration {
    Duration::from_secs(5)
}

/// Why a tool call gave no answer. The message is safe to show the agent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error("no tool named {0:?}")]
    Unknown(String),
    #[error("tool {tool}: argument {argument:?} is missing")]
    MissingArgument { tool: String, argument: String },
    #[error("tool {tool} failed: {reason}")]
    Failed { tool: String, reason: String },
}

/// A configuration error, naming the tool.
#[derive(Debug, thiserror::Error)]
#[error("tools: {0}")]
pub struct ConfigError(String);

struct Tool {
    config: ToolConfig,
    method: Method,
    headers: HeaderMap,
}

/// Every configured tool, sharing one HTTP client.
pub struct Tools {
    client: reqwest::Client,
    tools: Vec<Tool>,
}

impl Tools {
    /// Checks every tool and resolves its header variables from `env`.
    ///
    /// # Errors
    /// A bad method, URL or header, a duplicate name, or a `${VAR}` that `env` does not set.
    pub fn new(
        configs: &[ToolConfig],
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Tools, ConfigError> {
        let mut tools: Vec<Tool> = Vec::new();
        for config in configs {
            let name = &config.name;
            if tools.iter().any(|t| &t.config.name == name) {
                return Err(ConfigError(format!("tool {name:?} is declared twice")));
            }
            let method = Method::from_bytes(config.method.to_uppercase().as_bytes())
                .map_err(|_| ConfigError(format!("{name}: unknown method {:?}", config.method)))?;
            reqwest::Url::parse(&config.url.replace(['{', '}'], ""))
                .map_err(|e| ConfigError(format!("{name}: invalid url {:?}: {e}", config.url)))?;
            let mut headers = HeaderMap::new();
            for (key, value) in &config.headers {
                let value = expand(value, env).map_err(|var| {
                    ConfigError(format!(
                        "{name}: header {key} needs ${{{var}}}, which is not set"
                    ))
                })?;
                let key = HeaderName::from_bytes(key.as_bytes())
                    .map_err(|e| ConfigError(format!("{name}: header {key:?}: {e}")))?;
                let mut value = HeaderValue::from_str(&value)
                    .map_err(|e| ConfigError(format!("{name}: header {key}: {e}")))?;
                value.set_sensitive(true);
                headers.insert(key, value);
            }
            tools.push(Tool {
                config: config.clone(),
                method,
                headers,
            });
        }
        Ok(Tools {
            client: reqwest::Client::new(),
            tools,
        })
    }

    /// The tools as an OpenAI-compatible model is offered them.
    pub fn definitions(&self) -> Vec<Value> {
        self.tools
            .iter()
            .map(|t| {
                let parameters = t
                    .config
                    .parameters
                    .clone()
                    .unwrap_or_else(|| serde_json::json!({"type": "object", "properties": {}}));
                serde_json::json!({"type": "function", "function": {
                    "name": t.config.name,
                    "description": t.config.description,
                    "parameters": parameters,
                }})
            })
            .collect()
    }

    /// Calls `name` with `arguments` and returns its JSON answer.
    ///
    /// # Errors
    /// An unknown tool, an argument the URL needs and the call lacks, or a failed call
    /// (connection, timeout, non-2xx status, an answer that is not JSON).
    pub async fn call(&self, name: &str, arguments: &Map<String, Value>) -> Result<Value, Error> {
        let tool = self
            .tools
            .iter()
            .find(|t| t.config.name == name)
            .ok_or_else(|| Error::Unknown(name.to_owned()))?;
        let url =
            fill_url(&tool.config.url, arguments).map_err(|argument| Error::MissingArgument {
                tool: name.to_owned(),
                argument,
            })?;
        let failed = |reason: String| Error::Failed {
            tool: name.to_owned(),
            reason,
        };
        let mut request = self
            .client
            .request(tool.method.clone(), &url)
            .headers(tool.headers.clone())
            .timeout(tool.config.timeout);
        if tool.method != Method::GET && tool.method != Method::DELETE {
            request = request.json(arguments);
        }
        let response = request.send().await.map_err(|e| failed(describe(e)))?;
        let status = response.status();
        if !status.is_success() {
            return Err(failed(format!("HTTP {}", status.as_u16())));
        }
        response
            .json()
            .await
            .map_err(|e| failed(format!("the answer is not JSON: {}", describe(e))))
    }
}

/// A failed call, without the URL: it may carry customer data in its query.
fn describe(e: reqwest::Error) -> String {
    if e.is_timeout() {
        "timed out".into()
    } else if e.is_connect() {
        "could not connect".into()
    } else {
        e.without_url().to_string()
    }
}

/// `${VAR}` references replaced from `env`; the missing variable's name otherwise.
fn expand(value: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<String, String> {
    let mut out = String::with_capacity(value.len());
    let mut rest = value;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let Some(end) = after.find('}') else {
            out.push_str(&rest[start..]);
            return Ok(out);
        };
        let var = &after[..end];
        out.push_str(&env(var).ok_or_else(|| var.to_owned())?);
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// `{name}` placeholders filled from `arguments`, URL-encoded; the missing argument otherwise.
fn fill_url(template: &str, arguments: &Map<String, Value>) -> Result<String, String> {
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(start) = rest.find('{') {
        out.push_str(&rest[..start]);
        let after = &rest[start + 1..];
        let Some(end) = after.find('}') else {
            out.push_str(&rest[start..]);
            return Ok(out);
        };
        let name = &after[..end];
        let value = match arguments.get(name) {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Null) | None => return Err(name.to_owned()),
            Some(other) => other.to_string(),
        };
        // `.` and `..` survive encoding and would walk the tool's URL path.
        if value.is_empty() || value.chars().all(|c| c == '.') {
            return Err(name.to_owned());
        }
        out.extend(url_encode(&value));
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

fn url_encode(value: &str) -> impl Iterator<Item = String> + '_ {
    value.bytes().map(|b| match b {
        b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
            (b as char).to_string()
        }
        _ => format!("%{b:02X}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_filled_and_encoded() {
        let args: Map<String, Value> =
            serde_json::from_str(r#"{"customer": "234 80+1", "n": 5}"#).expect("json");
        assert_eq!(
            fill_url("http://x/b?c={customer}&n={n}", &args).as_deref(),
            Ok("http://x/b?c=234%2080%2B1&n=5")
        );
        assert_eq!(
            fill_url("http://x/{missing}", &args),
            Err("missing".to_owned())
        );
    }

    #[test]
    fn header_variables_come_from_the_environment() {
        let env = |v: &str| (v == "TOKEN").then(|| "s3cret".to_owned());
        assert_eq!(
            expand("Bearer ${TOKEN}", &env).as_deref(),
            Ok("Bearer s3cret")
        );
        assert_eq!(expand("${NOPE}", &env), Err("NOPE".to_owned()));
    }
}
