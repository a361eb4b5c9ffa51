//! `sabi config --example`: a complete, commented `sabi.toml`, its values taken from the typed
//! configuration's own defaults. Tests hold the list below to the code: every default the
//! configuration serialises must be documented here, the example must load as it is, and it
//! must still load with every optional setting switched on, so no entry names a setting the
//! code does not have.

use super::{Config, ENV, Error};

/// One documented setting. `unset` is shown, commented out, when the setting has no default:
/// a value for a key, or a whole table when it starts with `[`.
struct Setting {
    path: &'static str,
    doc: &'static str,
    unset: Option<&'static str>,
}

const fn set(path: &'static str, doc: &'static str) -> Setting {
    Setting {
        path,
        doc,
        unset: None,
    }
}

const fn opt(path: &'static str, doc: &'static str, unset: &'static str) -> Setting {
    Setting {
        path,
        doc,
        unset: Some(unset),
    }
}

const SETTINGS: &[Setting] = &[
    set("listen", "Address the HTTP server listens on."),
    set(
        "store",
        "Where state lives: sqlite://PATH (embedded; the directory is created), or for several nodes postgres://USER:PASSWORD@HOST/DB[?sslmode=verify-full&sslrootcert=PATH&max_connections=16&statement_timeout=10s&lock_timeout=5s] or redis://[:PASSWORD@]HOST[:PORT][/DB][?prefix=NAME&durability=require&cluster=true] (rediss://...&ca=PATH over TLS).",
    ),
    opt(
        "tools_secret",
        "Signs every tool request (X-Sabi-Timestamp, X-Sabi-Signature-256), so your API can trust the customer named in X-Sabi-Customer.",
        "\"a-long-random-secret\"",
    ),
    opt(
        "whatsapp.app_secret",
        "The Meta app's secret: webhooks are signed with it. Required once an access token is set.",
        "\"your-app-secret\"",
    ),
    opt(
        "whatsapp.previous_app_secret",
        "The previous app secret, still accepted while you rotate it.",
        "\"old-app-secret\"",
    ),
    opt(
        "whatsapp.verify_token",
        "The token you type in Meta's dashboard to verify the callback URL.",
        "\"your-verify-token\"",
    ),
    opt(
        "whatsapp.access_token",
        "Graph API access token. Unset: sandbox mode, replies are kept and never sent.",
        "\"EAAG...\"",
    ),
    opt(
        "whatsapp.business_account_id",
        "Your WhatsApp Business Account id: a broadcast's template is checked through it (it exists, is APPROVED, takes the parameters given) before anything is sent.",
        "\"240011223344556\"",
    ),
    set(
        "whatsapp.api_base",
        "Graph API base URL; one that ends in a version (.../v23.0) is used as it is.",
    ),
    set(
        "whatsapp.graph_version",
        "The Graph API version Sabi speaks: Meta keeps each for about two years.",
    ),
    set(
        "whatsapp.batch_window",
        "A conversation is answered this long after its latest message (0 to 300 s).",
    ),
    set(
        "whatsapp.batch_max_wait",
        "...and never later than this long after its first (at least the window).",
    ),
    set(
        "whatsapp.outbound_rate",
        "Messages per second per business number (Meta's default is 80).",
    ),
    set(
        "whatsapp.messaging_limit",
        "Meta's messaging limit for your business: unique customers broadcasts may reach in a rolling 24 hours (250, 2000, 10000, 100000 or \"unlimited\"); the rest of a broadcast waits for headroom. With an access token and business_account_id, the tier Meta answers for the number comes first.",
    ),
    set(
        "whatsapp.pair_spacing",
        "Least time between two messages to one customer.",
    ),
    set(
        "whatsapp.send_timeout",
        "How long one Graph API call may take.",
    ),
    set(
        "whatsapp.unknown_outcome_wait",
        "A send whose answer was lost waits this long for its status webhook, then goes to review.",
    ),
    set(
        "whatsapp.send_max_failures",
        "Failed tries of one send before review (throttling does not count).",
    ),
    set(
        "whatsapp.send_retry_base",
        "The wait after a failed send, doubled after each further failure.",
    ),
    set("whatsapp.sends_in_flight", "Sends at once on one node."),
    set(
        "whatsapp.typing_indicator",
        "Mark the customer's message read, with the typing indicator, while a turn works.",
    ),
    set(
        "whatsapp.quote_replies",
        "A reply's first part quotes the customer's latest message.",
    ),
    opt(
        "whatsapp.window_template",
        "Sent instead of a reply once the 24-hour window has closed (else the reply goes to review).",
        "[whatsapp.window_template]\nname = \"reply_waiting\"\nlanguage = \"en_US\"\nparameters = [\"Sabi\"]",
    ),
    opt(
        "whatsapp.default_country",
        "The country calling code of numbers written the local way (0803 123 4567): in audience files and for sabi export/forget and the admin API's customers, unless --country (?country=) gives another.",
        "\"234\"",
    ),
    set(
        "whatsapp.marketing_messages",
        "Send MARKETING templates through Meta's Marketing Messages API (/marketing_messages); others keep to /messages. Turn on only once your business has accepted Meta's terms for it.",
    ),
    opt(
        "whatsapp.prices",
        "What Meta charges per message, by pricing category (marketing, marketing_lite, utility, authentication, authentication_international, service) and country prefix (the longest that matches; a BSUID's letters, like NG, for customers known by no number): sabi stats prices what Meta's statuses priced. broadcast.prices count as marketing prices.",
        "[whatsapp.prices]\nutility = { \"234\" = 0.0067 }\nauthentication = { \"234\" = 0.0067 }",
    ),
    opt(
        "whatsapp.currency",
        "The currency of whatsapp.prices. Unset: broadcast.currency.",
        "\"USD\"",
    ),
    set(
        "whatsapp.max_reply_parts",
        "A reply in more parts than this is packed into as few WhatsApp messages as fit (4096 characters each, 1024 above buttons): Meta bills each message.",
    ),
    opt(
        "whatsapp.message_send_ttl_seconds",
        "How long Meta keeps trying to deliver a marketing message sent through the Marketing Messages API: 43200 (12 hours) to 2592000 (30 days); Meta's default is 30 days.",
        "86400",
    ),
    set(
        "webchat.batch_window",
        "Web chat answers each question at once by default.",
    ),
    set(
        "webchat.batch_max_wait",
        "The cap from a session's first waiting question.",
    ),
    set(
        "webchat.site",
        "The business side of web-chat conversations.",
    ),
    set(
        "webchat.result_ttl",
        "How long a job's answer can be fetched (history keeps it longer).",
    ),
    set(
        "webchat.max_queue",
        "Questions waiting beyond this are refused with 503 and Retry-After.",
    ),
    set(
        "webchat.per_session_per_minute",
        "Questions one session may ask per minute before 429.",
    ),
    set(
        "webchat.per_address_per_minute",
        "Questions from one address per minute (in bursts of as many) before 429; 0: no limit. Set ingress.trusted_proxies behind a proxy.",
    ),
    set(
        "webchat.new_sessions_per_address_per_hour",
        "New chat sessions from one address per hour (in bursts of as many) before 429; 0: no limit.",
    ),
    set(
        "webchat.handoffs_per_address_per_hour",
        "Anonymous requests for a person from one address per hour (in bursts of as many) before 429; 0: no limit.",
    ),
    set(
        "webchat.max_streams",
        "Event streams open at once on one node; more get 503 and poll instead.",
    ),
    set(
        "webchat.frame_ancestors",
        "Who may frame the chat page (CSP frame-ancestors, like https://www.example.com); * lets any site embed it.",
    ),
    opt(
        "webchat.identity_secret",
        "Your site signs a signed-in visitor's user_id with this (user_hash = hex HMAC-SHA256); unset: every visitor is anonymous and offered only public tools.",
        "\"a-long-random-secret\"",
    ),
    opt(
        "llm.base_url",
        "OpenAI-compatible base URL. Unset: no agent; a plain acknowledgement answers what the router does not.",
        "\"https://api.openai.com/v1\"",
    ),
    opt("llm.api_key", "The provider's key.", "\"sk-...\""),
    opt(
        "llm.model",
        "The model (required with a base URL).",
        "\"gpt-4o-mini\"",
    ),
    set(
        "llm.system_prompt",
        "What the agent is told about the business and how to answer.",
    ),
    set("llm.timeout", "How long one model call may take."),
    set(
        "llm.turn_timeout",
        "How long a whole agent turn may take (every call and tool).",
    ),
    set(
        "llm.attempts",
        "Tries per provider and call (429, 5xx and timeouts are retried).",
    ),
    set(
        "llm.backoff",
        "The wait after a failed call, doubled after each further one.",
    ),
    set(
        "llm.max_concurrent",
        "Model calls in flight at once on this node (per provider): the budget that bounds a surge, not engine.turns_per_node.",
    ),
    opt(
        "llm.requests_per_minute",
        "This node's share of the provider's requests per minute (your tier's limit over the worker nodes): calls are spaced within it.",
        "500",
    ),
    opt(
        "llm.tokens_per_minute",
        "This node's share of the provider's tokens per minute: each call's estimate holds the next back, corrected by what it used.",
        "200000",
    ),
    set(
        "llm.max_tool_rounds",
        "Rounds of tool calls before the agent must answer.",
    ),
    set(
        "llm.history_tokens",
        "Roughly how many tokens of earlier conversation the model sees.",
    ),
    set(
        "llm.max_tool_calls",
        "Tool calls run in one round; the model's further calls are answered with an error, not run.",
    ),
    set(
        "llm.max_tool_answer_bytes",
        "A tool's answer is cut to this many bytes before the model reads it.",
    ),
    set(
        "llm.turn_prompt_tokens",
        "Estimated prompt tokens all of a turn's model calls may send together; a turn that would send more goes to a person.",
    ),
    set(
        "llm.max_argument_chars",
        "The most characters of a tool's string argument whose schema sets no maxLength.",
    ),
    set(
        "llm.allowed_link_hosts",
        "Hosts an answer may link to (with their subdomains, like \"example.com\"); any other link, or a javascript: one, is not sent. Empty: no links.",
    ),
    set(
        "llm.redact",
        "Mask phone and account numbers before text leaves for the model.",
    ),
    set(
        "llm.prompt_price",
        "Price per million prompt tokens, for the cost estimate.",
    ),
    set(
        "llm.completion_price",
        "Price per million completion tokens.",
    ),
    opt(
        "llm.transcribe_base_url",
        "Speech-to-text base URL for voice notes; the LLM's when unset.",
        "\"http://127.0.0.1:8000/v1\"",
    ),
    opt(
        "llm.transcribe_api_key",
        "Speech-to-text key; the LLM's when unset.",
        "\"sk-...\"",
    ),
    set("llm.transcribe_model", "The speech-to-text model."),
    opt(
        "llm.transcribe_language",
        "The voice notes' language (ISO-639-1), passed to the transcription; unset: detected.",
        "\"en\"",
    ),
    opt(
        "llm.transcribe_prompt",
        "Words to bias the transcription towards: product names, Pidgin spellings.",
        "\"Sabi Bank, abeg, wetin, dey, account balance\"",
    ),
    opt(
        "llm.temperature",
        "Sampling temperature; 0 for tool use, so one question gets one tool decision. Unset: the provider's.",
        "0",
    ),
    opt(
        "llm.top_p",
        "Nucleus sampling; unset: the provider's.",
        "1.0",
    ),
    opt(
        "llm.max_tokens",
        "The most tokens an answer may have; an answer cut off there is never sent.",
        "512",
    ),
    opt(
        "llm.seed",
        "A fixed sampling seed, where the provider honours one.",
        "42",
    ),
    opt(
        "llm.extra",
        "A table merged into every chat request: a provider's own options.",
        "{ repeat_penalty = 1.1 }",
    ),
    set(
        "llm.media_max_bytes",
        "The largest voice note downloaded for transcription.",
    ),
    opt(
        "llm.fallback",
        "A second provider, tried when the first is out of tries.",
        "[llm.fallback]\nbase_url = \"http://127.0.0.1:11434/v1\"\nmodel = \"llama3.1\"",
    ),
    set(
        "engine.lease",
        "How long a claimed batch is held; renewed every quarter of it.",
    ),
    set(
        "engine.review_after",
        "A batch whose first message reached Sabi this late (an outage, Meta's retries) goes to a person instead of an automatic reply.",
    ),
    opt(
        "engine.queued_review_after",
        "A batch that waited in Sabi's own queue (a surge) longer than this goes to a person; unset, it is answered however long it waited.",
        "\"30m\"",
    ),
    set(
        "engine.hold_after",
        "A WhatsApp customer whose turn is expected further off than this gets one holding message with the expected wait, and the answer follows; 0: never.",
    ),
    set(
        "engine.hold_message",
        "The holding message; {wait} becomes the expected wait, like \"about 5 minutes\".",
    ),
    set(
        "engine.human_hold",
        "After a person replies to a customer (the desk, the admin API, or the WhatsApp Business app on the same number), the assistant stands down in that conversation this long, renewed by each reply: what the customer writes meanwhile goes to the person.",
    ),
    set(
        "engine.shutdown_grace",
        "How long running work may take to finish at shutdown.",
    ),
    set("engine.turns_per_node", "Turns at once on one node."),
    set(
        "engine.max_attempts",
        "Tries of a turn before its batch goes to review.",
    ),
    set(
        "engine.retry_base",
        "The wait after a failed turn, doubled after each further failure.",
    ),
    set(
        "engine.poll_interval",
        "How often a worker asks the store for work other nodes stored.",
    ),
    set(
        "engine.sandbox_reply_delay",
        "The sandbox acknowledgement's thinking time.",
    ),
    set(
        "ingress.max_body_bytes",
        "Largest request body accepted (Meta sends up to 3 MB).",
    ),
    set(
        "ingress.header_timeout",
        "A client must send a request's headers within this; slower ones are dropped.",
    ),
    set(
        "ingress.body_timeout",
        "...and the whole body within this (408 otherwise).",
    ),
    set(
        "ingress.max_connections",
        "Connections open at once on one node (kept within the open-file limit); new ones are closed beyond it.",
    ),
    set(
        "ingress.max_large_bodies",
        "Bodies over 64 KiB read at once by the webhook, and as many again by every other route; more get 503 at once (Meta retries).",
    ),
    set(
        "ingress.max_connections_per_address",
        "Connections open at once from one client address (an IPv6 client's /64); new ones beyond are closed. A trusted proxy is not capped: set its own per-client limit.",
    ),
    set(
        "ingress.max_body_bytes_per_address",
        "Bytes of request bodies being read at once for one client address, small bodies included (each counts its declared length); more get 503 at once.",
    ),
    set(
        "ingress.write_timeout",
        "A client that reads nothing of its answer for this long is dropped.",
    ),
    set(
        "ingress.max_connection_age",
        "A connection this old takes no new request (event streams excepted).",
    ),
    set(
        "ingress.max_requests_per_connection",
        "Requests one connection carries, pipelined or not; the last answer closes it.",
    ),
    set(
        "ingress.webhook_allow",
        "Networks the WhatsApp webhook accepts (CIDR, like Meta's published ranges); empty accepts any.",
    ),
    set(
        "ingress.trusted_proxies",
        "Proxies whose X-Forwarded-For is believed (CIDR).",
    ),
    opt(
        "admin.token",
        "Bearer token of the admin API and the review desk; unset turns them off.",
        "\"a-long-random-token\"",
    ),
    opt(
        "admin.metrics_token",
        "Bearer token /metrics requires; unset leaves it open (keep it off the internet at your proxy).",
        "\"another-long-random-token\"",
    ),
    set(
        "router.enabled",
        "Answer routine messages locally; off sends every batch to the agent.",
    ),
    opt(
        "router.intents_file",
        "The intents file; the built-in one when unset (`sabi route --print-intents`).",
        "\"/etc/sabi/intents.toml\"",
    ),
    opt(
        "router.packs",
        "The intent packs the business answers (the built-in file: bank, shop, telco), besides greetings, thanks and a person; the rest goes to the agent. Unset: every pack.",
        "[\"shop\"]",
    ),
    set(
        "router.max_wrong_rate",
        "The share of local answers that may be wrong; `sabi route --calibrate` sets thresholds to meet it.",
    ),
    opt(
        "handoff.chatwoot",
        "Hand-offs also go to a Chatwoot API-channel inbox, with the transcript; its agents' replies come back through POST /webhook/chatwoot, and resolving the conversation gives the customer back to the assistant (README: Hand-offs into Chatwoot). SABI_CHATWOOT_BASE_URL, _API_TOKEN, _ACCOUNT_ID, _INBOX_ID, _WEBHOOK_SECRET.",
        "[handoff.chatwoot]\nbase_url = \"https://app.chatwoot.com\"\napi_token = \"an-agents-access-token\"\naccount_id = 1\ninbox_id = 7\nwebhook_secret = \"the-inbox-webhook-secret\"\nmirror_every = \"2s\"",
    ),
    opt(
        "handoff.webhook",
        "Instead of Chatwoot, hand-offs go to any help desk as signed JSON events (opened, handed_over, message, notice) posted to url; the desk posts its agents' replies and resolutions to POST /webhook/desk, signed with the same secret (README: Hand-offs into another help desk). SABI_DESK_WEBHOOK_URL, SABI_DESK_WEBHOOK_SECRET.",
        "[handoff.webhook]\nurl = \"https://desk.example.com/sabi\"\nsecret = \"a-long-shared-secret\"\nmirror_every = \"2s\"",
    ),
    set(
        "broadcast.cooldown",
        "A customer sent a broadcast this recently is skipped by the next.",
    ),
    set(
        "broadcast.max_holds",
        "Holds for Meta's marketing limit per user (131049, a day each) before a recipient fails.",
    ),
    opt(
        "broadcast.prices",
        "What Meta charges for one marketing template message, by country prefix (the longest that matches): a broadcast's report estimates its cost before and counts it after.",
        "{ \"234\" = 0.0516, \"91\" = 0.0107, \"44\" = 0.0705 }",
    ),
    set("broadcast.currency", "The currency of broadcast.prices."),
    set(
        "broadcast.stop_reply",
        "Told once to a WhatsApp customer who writes STOP (or its Pidgin, Yoruba, Igbo or Hausa equivalents): they get no broadcasts until START.",
    ),
    set(
        "broadcast.start_reply",
        "Told once to a customer who writes START and gets broadcasts again.",
    ),
    set(
        "broadcast.stop_offer",
        "After a bare STOP that may have answered the assistant's question: the answer comes first, then this with a Stop offers button, so opting out is the customer's choice. No question mark at the end.",
    ),
    set(
        "retention.messages",
        "Customer messages, Sabi's and people's replies, settled review items, web-chat history and jobs, and the turns they were in: deleted this long after the turn ended (a message still waiting for its turn is kept).",
    ),
    set(
        "retention.statuses",
        "Delivery and read statuses, and the other recorded items (errors, account events).",
    ),
    set(
        "retention.quarantine",
        "Quarantined raw bodies Sabi could not read.",
    ),
    set(
        "retention.dedupe",
        "How long a message's deduplication key (a hash) outlives its content, so Meta's late retry is never answered again; with retention.messages it must cover Meta's 7 days of retries once replies go to WhatsApp.",
    ),
    set(
        "retention.sweep_every",
        "How often the sweeper (one node at a time) deletes what is past its horizon.",
    ),
    opt(
        "privacy.marker_secret",
        "Keys the do-not-contact markers and erased messages' hashes (HMAC-SHA256): at least 16 characters, kept outside the store and its backups. Required once an access token is set or the store is PostgreSQL or Redis; in sandbox mode on SQLite, Sabi makes one beside the database (marker-secret).",
        "\"a-long-random-secret\"",
    ),
    opt(
        "privacy.previous_marker_secrets",
        "To rotate: the secrets used before marker_secret, oldest first. The store's markers move to the new secret at start; keep the old ones listed, markers are found through each in turn.",
        // Not a table: a leading space keeps the renderer from taking the array for one.
        " [\"the-old-marker-secret\"]",
    ),
    set("logging.format", "text, or json (one object per line)."),
    set(
        "logging.customer_data",
        "Put customers' phone numbers and words in the logs (off: a hash names the conversation).",
    ),
    opt(
        "external_agent",
        "Your own agent instead of the built-in one: Sabi posts signed batches and sends its answers.",
        "[external_agent]\nurl = \"https://agent.example.com/turn\"\nsecret = \"shared-secret\"\ntimeout = \"2m\"",
    ),
    opt(
        "tools",
        "The business's HTTP tools, for reply templates and the agent (repeat the table per tool).",
        "[[tools]]\nname = \"order_status\"\ndescription = \"Where an order is\"\nparameters = { type = \"object\", properties = { order_id = { type = \"string\" } }, required = [\"order_id\"] }\nmethod = \"GET\"\nurl = \"https://api.example.com/orders/{order_id}?customer={customer}\"\npublic = false\nheaders = { Authorization = \"Bearer ${ORDERS_API_TOKEN}\" }\ntimeout = \"5s\"",
    ),
];

