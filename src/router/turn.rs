//! The router in the turn: a batch's messages are routed as one text (and each one alone when
//! that is clearer); a local answer goes to the outbox without any LLM call, a hand-off goes to
//! a person, and everything else to the agent.

use std::sync::Arc;

use async_trait::async_trait;

use super::{ActionKind, Entities, PLEASANTRIES, Router, Routing};
use crate::domain::{Batch, ReplyPart};
use crate::worker::{TurnError, TurnHandler, TurnOutcome};

pub struct RouterHandler {
    router: Arc<Router>,
    /// Answers what the router does not: the LLM agent.
    agent: Arc<dyn TurnHandler>,
}

impl RouterHandler {
    pub fn new(router: Arc<Router>, agent: Arc<dyn TurnHandler>) -> Arc<RouterHandler> {
        Arc::new(RouterHandler { router, agent })
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
        let action = self
            .router
            .action(&routing.intent)
            .filter(|_| routing.local);
        let Some((kind, template)) = action else {
            return self.agent.handle(batch).await;
        };
        let reply = match template.map(|t| render(t, &routing.entities)) {
            Some(Some(text)) => vec![ReplyPart { text }],
            // A template names an entity the message does not carry: the agent can ask.
            Some(None) => return self.agent.handle(batch).await,
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
