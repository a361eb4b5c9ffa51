//! The router in the turn: a batch's messages are routed as one text (and each one alone when
//! that is clearer); a local answer goes to the outbox without any LLM call, a hand-off goes to
//! a person, and everything else to the agent.
//!
//! Reply templates may use the message's entities (`{{amount}}`, `{{account}}`, `{{phone}}`,
//! `{{reference}}`) and fields of a tool's JSON answer (`{{tool.balance.available}}`). A template
//! that cannot be filled (no such entity, the tool failed) hands the batch to the agent instead.
//!
//! Every turn's guess is kept with the turn ([`Turns::set_route`]): `sabi route --export-unsure`
//! compares the guesses with who answered, and a person's labels, to learn from use.

use std::sync::Arc;

use async_trait::async_trait;

use serde_json::{Map, Value, json};

use super::{ActionKind, Entities, PLEASANTRIES, Router, Routing};
use crate::domain::{Batch, ReplyPart};
use crate::metrics::{Metrics, Routed};
use crate::store::{RouteGuess, Turns};
use crate::tools::Tools;
use crate::turn::{TurnError, TurnHandler, TurnOutcome};

pub struct RouterHandler {
    router: Arc<Router>,
    tools: Arc<Tools>,
    /// Answers what the router does not: the LLM agent.
    agent: Arc<dyn TurnHandler>,
    store: Arc<dyn Turns>,
    metrics: Arc<Metrics>,
}

impl RouterHandler {
    pub fn new(
        router: Arc<Router>,
        tools: Arc<Tools>,
        agent: Arc<dyn TurnHandler>,
        store: Arc<dyn Turns>,
        metrics: Arc<Metrics>,
    ) -> Arc<RouterHandler> {
        Arc::new(RouterHandler {
            router,
            tools,
            agent,
            store,
            metrics,
        })
    }

    /// Keeps the guess with the turn. Learning from use can do without one turn's guess, so a
    /// store error here does not fail the turn.
    async fn keep_guess(&self, batch: &Batch, routing: &Routing) {
        let guess = RouteGuess {
            intent: routing.intent.clone(),
            confidence: routing.confidence,
            local: routing.local,
        };
        if let Err(e) = self.store.set_route(batch.id, guess).await {
            tracing::warn!(batch = batch.id, error.message = %e, "could not keep the router's guess");
        }
    }

    fn count(&self, routing: &Routing, decision: &str) {
        self.metrics
            .routed
            .get_or_create(&Routed {
                tier: format!("{:?}", routing.tier).to_lowercase(),
                decision: decision.to_owned(),
            })
            .inc();
    }

    /// The template with its tool fields and entities filled; `None` when it cannot be. Filled
    /// in one pass over the template: text a tool returns is never read as a placeholder.
    async fn fill(&self, template: &str, batch: &Batch, routing: &Routing) -> Option<String> {
        let mut out = String::with_capacity(template.len());
        let mut rest = template;
        let mut answers: Vec<(String, Value)> = Vec::new();
        while let Some((start, end, tool, path)) = next_tool_field(rest) {
            out.push_str(&rest[..start]);
            if !answers.iter().any(|(name, _)| *name == tool) {
                let arguments = tool_arguments(batch, routing);
                match self.tools.call(&tool, &arguments, &batch.identity()).await {
                    Ok(answer) => answers.push((tool.clone(), answer)),
                    Err(e) => {
                        tracing::warn!(batch = batch.id, error.message = %e, "a reply template's tool failed; the agent answers");
                        return None;
                    }
                }
            }
            let answer = &answers.iter().find(|(name, _)| *name == tool)?.1;
            match path.split('.').try_fold(answer, |v, key| v.get(key))? {
                Value::String(s) => out.push_str(s),
                Value::Null => return None,
                other => out.push_str(&other.to_string()),
            }
            rest = &rest[end..];
        }
        out.push_str(rest);
        render(&out, &routing.entities)
    }

    /// The batch as one text; when that is not answerable locally but exactly one message is a
    /// local request and the others are only pleasantries, that message decides.
    fn route_batch(&self, batch: &Batch) -> Routing {
        let texts: Vec<&str> = batch
            .messages
            .iter()
            .filter_map(|m| m.text.as_deref())
            .collect();
        let joined = self.router.route(&texts.join("\n"));
        if joined.local || texts.len() < 2 {
            return joined;
        }
        let alone: Vec<Routing> = texts.iter().map(|t| self.router.route(t)).collect();
        let requests: Vec<&Routing> = alone
            .iter()
            .filter(|r| !PLEASANTRIES.contains(&r.intent.as_str()))
            .collect();
        let all_local = alone.iter().all(|r| r.local);
        match requests.as_slice() {
            [only] if all_local => (*only).clone(),
            _ => joined,
        }
    }
}

