//! Tools: the business's own HTTP endpoints (balances, order status, ...), declared in
//! configuration, not code. The router's reply templates call them, and so does the agent.
//!
//! A tool is a method, a URL whose `{name}` placeholders are filled (URL-encoded) from the call's
//! arguments, headers whose `${VAR}` references are read from the environment once at start, and
//! a timeout. GET and DELETE send the arguments only through the URL; other methods also send
//! them as a JSON body. The answer must be JSON.
//!
//! Tools act for the person a turn answers, never for whoever a model or a message names:
//! - a parameter or placeholder named `customer` is filled by Sabi with the conversation's
//!   verified identity ([`Identity`]) and is never offered to the model; a tool that needs one
//!   in a conversation nobody vouched for is not called;
//! - arguments are checked against the tool's `parameters` schema before any request, and only
//!   declared arguments (schema properties and URL placeholders) ever leave;
//! - anonymous web visitors are offered only tools marked `public`;
//! - every request says who it acts for in `X-Sabi-Customer` (percent-encoded: only visible
//!   ASCII goes in a header) and carries a fresh `X-Sabi-Request-Id`; with a tools secret both
//!   are signed with the rest of the request, so the business's API can check that an account
//!   belongs to that customer and refuse a request it has seen before.

use reqwest::Method;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use secrecy::SecretString;
use serde_json::{Map, Value};

use crate::config::ToolConfig;
use crate::domain::Identity;

/// The argument Sabi fills with the verified identity.
const CUSTOMER: &str = "customer";
/// Who a tool request acts for: `whatsapp:<number>`, `web:<user_id>` or `anonymous`,
/// percent-encoded ([`customer_header`]).
pub const CUSTOMER_HEADER: &str = "x-sabi-customer";
/// 32 hex digits, new for every request (retries included): the business's API refuses an id
/// it has seen within the timestamp's window, so a captured request cannot be replayed.
pub const REQUEST_ID_HEADER: &str = "x-sabi-request-id";
/// Unix seconds when a signed tool request was made.
pub const TIMESTAMP_HEADER: &str = "x-sabi-timestamp";
/// `sha256=<hex>`: HMAC-SHA256 with the tools secret of [`signed_message`]:
/// `<timestamp>\n<request id>\n<METHOD>\n<path?query>\n<X-Sabi-Customer>\n<body>`.
pub const SIGNATURE_HEADER: &str = "x-sabi-signature-256";

/// Why a tool call gave no answer. The message is safe to show the agent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error("no tool named {0:?}")]
    Unknown(String),
    #[error("tool {tool}: argument {argument:?} is missing")]
    MissingArgument { tool: String, argument: String },
    #[error("tool {tool}: argument {argument:?} {why}")]
    Invalid {
        tool: String,
        argument: String,
        why: String,
    },
    #[error(
        "tool {tool} acts for a verified customer, and nobody in this conversation is one: \
         it was not called"
    )]
    NoCustomer { tool: String },
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
    /// The parameters as the model sees them: without `customer`.
    offered: Value,
    /// Checks the model's arguments against `offered`.
    validator: Option<jsonschema::Validator>,
    /// The arguments that may leave: schema properties and URL placeholders.
    declared: Vec<String>,
    /// The schema declares `customer`: it goes in the body too.
    customer_in_body: bool,
    /// The URL or the schema needs `customer`.
    needs_customer: bool,
}

/// Every configured tool, sharing one HTTP client.
pub struct Tools {
    client: reqwest::Client,
    tools: Vec<Tool>,
    secret: Option<SecretString>,
}

impl Tools {
    /// Checks every tool and resolves its header variables from `env`. With `secret`, every
    /// request is signed.
    ///
    /// # Errors
    /// A bad method, URL, header or parameters schema, a duplicate name, or a `${VAR}` that
    /// `env` does not set.
    pub fn new(
        configs: &[ToolConfig],
        env: &dyn Fn(&str) -> Option<String>,
        secret: Option<SecretString>,
    ) -> Result<Tools, ConfigError> {
        let mut tools: Vec<Tool> = Vec::new();
        for config in configs {
            if tools.iter().any(|t| t.config.name == config.name) {
                let name = &config.name;
                return Err(ConfigError(format!("tool {name:?} is declared twice")));
            }
            tools.push(Tool::new(config, env)?);
        }
        Ok(Tools {
            client: reqwest::Client::new(),
            tools,
            secret,
        })
    }

    /// The tools offered to a model answering `identity`, as an OpenAI-compatible model reads
    /// them.
    pub fn definitions(&self, identity: &Identity) -> Vec<Value> {
        self.tools
            .iter()
            .filter(|t| t.offered_to(identity))
            .map(|t| {
                serde_json::json!({"type": "function", "function": {
                    "name": t.config.name,
                    "description": t.config.description,
                    "parameters": t.offered,
                }})
            })
            .collect()
    }