/// The commented example, every value from the configuration's defaults.
///
/// # Errors
/// When the defaults do not serialise (a bug the tests catch).
pub fn example() -> Result<String, Error> {
    let defaults = Config::defaults()?;
    let table = toml::Table::try_from(&defaults)
        .map_err(|e| Error(format!("serialising the defaults: {e}")))?;
    let mut out = String::from(
        "# sabi.toml: every setting with its default. Lines starting with `#` and a letter are\n\
         # optional settings: remove the `#` to use them. SABI_* environment variables override\n\
         # this file.\n",
    );
    let mut section = "";
    let mut blocks: Vec<&Setting> = Vec::new();
    for setting in SETTINGS {
        let (head, key) = setting.path.split_once('.').unwrap_or(("", setting.path));
        let head = if setting.unset.is_some_and(is_block) && head.is_empty() {
            key
        } else {
            head
        };
        if head != section {
            flush(&mut out, &mut blocks);
            section = head;
            if !section.is_empty() && table.get(section).is_some_and(toml::Value::is_table) {
                out.push_str(&format!("\n[{section}]\n"));
            }
        }
        match setting.unset {
            Some(block) if is_block(block) => blocks.push(setting),
            unset => {
                out.push_str(&doc_lines(setting));
                let value = lookup(&table, setting.path);
                match (value, unset) {
                    (Some(value), _) => out.push_str(&format!("{key} = {value}\n")),
                    (None, Some(example)) => out.push_str(&format!("#{key} = {example}\n")),
                    (None, None) => {
                        return Err(Error(format!(
                            "{}: no default and no example",
                            setting.path
                        )));
                    }
                }
            }
        }
    }
    flush(&mut out, &mut blocks);
    Ok(out)
}

