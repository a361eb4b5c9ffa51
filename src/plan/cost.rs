//! What a broadcast costs and what the model provider must allow: Meta's fee for each template
//! message (the answers are service messages, which Meta prices apart), the model's tokens at
//! their prices, and the requests and tokens a minute at the surge's peak.
//!
//! PURE: no IO.

use serde::Serialize;

use super::words::count;
use super::{Row, Scenario, Warning};

/// What the owner's prices are.
#[derive(Debug, Clone, PartialEq)]
pub struct Pricing {
    /// `broadcast.currency`.
    pub currency: String,
    /// Meta's price of one marketing template message in the audience's country, or why there
    /// is none.
    pub per_message: Result<MessagePrice, String>,
    /// The model's prices per million tokens (`llm.prompt_price`, `llm.completion_price`).
    pub prompt_price: f64,
    pub completion_price: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MessagePrice {
    /// The country calling code the price is for, like `234`.
    pub country: String,
    pub price: f64,
}

/// What the broadcast and its replies cost, in `currency`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Costs {
    pub currency: String,
    /// Template messages Meta charges for: one a recipient.
    pub messages: usize,
    pub country: Option<String>,
    pub per_message: Option<f64>,
    /// Meta's fees; `None` when there is no price, and `meta_unpriced` says why.
    pub meta: Option<f64>,
    pub meta_unpriced: Option<String>,
    /// Turns the model answers over the whole broadcast, expected, and their tokens.
    pub model_turns: f64,
    pub prompt_tokens: f64,
    pub completion_tokens: f64,
    /// The model's cost; `None` when neither of its prices is set.
    pub model: Option<f64>,
    /// Both, where both are known.
    pub total: Option<f64>,
}

/// The costs of `scenario` at `pricing`.
pub fn costs(scenario: &Scenario, pricing: &Pricing) -> Costs {
    let model_turns = scenario.audience as f64
        * scenario.reply_rate
        * scenario.turns_per_customer
        * (1.0 - scenario.local_share);
    let prompt_tokens = model_turns * f64::from(scenario.prompt_tokens_per_model_turn());
    let completion_tokens = model_turns * f64::from(scenario.completion_tokens_per_model_turn);
    let priced = pricing.prompt_price > 0.0 || pricing.completion_price > 0.0;
    let model = priced.then(|| {
        (prompt_tokens * pricing.prompt_price + completion_tokens * pricing.completion_price) / 1e6
    });
    let (price, unpriced) = match &pricing.per_message {
        Ok(price) => (Some(price), None),
        Err(why) => (None, Some(why.clone())),
    };
    let meta = price.map(|p| p.price * scenario.audience as f64);
    Costs {
        currency: pricing.currency.clone(),
        messages: scenario.audience,
        country: price.map(|p| p.country.clone()),
        per_message: price.map(|p| p.price),
        meta,
        meta_unpriced: unpriced,
        model_turns,
        prompt_tokens,
        completion_tokens,
        model,
        total: meta.zip(model).map(|(meta, model)| meta + model),
    }
}

/// What the model provider must allow at the surge's peak, against the limits it was given.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Provider {
    /// Requests and tokens a minute at the busiest minute, with the recommended sizing and no
    /// provider limits.
    pub requests_per_minute: usize,
    pub tokens_per_minute: u64,
    /// The limits the plan was given (`--llm-rpm`/`--llm-tpm`, else `llm.requests_per_minute`
    /// and `llm.tokens_per_minute`).
    pub rpm_limit: Option<u32>,
    pub tpm_limit: Option<u32>,
}

/// What the provider must allow, from the peak of `unbounded`: the surge played without the
/// provider's limits.
pub fn provider(scenario: &Scenario, unbounded: &Row) -> Provider {
    Provider {
        requests_per_minute: unbounded.peak_model_calls_per_min,
        tokens_per_minute: unbounded.peak_tokens_per_min,
        rpm_limit: scenario.llm_rpm,
        tpm_limit: scenario.llm_tpm,
    }
}