    /// Calls `name` for `identity` with `arguments` and returns its JSON answer.
    ///
    /// # Errors
    /// A tool not offered to `identity`, arguments its schema refuses, a `customer` it needs
    /// and nobody vouched for, or a failed call (connection, timeout, non-2xx status, an answer
    /// that is not JSON).
    pub async fn call(
        &self,
        name: &str,
        arguments: &Map<String, Value>,
        identity: &Identity,
    ) -> Result<Value, Error> {
        let tool = self
            .tools
            .iter()
            .find(|t| t.config.name == name && t.offered_to(identity))
            .ok_or_else(|| Error::Unknown(name.to_owned()))?;
        let arguments = tool.arguments(arguments, identity)?;
        let url =
            fill_url(&tool.config.url, &arguments).map_err(|argument| Error::MissingArgument {
                tool: name.to_owned(),
                argument,
            })?;
        let failed = |reason: String| Error::Failed {
            tool: name.to_owned(),
            reason,
        };
        let body = match tool.method {
            Method::GET | Method::DELETE => None,
            _ => Some(Value::Object(tool.body(&arguments)).to_string()),
        };
        let customer = customer_header(identity);
        let request_id = request_id();
        let mut request = self
            .client
            .request(tool.method.clone(), &url)
            .headers(tool.headers.clone())
            .header(CUSTOMER_HEADER, &customer)
            .header(REQUEST_ID_HEADER, &request_id)
            .timeout(tool.config.timeout);
        if let Some(secret) = &self.secret {
            let timestamp = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs())
                .to_string();
            let message = signed_message(&Signed {
                timestamp: &timestamp,
                request_id: &request_id,
                method: tool.method.as_str(),
                target: &target(&url),
                customer: &customer,
                body: body.as_deref().unwrap_or(""),
            });
            let signature = crate::whatsapp::sign(secret, message.as_bytes());
            request = request
                .header(TIMESTAMP_HEADER, timestamp)
                .header(SIGNATURE_HEADER, signature);
        }
        if let Some(body) = body {
            request = request
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(body);
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

impl Tool {
    fn new(config: &ToolConfig, env: &dyn Fn(&str) -> Option<String>) -> Result<Tool, ConfigError> {
        let name = &config.name;
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
        let schema = config.parameters.clone();
        let declares = |property: &str| {
            schema
                .as_ref()
                .and_then(|s| s.get("properties")?.get(property))
                .is_some()
        };
        let placeholders = placeholders(&config.url);
        let customer_in_body = declares(CUSTOMER);
        let needs_customer = customer_in_body || placeholders.iter().any(|p| p == CUSTOMER);
        let offered = without_customer(
            schema.unwrap_or_else(|| serde_json::json!({"type": "object", "properties": {}})),
        );
        let validator = match &config.parameters {
            Some(_) => Some(
                jsonschema::validator_for(&offered)
                    .map_err(|e| ConfigError(format!("{name}: parameters: {e}")))?,
            ),
            None => None,
        };
        let mut declared: Vec<String> = offered
            .get("properties")
            .and_then(Value::as_object)
            .map(|p| p.keys().cloned().collect())
            .unwrap_or_default();
        declared.extend(placeholders.into_iter().filter(|p| p != CUSTOMER));
        Ok(Tool {
            config: config.clone(),
            method,
            headers,
            offered,
            validator,
            declared,
            customer_in_body,
            needs_customer,
        })
    }

    fn offered_to(&self, identity: &Identity) -> bool {
        self.config.public || *identity != Identity::Anonymous
    }

    /// The model's arguments, checked and cut to what the tool declares, with `customer` set
    /// from `identity` (whatever the model said).
    fn arguments(
        &self,
        given: &Map<String, Value>,
        identity: &Identity,
    ) -> Result<Map<String, Value>, Error> {
        let name = &self.config.name;
        // A null is an argument not given (reply templates pass every entity, found or not).
        let mut arguments: Map<String, Value> = given
            .iter()
            .filter(|(key, value)| *key != CUSTOMER && !value.is_null())
            .map(|(key, value)| (key.clone(), value.clone()))
            .collect();
        if let Some(validator) = &self.validator {
            // A tool call is rare next to a turn: checking a copy keeps this plain.
            let instance = Value::Object(arguments.clone());
            if let Some(error) = validator.iter_errors(&instance).next() {
                let argument = error.instance_path().as_str().trim_start_matches('/');
                return Err(Error::Invalid {
                    tool: name.clone(),
                    argument: argument.to_owned(),
                    why: error.to_string(),
                });
            }
        }
        arguments.retain(|key, _| self.declared.contains(key));
        if self.needs_customer {
            let customer = identity
                .customer()
                .ok_or_else(|| Error::NoCustomer { tool: name.clone() })?;
            arguments.insert(CUSTOMER.to_owned(), Value::String(customer.to_owned()));
        }
        Ok(arguments)
    }

    /// What a POST (or PUT, PATCH) sends: the schema's arguments, never the URL's alone.
    fn body(&self, arguments: &Map<String, Value>) -> Map<String, Value> {
        let in_schema = |key: &str| {
            (key == CUSTOMER && self.customer_in_body)
                || self
                    .offered
                    .get("properties")
                    .is_some_and(|p| p.get(key).is_some())
        };
        arguments
            .iter()
            .filter(|(key, _)| in_schema(key))
            .map(|(key, value)| (key.clone(), value.clone()))
            .collect()
    }
}

/// The schema as the model is offered it: `customer` is Sabi's to fill.
fn without_customer(mut schema: Value) -> Value {
    if let Some(properties) = schema.get_mut("properties").and_then(Value::as_object_mut) {
        properties.remove(CUSTOMER);
    }
    if let Some(required) = schema.get_mut("required").and_then(Value::as_array_mut) {
        required.retain(|r| r != CUSTOMER);
    }
    schema
}

/// The `{name}` placeholders of a URL template.
fn placeholders(template: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = template;
    while let Some(start) = rest.find('{') {
        let after = &rest[start + 1..];
        let Some(end) = after.find('}') else { break };
        names.push(after[..end].to_owned());
        rest = &after[end + 1..];
    }
    names
}

/// What a tool request's signature covers.
#[derive(Debug, Clone, Copy)]
pub struct Signed<'a> {
    /// `X-Sabi-Timestamp`.
    pub timestamp: &'a str,
    /// `X-Sabi-Request-Id`.
    pub request_id: &'a str,
    /// `GET`, `POST`, ...
    pub method: &'a str,
    /// The path with its query, as sent.
    pub target: &'a str,
    /// `X-Sabi-Customer`, as sent (percent-encoded).
    pub customer: &'a str,
    pub body: &'a str,
}

/// The text a tool request's signature is the HMAC-SHA256 of: its parts one per line
/// (`<timestamp>\n<request id>\n<METHOD>\n<path?query>\n<X-Sabi-Customer>\n<body>`). None of the
/// parts before the body can hold a newline, so no part can be moved into another.
pub fn signed_message(signed: &Signed<'_>) -> String {
    let Signed {
        timestamp,
        request_id,
        method,
        target,
        customer,
        body,
    } = signed;
    format!("{timestamp}\n{request_id}\n{method}\n{target}\n{customer}\n{body}")
}

/// `X-Sabi-Customer` for `identity`: bytes outside visible ASCII, and `%` itself, as `%XX`, so a
/// `user_id` with line separators or bidi controls never reaches the header raw and a business
/// decodes exactly what Sabi verified.
pub fn customer_header(identity: &Identity) -> String {
    identity
        .header()
        .bytes()
        .map(|b| match b {
            b'%' => "%25".to_owned(),
            0x21..=0x7e => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A fresh request id: 128 random bits as hex.
fn request_id() -> String {
    let mut id = [0u8; 16];
    // Without the system's randomness the id is still new per request, only guessable: the
    // timestamp and the signature still hold.
    if getrandom::fill(&mut id).is_err() {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        id = nanos.to_be_bytes();
    }
    hex::encode(id)
}

/// The path and query of `url`, as the request line carries them.
fn target(url: &str) -> String {
    reqwest::Url::parse(url).map_or_else(
        |_| url.to_owned(),
        |u| match u.query() {
            Some(query) => format!("{}?{query}", u.path()),
            None => u.path().to_owned(),
        },
    )
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
    fn the_customer_header_is_visible_ascii_whatever_the_user_id() {
        let header = |id: &str| customer_header(&Identity::Web(id.to_owned()));
        assert_eq!(header("user-42"), "web:user-42");
        assert_eq!(header("a\u{202E}b"), "web:a%E2%80%AEb");
        assert_eq!(
            header("a\u{2028}b\r\nX-Evil: 1"),
            "web:a%E2%80%A8b%0D%0AX-Evil:%201"
        );
        assert_eq!(header("50%"), "web:50%25");
        assert_eq!(
            customer_header(&Identity::Whatsapp("2348031234567".into())),
            "whatsapp:2348031234567"
        );
        assert!(HeaderValue::from_str(&header("\u{7f}\u{0}é")).is_ok());
    }

    #[test]
    fn request_ids_are_new_every_time() {
        let (one, two) = (request_id(), request_id());
        assert_ne!(one, two);
        assert_eq!(one.len(), 32);
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