/// An example that is a whole table (`[llm.fallback]` and its lines), not an array value
/// (`["shop"]`).
fn is_block(unset: &str) -> bool {
    unset.starts_with('[') && unset.contains('\n')
}

fn flush(out: &mut String, blocks: &mut Vec<&Setting>) {
    for setting in blocks.drain(..) {
        out.push('\n');
        out.push_str(&doc_lines(setting));
        for line in setting.unset.unwrap_or_default().lines() {
            out.push('#');
            out.push_str(line);
            out.push('\n');
        }
    }
}

fn doc_lines(setting: &Setting) -> String {
    let env = ENV
        .iter()
        .find(|(_, path)| *path == setting.path)
        .map(|(var, _)| format!(" ({var})"))
        .unwrap_or_default();
    format!("# {}{env}\n", setting.doc)
}

fn lookup<'a>(table: &'a toml::Table, path: &str) -> Option<&'a toml::Value> {
    let mut parts = path.split('.');
    let mut value = table.get(parts.next()?)?;
    for part in parts {
        value = value.as_table()?.get(part)?;
    }
    Some(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(text: &str) -> Result<Config, Error> {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("sabi.toml");
        std::fs::write(&file, text).expect("write");
        Config::load(Some(&file), Vec::new())
    }

    fn leaves(prefix: &str, table: &toml::Table, out: &mut Vec<String>) {
        for (key, value) in table {
            let path = if prefix.is_empty() {
                key.clone()
            } else {
                format!("{prefix}.{key}")
            };
            match value {
                toml::Value::Table(inner) => leaves(&path, inner, out),
                _ => out.push(path),
            }
        }
    }

    #[test]
    fn every_default_is_documented() {
        let defaults = Config::defaults().expect("defaults");
        let table = toml::Table::try_from(&defaults).expect("serialise");
        let mut paths = Vec::new();
        leaves("", &table, &mut paths);
        for path in paths {
            assert!(
                SETTINGS.iter().any(|s| s.path == path),
                "{path} has no entry in the example"
            );
        }
    }

    #[test]
    fn the_example_loads_as_it_is_and_with_everything_switched_on() {
        let text = example().expect("example");
        let plain = load(&text).expect("the example loads");
        assert_eq!(plain.listen, Config::defaults().expect("defaults").listen);
        // Every optional line uncommented: each names a real setting with a valid value. The
        // two help desks exclude each other: Chatwoot's stays on.
        let uncomment = |all: bool| {
            let mut webhook = false;
            text.lines()
                .map(|line| {
                    webhook = match line {
                        "#[handoff.webhook]" => true,
                        "" => false,
                        _ => webhook,
                    };
                    match line.strip_prefix('#') {
                        Some(rest) if !rest.starts_with(' ') && !rest.is_empty() => {
                            if webhook && !all { line } else { rest }
                        }
                        _ => line,
                    }
                })
                .collect::<Vec<_>>()
                .join("\n")
        };
        let both = load(&uncomment(true)).expect_err("two help desks");
        assert!(both.to_string().contains("one help desk"), "{both}");
        let on = uncomment(false);
        let full = load(&on).unwrap_or_else(|e| panic!("{e}\n{on}"));
        assert!(full.external_agent.is_some() && full.llm.fallback.is_some());
        assert_eq!(full.tools.len(), 1);
        assert!(!full.whatsapp.sandbox());
    }
}