/// `llm_budget` when the provider's limits are below what the peak asks; `slower` is the rate
/// the plan recommends instead of the one asked, when it does.
pub fn warnings(provider: &Provider, slower: Option<f64>) -> Vec<Warning> {
    let short = |need: u64, limit: Option<u32>| limit.filter(|l| u64::from(*l) < need);
    let mut said = Vec::new();
    let requests = provider.requests_per_minute as u64;
    if let Some(limit) = short(requests, provider.rpm_limit) {
        said.push(format!(
            "{} requests a minute, above the {} allowed (--llm-rpm, else \
             llm.requests_per_minute)",
            count(requests as f64),
            count(f64::from(limit)),
        ));
    }
    if let Some(limit) = short(provider.tokens_per_minute, provider.tpm_limit) {
        said.push(format!(
            "{} tokens a minute, above the {} allowed (--llm-tpm, else \
             llm.tokens_per_minute)",
            count(provider.tokens_per_minute as f64),
            count(f64::from(limit)),
        ));
    }
    if said.is_empty() {
        return Vec::new();
    }
    let so = match slower {
        Some(rate) => format!(
            "customers would wait too long for the provider, so the plan sends slower, {rate:.1} \
             a second; a higher tier with the provider avoids it"
        ),
        None => "the model's calls wait their turn within the limits at the peak (the figures \
                 count those waits); a higher tier with the provider shortens them"
            .into(),
    };
    vec![Warning {
        code: "llm_budget",
        message: format!(
            "at the peak the model would be asked {}: {so}",
            said.join(" and ")
        ),
    }]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pricing(per_message: Result<MessagePrice, String>) -> Pricing {
        Pricing {
            currency: "NGN".into(),
            per_message,
            prompt_price: 150.0,
            completion_price: 600.0,
        }
    }

    #[test]
    fn meta_charges_each_recipient_and_the_model_its_tokens() {
        let scenario = Scenario::prior(10_000);
        let price = MessagePrice {
            country: "234".into(),
            price: 50.0,
        };
        let costs = costs(&scenario, &pricing(Ok(price)));
        assert_eq!(costs.meta, Some(500_000.0));
        // 10,000 x 15 % x 3 turns x 60 % for the model = 2,700 model turns.
        assert!((costs.model_turns - 2_700.0).abs() < 1e-6, "{costs:?}");
        let expected = 2_700.0 * (2_700.0 * 150.0 + 300.0 * 600.0) / 1e6;
        let model = costs.model.expect("priced");
        assert!((model - expected).abs() < 1e-6, "{costs:?}");
        assert_eq!(costs.total, Some(500_000.0 + model));
    }

    #[test]
    fn a_missing_price_is_said_not_guessed() {
        let mut unpriced = pricing(Err("broadcast.prices is empty".into()));
        unpriced.prompt_price = 0.0;
        unpriced.completion_price = 0.0;
        let costs = costs(&Scenario::prior(100), &unpriced);
        assert_eq!(costs.meta, None);
        assert_eq!(
            costs.meta_unpriced.as_deref(),
            Some("broadcast.prices is empty")
        );
        assert_eq!((costs.model, costs.total), (None, None));
    }

    #[test]
    fn limits_below_the_peak_are_warned_of() {
        let need = Provider {
            requests_per_minute: 600,
            tokens_per_minute: 900_000,
            rpm_limit: Some(500),
            tpm_limit: Some(1_000_000),
        };
        let warned = warnings(&need, Some(2.5));
        assert_eq!(warned.len(), 1);
        assert_eq!(warned[0].code, "llm_budget");
        assert!(
            warned[0].message.contains("600 requests a minute"),
            "{warned:?}"
        );
        assert!(!warned[0].message.contains("tokens a minute"), "{warned:?}");
        let roomy = Provider {
            rpm_limit: Some(600),
            tpm_limit: None,
            ..need
        };
        assert!(warnings(&roomy, None).is_empty());
    }
}