#[async_trait]
impl TurnHandler for RouterHandler {
    async fn handle(&self, batch: &Batch) -> Result<TurnOutcome, TurnError> {
        let routing = self.route_batch(batch);
        tracing::debug!(batch = batch.id, intent = %routing.intent, confidence = routing.confidence, local = routing.local, tier = ?routing.tier, "routed");
        self.keep_guess(batch, &routing).await;
        let action = self
            .router
            .action(&routing.intent)
            .filter(|_| routing.local);
        let Some((kind, template, options)) = action else {
            self.count(&routing, "agent");
            return self.agent.handle(batch).await;
        };
        self.count(
            &routing,
            match kind {
                ActionKind::Reply => "local",
                ActionKind::Handoff => "handoff",
                ActionKind::Agent => "agent",
            },
        );
        let reply = match template {
            Some(template) => match self.fill(template, batch, &routing).await {
                Some(text) => vec![ReplyPart {
                    text,
                    options: options.to_vec(),
                    quote: None,
                }],
                // A template names an entity the message does not carry, or its tool failed.
                None => return self.agent.handle(batch).await,
            },
            None => Vec::new(),
        };
        match kind {
            ActionKind::Reply if !reply.is_empty() => Ok(TurnOutcome::Reply(reply)),
            ActionKind::Handoff => Ok(TurnOutcome::Handoff {
                parts: reply,
                note: format!(
                    "asked for by the router: {} ({:.2})",
                    routing.intent, routing.confidence
                ),
            }),
            ActionKind::Reply | ActionKind::Agent => self.agent.handle(batch).await,
        }
    }
}

/// The first `{{tool.NAME.PATH}}` of `text`: (its start, its end, NAME, PATH).
fn next_tool_field(text: &str) -> Option<(usize, usize, String, String)> {
    let start = text.find("{{tool.")?;
    let end = start + text[start..].find("}}")? + 2;
    let inner = &text[start + "{{tool.".len()..end - 2];
    let (tool, path) = inner.split_once('.')?;
    Some((start, end, tool.to_owned(), path.to_owned()))
}

/// What a tool called from a template gets: the conversation and the message's entities.
fn tool_arguments(batch: &Batch, routing: &Routing) -> Map<String, Value> {
    let e = &routing.entities;
    let mut args = Map::new();
    args.insert("channel".into(), json!(batch.conversation.channel.as_str()));
    args.insert("business".into(), json!(batch.conversation.business));
    // `customer` is the tools' to fill, from the conversation's verified identity.
    args.insert("intent".into(), json!(routing.intent));
    args.insert("amount".into(), json!(e.amounts.first().map(|a| a.value)));
    args.insert("account".into(), json!(e.accounts.first()));
    args.insert("phone".into(), json!(e.phones.first()));
    args.insert("reference".into(), json!(e.references.first()));
    args
}

/// Fills `{{amount}}`, `{{account}}`, `{{phone}}`, `{{reference}}` with the first entity of its
/// kind; `None` when the message carries no such entity.
fn render(template: &str, entities: &Entities) -> Option<String> {
    let mut out = template.to_owned();
    let fills: [(&str, Option<&str>); 4] = [
        (
            "{{amount}}",
            entities.amounts.first().map(|a| a.text.as_str()),
        ),
        ("{{account}}", entities.accounts.first().map(String::as_str)),
        ("{{phone}}", entities.phones.first().map(String::as_str)),
        (
            "{{reference}}",
            entities.references.first().map(String::as_str),
        ),
    ];
    for (placeholder, value) in fills {
        if out.contains(placeholder) {
            out = out.replace(placeholder, value?);
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::router::entities::extract;

    #[test]
    fn tool_fields_are_found_in_order() {
        assert_eq!(
            next_tool_field("Balance: {{tool.balance.account.available}} ok"),
            Some((9, 43, "balance".into(), "account.available".into()))
        );
        assert_eq!(next_tool_field("no tools {{amount}}"), None);
    }

    #[test]
    fn templates_fill_entities_or_refuse() {
        let e = extract("buy 2k airtime for 08031234567");
        assert_eq!(
            render("{{amount}} to {{phone}}", &e).as_deref(),
            Some("2k to 08031234567")
        );
        assert_eq!(render("ref {{reference}}", &e), None);
        assert_eq!(render("plain", &e).as_deref(), Some("plain"));
    }
}
