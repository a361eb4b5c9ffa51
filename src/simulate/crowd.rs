//! The simulated customers: each writes when the reply curve says, waits for the answer (a
//! holding message is not one), reads it, and writes again, as many turns as drawn. They
//! write through the real webhook, signed like Meta, with a mix of messages the router
//! answers and messages it hands to the model.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::time::Duration;

use secrecy::SecretString;
use tokio::sync::mpsc;

use super::fakes::Delivered;
use crate::clock::{At, SharedClock};
use crate::plan::queue::Replier;
use crate::router::Router;
use crate::router::intents::{ActionKind, IntentsFile};
use crate::whatsapp::{sign, wire};

/// One message and what came of it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Exchange {
    pub sent: At,
    pub answered: Option<At>,
}

/// What customers wrote and when they were answered.
#[derive(Debug, Default)]
pub(crate) struct Seen {
    pub exchanges: Vec<Exchange>,
    pub holding_messages: usize,
}

/// Messages to write: ones the router answers itself, and ones it hands to the model.
#[derive(Debug, Clone)]
pub(crate) struct Messages {
    pub local: Vec<String>,
    pub model: Vec<String>,
}

impl Messages {
    /// The intents file's own examples, sorted by what the router does with them: answered
    /// with a reply (not handed to a person), or handed to the model.
    pub(crate) fn from_intents(source: &str, router: Option<&Router>) -> anyhow::Result<Messages> {
        let file = IntentsFile::parse(source).map_err(|e| anyhow::anyhow!("intents: {}", e.0))?;
        let mut messages = Messages {
            local: Vec::new(),
            model: Vec::new(),
        };
        for example in file.intents.iter().flat_map(|i| &i.examples) {
            let Some(router) = router else {
                messages.model.push(example.clone());
                continue;
            };
            let routing = router.route(example);
            match (routing.local, router.action(&routing.intent)) {
                (true, Some((ActionKind::Reply, _, _))) => messages.local.push(example.clone()),
                // Handed to a person: the bot stays quiet after it, which no surge figure wants.
                (true, Some((ActionKind::Handoff, _, _))) => {}
                _ => messages.model.push(example.clone()),
            }
        }
        Ok(messages)
    }
}

/// Where and how the crowd writes.
pub(crate) struct Crowd {
    pub clock: SharedClock,
    /// The WhatsApp webhook URL.
    pub webhook: String,
    pub secret: SecretString,
    /// The business number customers write to.
    pub business: String,
    pub messages: Messages,
    pub local_share: f64,
    /// How long a customer takes to read an answer and write again, on average.
    pub think: Duration,
    /// How long a customer waits for an answer before giving up on the run.
    pub patience: Duration,
    pub seed: u64,
}

/// A customer's place in the run.
struct Customer {
    phone: String,
    left: u32,
    /// The exchange awaiting its answer.
    open: Option<usize>,
    sent: u32,
}

impl Crowd {
    /// Plays every replier out; ends when nobody has anything left to write and every message
    /// is answered, or when the last answer is `patience` overdue (counted from the last message
    /// written or received).
    pub(crate) async fn run(
        self,
        origin: At,
        repliers: &[Replier],
        mut delivered: mpsc::UnboundedReceiver<Delivered>,
    ) -> Seen {
        let mut rng = fastrand::Rng::with_seed(self.seed);
        let http = reqwest::Client::new();
        let mut customers: Vec<Customer> = repliers
            .iter()
            .enumerate()
            .map(|(i, r)| Customer {
                phone: format!("2348{i:09}"),
                left: r.turns,
                open: None,
                sent: 0,
            })
            .collect();
        let by_phone: HashMap<String, usize> = customers
            .iter()
            .enumerate()
            .map(|(i, c)| (c.phone.clone(), i))
            .collect();
        let mut due: BinaryHeap<Reverse<(At, usize)>> = repliers
            .iter()
            .enumerate()
            .map(|(i, r)| Reverse((origin + Duration::from_secs_f64(r.first), i)))
            .collect();
        let mut seen = Seen::default();
        let mut waiting = 0_usize;
        let mut last_news = self.clock.now();
        loop {
            let next = due.peek().map(|Reverse((at, _))| *at);
            if next.is_none() && waiting == 0 {
                break;
            }
            let wake = next.unwrap_or(last_news + self.patience);
            tokio::select! {
                biased;
                Some(news) = delivered.recv() => {
                    last_news = news.at;
                    let Some(&i) = by_phone.get(&news.customer) else { continue };
                    let customer = &mut customers[i];
                    let Some(open) = customer.open else { continue };
                    if news.holding {
                        seen.holding_messages += 1;
                        continue;
                    }
                    seen.exchanges[open].answered = Some(news.at);
                    customer.open = None;
                    waiting -= 1;
                    if customer.left > 0 {
                        let think = self.think.mul_f64(0.5 + rng.f64());
                        due.push(Reverse((news.at + think, i)));
                    }
                }
                () = self.clock.sleep_until(wake) => {
                    if next.is_none() {
                        break;
                    }
                    let Some(Reverse((_, i))) = due.pop() else { continue };
                    let customer = &mut customers[i];
                    customer.left -= 1;
                    customer.sent += 1;
                    let now = self.clock.now();
                    last_news = now;
                    customer.open = Some(seen.exchanges.len());
                    seen.exchanges.push(Exchange { sent: now, answered: None });
                    waiting += 1;
                    let text = self.pick(&mut rng);
                    let id = format!("wamid.SIMIN{i}.{}", customer.sent);
                    let body = wire::encode(&wire::text_webhook(
                        &self.business,
                        &customer.phone,
                        "Simulated Customer",
                        &id,
                        u64::try_from(now.unix_seconds()).unwrap_or(0),
                        text,
                    ));
                    tokio::spawn(post(
                        http.clone(),
                        self.webhook.clone(),
                        sign(&self.secret, body.as_bytes()),
                        body,
                        self.clock.clone(),
                    ));
                }
            }
        }
        seen
    }

    fn pick(&self, rng: &mut fastrand::Rng) -> &str {
        let pool = match rng.f64() < self.local_share && !self.messages.local.is_empty() {
            true => &self.messages.local,
            false => &self.messages.model,
        };
        pool.get(rng.usize(..pool.len().max(1)))
            .map_or("hello", String::as_str)
    }
}

/// Posts one webhook, retrying a refusal the way Meta does (a few times, a second apart).
pub(super) async fn post(
    http: reqwest::Client,
    url: String,
    signature: String,
    body: String,
    clock: SharedClock,
) {
    for _ in 0..5 {
        let sent = http
            .post(&url)
            .header("content-type", "application/json")
            .header("x-hub-signature-256", &signature)
            .body(body.clone())
            .send()
            .await;
        match sent {
            Ok(response) if response.status().is_success() => return,
            Ok(response) => tracing::warn!(status = %response.status(), "webhook refused"),
            Err(e) => tracing::warn!(error.message = %e, "webhook not delivered"),
        }
        clock
            .sleep_until(clock.now() + Duration::from_secs(1))
            .await;
    }
}
