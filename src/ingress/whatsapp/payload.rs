//! PURE: a verified WhatsApp Cloud API webhook body -> every inbound item it carries.
//!
//! Every entry, change, message, status and error is read; nothing is taken from `[0]`. A body
//! that is not JSON is an error (the caller answers 400). JSON of a shape Sabi does not know is
//! never refused: the whole body, or the one message or status that does not fit, is returned
//! as [`Quarantined`] so it is kept raw. Unknown fields are ignored and unknown message types are
//! kept with their type.

use serde::Deserialize;
use serde::de::IgnoredAny;
use serde_json::value::RawValue;
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};

use crate::clock::UnixSeconds;
use crate::domain::{Channel, ConversationKey, InboundItem, ItemKind, Quarantined};

/// What one delivery carried.
#[derive(Debug, Default, PartialEq)]
pub struct Parsed {
    pub items: Vec<InboundItem>,
    pub quarantined: Vec<Quarantined>,
}

/// The body is not JSON at all (or not UTF-8): Meta never sends that, so it is refused.
#[derive(Debug, thiserror::Error)]
#[error("body is not JSON: {0}")]
pub struct NotJson(String);

/// Message types that never start a turn: they are stored and deliberately skipped. A `revoke`
/// (the customer deleted a message) or an `edit` changes the message it names while that still
/// waits for its turn (see `store::items::amendment`), and is kept as a fact.
const NOT_A_TURN: &[&str] = &["reaction", "system", "revoke", "edit"];

/// Parses a verified body.
///
/// # Errors
/// [`NotJson`] when the bytes are not UTF-8 JSON; every other problem is quarantined.
pub fn parse(body: &[u8]) -> Result<Parsed, NotJson> {
    let text = std::str::from_utf8(body).map_err(|e| NotJson(e.to_string()))?;
    let envelope: Envelope<'_> = match serde_json::from_str(text) {
        Ok(envelope) => envelope,
        Err(e) if e.is_data() => return Ok(quarantine_whole(text, &e.to_string())),
        Err(e) => return Err(NotJson(e.to_string())),
    };
    if envelope.object != "whatsapp_business_account" {
        let reason = format!("unknown object {:?}", envelope.object);
        return Ok(quarantine_whole(text, &reason));
    }
    let mut parsed = Parsed::default();
    for entry in &envelope.entry {
        for change in &entry.changes {
            parse_change(entry, change, &mut parsed);
        }
    }
    Ok(parsed)
}

fn quarantine_whole(text: &str, reason: &str) -> Parsed {
    Parsed {
        items: Vec::new(),
        quarantined: vec![quarantined(reason, text)],
    }
}

fn quarantined(reason: &str, raw: &str) -> Quarantined {
    Quarantined {
        channel: Channel::Whatsapp,
        reason: reason.to_owned(),
        raw: raw.to_owned(),
    }
}

fn parse_change(entry: &Entry<'_>, change: &Change<'_>, out: &mut Parsed) {
    if change.field == ECHOES {
        return parse_echoes(entry, change, out);
    }
    if change.field != "messages" {
        out.items.push(field_event(entry, change));
        return;
    }
    let Some(value) = change_value::<MessagesValue<'_>>(entry, change, out) else {
        return;
    };
    let scope = Scope::of(entry, change, value.metadata.as_ref());
    // A sender profile of an odd shape only costs its name, never the messages.
    let contacts: Vec<Contact> = value
        .contacts
        .iter()
        .filter_map(|raw| serde_json::from_str(raw.get()).ok())
        .collect();
    for raw in &value.messages {
        match serde_json::from_str::<Message>(raw.get()) {
            Ok(message) => out.items.push(message_item(&scope, &contacts, message)),
            Err(e) => out
                .quarantined
                .push(quarantined(&format!("message: {e}"), raw.get())),
        }
    }
    for raw in &value.statuses {
        match serde_json::from_str::<Status>(raw.get()) {
            Ok(status) => out.items.push(status_item(&scope, status)),
            Err(e) => out
                .quarantined
                .push(quarantined(&format!("status: {e}"), raw.get())),
        }
    }
    if carries_more(change.value.get()) {
        // Echoes of the business's own messages, calls and whatever Meta adds next: kept whole.
        out.items.push(field_event(entry, change));
    }
    let value_hash = content_hash(&[
        &entry.id,
        &entry_time(entry),
        &change.field,
        change.value.get(),
    ]);
    for (index, raw) in value.errors.iter().enumerate() {
        match serde_json::from_str::<ErrorObject>(raw.get()) {
            Ok(error) => out
                .items
                .push(value_error_item(&scope, &error, &value_hash, index)),
            Err(e) => out
                .quarantined
                .push(quarantined(&format!("error: {e}"), raw.get())),
        }
    }
}

/// The field of what a person typed in the WhatsApp Business app on a number Sabi also serves
/// (coexistence). `history` and `smb_app_state_sync` (the app's past and its contacts) are kept
/// as field events like any other field, and never routed.
const ECHOES: &str = "smb_message_echoes";

/// The business's own messages from the app: each kept as an [`ItemKind::Echo`] of its
/// conversation, never a turn.
fn parse_echoes(entry: &Entry<'_>, change: &Change<'_>, out: &mut Parsed) {
    let Some(value) = change_value::<EchoesValue<'_>>(entry, change, out) else {
        return;
    };
    let scope = Scope::of(entry, change, value.metadata.as_ref());
    for raw in &value.message_echoes {
        let parsed = serde_json::from_str::<Message>(raw.get())
            .and_then(|m| Ok((m, serde_json::from_str::<EchoTo>(raw.get())?)));
        match parsed {
            Ok((message, to)) => out.items.push(echo_item(&scope, message, to)),
            Err(e) => out
                .quarantined
                .push(quarantined(&format!("echo: {e}"), raw.get())),
        }
    }
}

fn echo_item(scope: &Scope<'_>, m: Message, to: EchoTo) -> InboundItem {
    let to_number = non_empty(to.to);
    let to_user_id = non_empty(to.to_user_id);
    let content = Content::of(&m);
    let mut facts = json!({
        "kind": "echo",
        "entry_id": scope.entry_id,
        "field": scope.field,
        "phone_number_id": scope.phone_number_id,
        "id": m.id,
        "from": non_empty(m.from.clone()),
        "to": to_number,
        "to_user_id": to_user_id,
        "type": m.kind,
        "timestamp": m.timestamp.0,
    });
    let map = facts
        .as_object_mut()
        .expect("json! of an object literal is an object");
    content.add_facts(&m, map);
    InboundItem {
        kind: ItemKind::Echo,
        channel: Channel::Whatsapp,
        // Outbound ids live beside inbound ones: kept apart all the same.
        dedupe_key: format!("echo:{}", m.id),
        business: scope.phone_number_id.map(str::to_owned),
        customer: to_number.or(to_user_id),
        item_type: Some(m.kind),
        text: content.text,
        media_id: content.media_id,
        provider_ts: Some(UnixSeconds(m.timestamp.0)),
        turn: None,
        facts,
    }
}

/// Whether a `messages` change also carries lists Sabi does not read one by one
/// (`message_echoes`, `calls`, …).
fn carries_more(value: &str) -> bool {
    const READ: &[&str] = &["messages", "statuses", "errors", "contacts"];
    serde_json::from_str::<Map<String, Value>>(value).is_ok_and(|value| {
        value.iter().any(|(key, v)| {
            !READ.contains(&key.as_str()) && v.as_array().is_some_and(|a| !a.is_empty())
        })
    })
}

/// A change's value read as `T`; a value of another shape is quarantined whole.
fn change_value<'a, T: Deserialize<'a>>(
    entry: &Entry<'_>,
    change: &Change<'a>,
    out: &mut Parsed,
) -> Option<T> {
    match serde_json::from_str(change.value.get()) {
        Ok(value) => Some(value),
        Err(e) => {
            let reason = format!("{} value of entry {}: {e}", change.field, entry.id);
            out.quarantined
                .push(quarantined(&reason, change.value.get()));
            None
        }
    }
}

/// Where an item sits in the delivery.
struct Scope<'a> {
    entry_id: &'a str,
    field: &'a str,
    phone_number_id: Option<&'a str>,
}

impl<'a> Scope<'a> {
    fn of(entry: &'a Entry<'_>, change: &'a Change<'_>, metadata: Option<&'a Metadata>) -> Self {
        Scope {
            entry_id: &entry.id,
            field: &change.field,
            phone_number_id: metadata.map(|m| m.phone_number_id.as_str()),
        }
    }
}

fn message_item(scope: &Scope<'_>, contacts: &[Contact], m: Message) -> InboundItem {
    let (from, from_user_id) = sender(&m, contacts);
    let contact_name = contact_name(contacts, from.as_deref(), from_user_id.as_deref());
    let content = Content::of(&m);
    let mut facts = json!({
        "kind": "message",
        "entry_id": scope.entry_id,
        "field": scope.field,
        "phone_number_id": scope.phone_number_id,
        "id": m.id,
        "from": from,
        "from_user_id": from_user_id,
        "contact_name": contact_name,
        "type": m.kind,
        "timestamp": m.timestamp.0,
    });
    let map = facts
        .as_object_mut()
        .expect("json! of an object literal is an object");
    // Only for linked portfolios: other messages' facts stay as they were.
    put(
        map,
        "from_parent_user_id",
        &non_empty(m.from_parent_user_id.clone()),
    );
    content.add_facts(&m, map);

    let customer = from.clone().or_else(|| from_user_id.clone());
    let turn = match (scope.phone_number_id, &customer) {
        (Some(business), Some(customer)) if !NOT_A_TURN.contains(&m.kind.as_str()) => {
            Some(ConversationKey {
                channel: Channel::Whatsapp,
                business: business.to_owned(),
                customer: customer.clone(),
            })
        }
        _ => None,
    };
    InboundItem {
        kind: ItemKind::Message,
        channel: Channel::Whatsapp,
        dedupe_key: m.id,
        business: scope.phone_number_id.map(str::to_owned),
        customer,
        item_type: Some(m.kind),
        text: content.text,
        media_id: content.media_id,
        provider_ts: Some(UnixSeconds(m.timestamp.0)),
        turn,
        facts,
    }
}

/// The sender's phone number and business-scoped id. A message that names neither is from the
/// change's one contact, when there is exactly one.
fn sender(m: &Message, contacts: &[Contact]) -> (Option<String>, Option<String>) {
    let from = non_empty(m.from.clone());
    let user_id = non_empty(m.from_user_id.clone());
    match (from, user_id, contacts) {
        (None, None, [only]) => (
            non_empty(only.wa_id.clone()),
            non_empty(only.user_id.clone()),
        ),
        (from, user_id, _) => (from, user_id),
    }
}

fn status_item(scope: &Scope<'_>, s: Status) -> InboundItem {
    let recipient_id = non_empty(s.recipient_id);
    let recipient_user_id = non_empty(s.recipient_user_id);
    let error_codes: Vec<i64> = s.errors.iter().map(|e| e.code).collect();
    let facts = json!({
        "kind": "status",
        "entry_id": scope.entry_id,
        "field": scope.field,
        "phone_number_id": scope.phone_number_id,
        "id": s.id,
        "recipient_id": recipient_id,
        "recipient_user_id": recipient_user_id,
        "status": s.status,
        "timestamp": s.timestamp.0,
        "error_codes": error_codes,
        "biz_opaque_callback_data": s.biz_opaque_callback_data,
        "pricing_model": s.pricing.as_ref().and_then(|p| p.pricing_model.clone()),
        "pricing_category": s.pricing.as_ref().and_then(|p| p.category.clone()),
        "pricing_type": s.pricing.as_ref().and_then(|p| p.kind.clone()),
        "pricing_billable": s.pricing.as_ref().and_then(|p| p.billable.as_ref()?.as_bool()),
        "conversation_id": s.conversation.and_then(|c| c.id),
    });
    InboundItem {
        kind: ItemKind::Status,
        channel: Channel::Whatsapp,
        dedupe_key: format!("{}:{}", s.id, s.status),
        business: scope.phone_number_id.map(str::to_owned),
        customer: recipient_id.or(recipient_user_id),
        item_type: Some(s.status),
        text: None,
        media_id: None,
        provider_ts: Some(UnixSeconds(s.timestamp.0)),
        turn: None,
        facts,
    }
}

fn value_error_item(scope: &Scope<'_>, e: &ErrorObject, hash: &str, index: usize) -> InboundItem {
    let facts = json!({
        "kind": "value_error",
        "entry_id": scope.entry_id,
        "field": scope.field,
        "phone_number_id": scope.phone_number_id,
        "code": e.code,
        "title": e.title,
        "details": e.error_data.as_ref().and_then(|d| d.details.clone()),
    });
    InboundItem {
        kind: ItemKind::ValueError,
        channel: Channel::Whatsapp,
        dedupe_key: format!("error:{hash}:{index}"),
        business: scope.phone_number_id.map(str::to_owned),
        customer: None,
        item_type: Some(e.code.to_string()),
        text: e.title.clone(),
        media_id: None,
        provider_ts: None,
        turn: None,
        facts,
    }
}

/// A change of any field other than `messages`: kept whole, with the few facts worth indexing.
fn field_event(entry: &Entry<'_>, change: &Change<'_>) -> InboundItem {
    let value: Value = serde_json::from_str(change.value.get()).unwrap_or(Value::Null);
    let event = value
        .get("event")
        .and_then(Value::as_str)
        .map(str::to_owned);
    let mut facts = json!({
        "kind": "field_event",
        "entry_id": entry.id,
        "field": change.field,
        "event": event,
        "entry_time": entry.time,
    });
    if let Some(prefs) = value.get("user_preferences").and_then(Value::as_array) {
        let prefs: Vec<Value> = prefs
            .iter()
            .map(|p| json!({"wa_id": p.get("wa_id"), "category": p.get("category"), "value": p.get("value")}))
            .collect();
        facts["preferences"] = Value::Array(prefs);
    }
    facts["value"] = value;
    let hash = content_hash(&[
        &entry.id,
        &entry_time(entry),
        &change.field,
        change.value.get(),
    ]);
    InboundItem {
        kind: ItemKind::FieldEvent,
        channel: Channel::Whatsapp,
        dedupe_key: format!("field:{hash}"),
        business: None,
        customer: None,
        item_type: Some(change.field.clone()),
        text: None,
        media_id: None,
        provider_ts: entry.time.map(UnixSeconds),
        turn: None,
        facts,
    }
}

/// The readable text and media of a message, by type.
#[derive(Default)]
struct Content {
    text: Option<String>,
    media_id: Option<String>,
}

impl Content {
    fn of(m: &Message) -> Content {
        let media = m.media();
        let text = match m.kind.as_str() {
            "text" => m.text.as_ref().and_then(|t| t.body.clone()),
            "image" | "video" | "document" => media.and_then(|md| md.caption.clone()),
            "interactive" => m.interactive.as_ref().and_then(Interactive::text),
            "button" => m.button.as_ref().and_then(|b| b.text.clone()),
            "order" => m.order.as_ref().and_then(|o| o.text.clone()),
            "system" => m.system.as_ref().and_then(|s| s.body.clone()),
            "edit" => m.edit.as_ref().and_then(edited_text),
            _ => None,
        };
        Content {
            text: non_empty(text),
            media_id: media.and_then(|md| md.id.clone()),
        }
    }

    /// The optional facts: present only when the message carries them.
    fn add_facts(&self, m: &Message, f: &mut Map<String, Value>) {
        if let Some(md) = m.media() {
            put(f, "media_id", &md.id);
            put(f, "mime_type", &md.mime_type);
            put(f, "filename", &md.filename);
            put(f, "voice", &md.voice);
            put(f, "animated", &md.animated);
            if matches!(m.kind.as_str(), "image" | "video" | "document") {
                f.insert("caption".into(), json!(non_empty(md.caption.clone())));
            }
        }
        if let Some(c) = &m.context {
            put(f, "context_id", &c.id);
            put(f, "context_from", &c.from);
            put(f, "forwarded", &c.forwarded);
            put(f, "frequently_forwarded", &c.frequently_forwarded);
        }
        if let Some(r) = &m.referral {
            put(f, "referral_source_id", &r.source_id);
            put(f, "referral_ctwa_clid", &r.ctwa_clid);
        }
        if let Some(r) = &m.reaction {
            put(f, "reaction_message_id", &r.message_id);
            f.insert("emoji".into(), json!(non_empty(r.emoji.clone())));
        }
        if m.kind == "interactive" {
            let i = m.interactive.as_ref();
            f.insert(
                "interactive_type".into(),
                json!(i.and_then(|i| i.kind.clone())),
            );
            if let Some(reply) = i.and_then(|i| i.button_reply.as_ref().or(i.list_reply.as_ref())) {
                put(f, "reply_id", &reply.id);
            }
            if let Some(nfm) = i.and_then(|i| i.nfm_reply.as_ref()) {
                put(f, "flow_response_json", &nfm.response_json);
            }
        }
        if let Some(b) = &m.button {
            put(f, "button_payload", &b.payload);
        }
        if let Some(l) = &m.location {
            put(f, "latitude", &l.latitude);
            put(f, "longitude", &l.longitude);
            put(f, "location_name", &l.name);
            put(f, "location_address", &l.address);
        }
        if let Some(cards) = &m.contacts {
            f.insert("contacts_count".into(), json!(cards.len()));
        }
        if let Some(o) = &m.order {
            put(f, "order_catalog_id", &o.catalog_id);
            f.insert("order_item_count".into(), json!(o.product_items.len()));
        }
        if let Some(s) = &m.system {
            put(f, "system_type", &s.kind);
            put(f, "system_new_wa_id", &s.wa_id);
            put(f, "system_new_user_id", &s.user_id);
        }
        if let Some(u) = &m.unsupported {
            put(f, "unsupported_type", &u.kind);
        }
        let amended = match m.kind.as_str() {
            "revoke" => m.revoke.as_ref(),
            "edit" => m.edit.as_ref(),
            _ => None,
        };
        if let Some(original) = amended
            .and_then(original_id)
            .or_else(|| amended.and(m.context.as_ref()).and_then(|c| c.id.clone()))
        {
            f.insert("amends".into(), json!(original));
        }
        if !m.errors.is_empty() {
            let codes: Vec<i64> = m.errors.iter().map(|e| e.code).collect();
            f.insert("error_codes".into(), json!(codes));
        }
    }
}

/// The message a `revoke` or `edit` names.
fn original_id(change: &Value) -> Option<String> {
    ["original_message_id", "message_id", "id"]
        .iter()
        .find_map(|key| change.get(key)?.as_str())
        .filter(|id| !id.is_empty())
        .map(str::to_owned)
}

/// An edit's new text: the edited message's body, or its media's caption.
fn edited_text(edit: &Value) -> Option<String> {
    let message = edit.get("message").unwrap_or(edit);
    let kind = message
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("text");
    let content = message.get(kind)?;
    ["body", "caption"]
        .iter()
        .find_map(|key| content.get(key)?.as_str())
        .map(str::to_owned)
}

fn put<T: serde::Serialize>(facts: &mut Map<String, Value>, key: &str, value: &Option<T>) {
    if let Some(v) = value {
        facts.insert(key.to_owned(), json!(v));
    }
}

/// The sender's profile name: matched by phone or user id, or the only contact there is.
fn contact_name(contacts: &[Contact], from: Option<&str>, user_id: Option<&str>) -> Option<String> {
    let matches = |c: &&Contact| {
        (from.is_some() && c.wa_id.as_deref() == from)
            || (user_id.is_some() && c.user_id.as_deref() == user_id)
    };
    let contact = contacts.iter().find(matches).or(match contacts {
        [only] => Some(only),
        _ => None,
    });
    contact.and_then(|c| c.profile.as_ref()?.name.clone())
}

/// Two events with the same body at different times are two events.
fn entry_time(entry: &Entry<'_>) -> String {
    entry.time.map(|t| t.to_string()).unwrap_or_default()
}

fn non_empty(s: Option<String>) -> Option<String> {
    s.filter(|s| !s.is_empty())
}

/// A stable hash for items that have no provider id: redeliveries hash the same.
fn content_hash(parts: &[&str]) -> String {
    let mut hasher = Sha256::new();
    for part in parts {
        hasher.update(part.as_bytes());
        hasher.update([0]);
    }
    hex::encode(&hasher.finalize()[..16])
}

// ---- wire shapes: only what Sabi reads; everything else is ignored ----

#[derive(Deserialize)]
struct Envelope<'a> {
    object: String,
    #[serde(borrow)]
    entry: Vec<Entry<'a>>,
}

#[derive(Deserialize)]
struct Entry<'a> {
    #[serde(deserialize_with = "lenient::string")]
    id: String,
    #[serde(default)]
    time: Option<i64>,
    #[serde(borrow, default)]
    changes: Vec<Change<'a>>,
}

#[derive(Deserialize)]
struct Change<'a> {
    field: String,
    #[serde(borrow)]
    value: &'a RawValue,
}

#[derive(Deserialize)]
struct MessagesValue<'a> {
    #[serde(default)]
    metadata: Option<Metadata>,
    #[serde(borrow, default)]
    contacts: Vec<&'a RawValue>,
    #[serde(borrow, default)]
    messages: Vec<&'a RawValue>,
    #[serde(borrow, default)]
    statuses: Vec<&'a RawValue>,
    #[serde(borrow, default)]
    errors: Vec<&'a RawValue>,
}

#[derive(Deserialize)]
struct EchoesValue<'a> {
    #[serde(default)]
    metadata: Option<Metadata>,
    #[serde(borrow, default)]
    message_echoes: Vec<&'a RawValue>,
}

/// Whom an echo went to.
#[derive(Deserialize)]
struct EchoTo {
    to: Option<String>,
    to_user_id: Option<String>,
}

#[derive(Deserialize)]
struct Metadata {
    #[serde(deserialize_with = "lenient::string")]
    phone_number_id: String,
}

#[derive(Deserialize)]
struct Contact {
    wa_id: Option<String>,
    user_id: Option<String>,
    profile: Option<Profile>,
}

#[derive(Deserialize)]
struct Profile {
    name: Option<String>,
}

#[derive(Deserialize)]
struct Message {
    from: Option<String>,
    from_user_id: Option<String>,
    from_parent_user_id: Option<String>,
    id: String,
    timestamp: lenient::UnixSeconds,
    #[serde(rename = "type")]
    kind: String,
    text: Option<TextBody>,
    image: Option<Media>,
    video: Option<Media>,
    document: Option<Media>,
    audio: Option<Media>,
    sticker: Option<Media>,
    location: Option<Location>,
    contacts: Option<Vec<IgnoredAny>>,
    interactive: Option<Interactive>,
    button: Option<Button>,
    reaction: Option<Reaction>,
    order: Option<Order>,
    system: Option<System>,
    unsupported: Option<Unsupported>,
    revoke: Option<Value>,
    edit: Option<Value>,
    context: Option<Context>,
    referral: Option<Referral>,
    #[serde(default)]
    errors: Vec<ErrorObject>,
}

impl Message {
    /// The media object named by the message's type.
    fn media(&self) -> Option<&Media> {
        match self.kind.as_str() {
            "image" => self.image.as_ref(),
            "video" => self.video.as_ref(),
            "document" => self.document.as_ref(),
            "audio" => self.audio.as_ref(),
            "sticker" => self.sticker.as_ref(),
            _ => None,
        }
    }
}

#[derive(Deserialize)]
struct TextBody {
    body: Option<String>,
}

#[derive(Deserialize)]
struct Media {
    #[serde(default, deserialize_with = "lenient::opt_string")]
    id: Option<String>,
    mime_type: Option<String>,
    caption: Option<String>,
    filename: Option<String>,
    voice: Option<bool>,
    animated: Option<bool>,
}

#[derive(Deserialize)]
struct Location {
    #[serde(default, deserialize_with = "lenient::opt_number")]
    latitude: Option<f64>,
    #[serde(default, deserialize_with = "lenient::opt_number")]
    longitude: Option<f64>,
    name: Option<String>,
    address: Option<String>,
}

#[derive(Deserialize)]
struct Interactive {
    #[serde(rename = "type")]
    kind: Option<String>,
    button_reply: Option<Reply>,
    list_reply: Option<Reply>,
    nfm_reply: Option<NfmReply>,
}

impl Interactive {
    fn text(&self) -> Option<String> {
        let reply = self.button_reply.as_ref().or(self.list_reply.as_ref());
        reply
            .and_then(|r| r.title.clone())
            .or_else(|| self.nfm_reply.as_ref().and_then(|n| n.body.clone()))
    }
}

#[derive(Deserialize)]
struct Reply {
    id: Option<String>,
    title: Option<String>,
}

#[derive(Deserialize)]
struct NfmReply {
    body: Option<String>,
    response_json: Option<String>,
}

#[derive(Deserialize)]
struct Button {
    payload: Option<String>,
    text: Option<String>,
}

#[derive(Deserialize)]
struct Reaction {
    message_id: Option<String>,
    emoji: Option<String>,
}

#[derive(Deserialize)]
struct Order {
    #[serde(default, deserialize_with = "lenient::opt_string")]
    catalog_id: Option<String>,
    text: Option<String>,
    #[serde(default)]
    product_items: Vec<IgnoredAny>,
}

#[derive(Deserialize)]
struct System {
    body: Option<String>,
    #[serde(rename = "type")]
    kind: Option<String>,
    wa_id: Option<String>,
    user_id: Option<String>,
}

#[derive(Deserialize)]
struct Unsupported {
    #[serde(rename = "type")]
    kind: Option<String>,
}

#[derive(Deserialize)]
struct Context {
    from: Option<String>,
    id: Option<String>,
    forwarded: Option<bool>,
    frequently_forwarded: Option<bool>,
}

#[derive(Deserialize)]
struct Referral {
    #[serde(default, deserialize_with = "lenient::opt_string")]
    source_id: Option<String>,
    ctwa_clid: Option<String>,
}

#[derive(Deserialize)]
struct Status {
    id: String,
    status: String,
    timestamp: lenient::UnixSeconds,
    recipient_id: Option<String>,
    recipient_user_id: Option<String>,
    biz_opaque_callback_data: Option<String>,
    conversation: Option<Conversation>,
    pricing: Option<Pricing>,
    #[serde(default)]
    errors: Vec<ErrorObject>,
}

#[derive(Deserialize)]
struct Conversation {
    id: Option<String>,
}

#[derive(Deserialize)]
struct Pricing {
    pricing_model: Option<String>,
    category: Option<String>,
    #[serde(rename = "type")]
    kind: Option<String>,
    /// Deprecated by Meta and still sent; read only when it is a boolean.
    billable: Option<serde_json::Value>,
}

#[derive(Deserialize)]
struct ErrorObject {
    #[serde(deserialize_with = "lenient::integer")]
    code: i64,
    title: Option<String>,
    error_data: Option<ErrorData>,
}

#[derive(Deserialize)]
struct ErrorData {
    details: Option<String>,
}

/// Meta documents ids and timestamps as strings but has sent numbers: accept both.
mod lenient {
    use serde::de::{self, Deserializer, Visitor};

    pub(super) fn string<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
        d.deserialize_any(StringOrNumber)
    }

    pub(super) fn opt_string<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
        d.deserialize_option(OptStringOrNumber)
    }

    struct StringOrNumber;

    impl Visitor<'_> for StringOrNumber {
        type Value = String;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a string or a number")
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<String, E> {
            Ok(v.to_owned())
        }
        fn visit_u64<E: de::Error>(self, v: u64) -> Result<String, E> {
            Ok(v.to_string())
        }
        fn visit_i64<E: de::Error>(self, v: i64) -> Result<String, E> {
            Ok(v.to_string())
        }
    }

    struct OptStringOrNumber;

    impl<'de> Visitor<'de> for OptStringOrNumber {
        type Value = Option<String>;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a string, a number or null")
        }
        fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            string(d).map(Some)
        }
    }

    /// A number written as a number or as a numeric string; anything else (a placeholder, an
    /// object) is no number, and costs only this fact, never the message.
    pub(super) fn opt_number<'de, D: Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
        let value = <serde_json::Value as serde::Deserialize>::deserialize(d)?;
        Ok(value
            .as_f64()
            .or_else(|| value.as_str()?.trim().parse().ok()))
    }

    /// An integer written as a number or as a string of digits.
    pub(super) fn integer<'de, D: Deserializer<'de>>(d: D) -> Result<i64, D::Error> {
        let text = string(d)?;
        text.trim()
            .parse()
            .map_err(|_| de::Error::custom(format!("{text:?} is not an integer")))
    }

    /// Unix seconds, written as `"1781000001"` or `1781000001`.
    pub(super) struct UnixSeconds(pub(super) i64);

    impl<'de> de::Deserialize<'de> for UnixSeconds {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            let text = string(d)?;
            text.trim()
                .parse()
                .map(UnixSeconds)
                .map_err(|_| de::Error::custom(format!("timestamp {text:?} is not Unix seconds")))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(body: &str) -> InboundItem {
        let parsed = parse(body.as_bytes()).expect("json");
        assert!(parsed.quarantined.is_empty(), "{:?}", parsed.quarantined);
        assert_eq!(parsed.items.len(), 1);
        parsed.items.into_iter().next().expect("one item")
    }

    fn wrap(value: &str) -> String {
        format!(
            r#"{{"object":"whatsapp_business_account","entry":[{{"id":"1","changes":[{{"field":"messages","value":{value}}}]}}]}}"#
        )
    }

    #[test]
    fn an_echo_of_the_owners_app_reply_is_the_businesss_never_a_turn() {
        let body = r#"{"object":"whatsapp_business_account","entry":[{"id":"1","time":1781000500,"changes":[{"field":"smb_message_echoes","value":{"messaging_product":"whatsapp","metadata":{"display_phone_number":"2347000000001","phone_number_id":"9"},"message_echoes":[{"from":"2347000000001","to":"2348031234567","to_user_id":"NG.8812734650192837","id":"wamid.APP1","timestamp":"1781000490","type":"text","text":{"body":"Na me, Tunde. Your order dey come today \ud83d\ude4f"}},{"from":"2347000000001","to_user_id":"NG.77","id":"wamid.APP2","timestamp":"1781000495","type":"image","image":{"id":"55","mime_type":"image\/jpeg","caption":"receipt"}}]}}]}]}"#;
        let parsed = parse(body.as_bytes()).expect("json");
        assert!(parsed.quarantined.is_empty(), "{:?}", parsed.quarantined);
        let [text, image] = parsed.items.as_slice() else {
            panic!("two echoes: {:?}", parsed.items)
        };
        assert_eq!(text.kind, ItemKind::Echo);
        assert_eq!(text.dedupe_key, "echo:wamid.APP1");
        assert_eq!(text.business.as_deref(), Some("9"));
        assert_eq!(text.customer.as_deref(), Some("2348031234567"));
        assert_eq!(
            text.text.as_deref(),
            Some("Na me, Tunde. Your order dey come today \u{1f64f}")
        );
        assert_eq!(text.provider_ts, Some(UnixSeconds(1_781_000_490)));
        assert_eq!(text.turn, None, "an echo never wakes a turn");
        assert_eq!(text.facts["to_user_id"], "NG.8812734650192837");
        assert_eq!(
            image.customer.as_deref(),
            Some("NG.77"),
            "no number: the BSUID"
        );
        assert_eq!(image.text.as_deref(), Some("receipt"));
        assert_eq!(image.media_id.as_deref(), Some("55"));
    }

    #[test]
    fn the_apps_history_and_state_sync_are_kept_whole_and_never_routed() {
        for field in ["history", "smb_app_state_sync"] {
            let body = format!(
                r#"{{"object":"whatsapp_business_account","entry":[{{"id":"1","changes":[{{"field":"{field}","value":{{"messaging_product":"whatsapp","metadata":{{"phone_number_id":"9"}},"history":[{{"threads":[{{"id":"2348031234567","messages":[{{"from":"2348031234567","id":"wamid.OLD","timestamp":"1780000000","type":"text","text":{{"body":"old"}}}}]}}]}}]}}}}]}}]}}"#
            );
            let item = one(&body);
            assert_eq!(item.kind, ItemKind::FieldEvent, "{field}");
            assert_eq!(item.turn, None);
            assert_eq!(item.item_type.as_deref(), Some(field));
        }
    }

    #[test]
    fn a_malformed_echo_is_quarantined_alone() {
        let body = r#"{"object":"whatsapp_business_account","entry":[{"id":"1","changes":[{"field":"smb_message_echoes","value":{"metadata":{"phone_number_id":"9"},"message_echoes":[{"to":"1","id":"wamid.A","timestamp":"5","type":"text","text":{"body":"ok"}},{"to":"1","id":7,"type":"text"}]}}]}]}"#;
        let parsed = parse(body.as_bytes()).expect("json");
        assert_eq!(parsed.items.len(), 1);
        assert_eq!(parsed.quarantined.len(), 1);
    }

    #[test]
    fn not_json_is_an_error() {
        for body in [&b"not json"[..], b"{\"object\":", b"\xff\xfe", b""] {
            assert!(parse(body).is_err(), "{body:?}");
        }
    }

    #[test]
    fn unknown_shapes_are_quarantined_whole() {
        for body in [
            r#"{"object":"page","entry":[]}"#,
            r#"{"object":"whatsapp_business_account","entry":{}}"#,
            r#"[1,2,3]"#,
            r#""text""#,
            r#"{"entry":[]}"#,
        ] {
            let parsed = parse(body.as_bytes()).expect("json");
            assert!(parsed.items.is_empty());
            assert_eq!(parsed.quarantined.len(), 1, "{body}");
            assert_eq!(parsed.quarantined[0].raw, body);
        }
    }

    #[test]
    fn a_malformed_message_is_quarantined_alone() {
        let body = wrap(
            r#"{"metadata":{"phone_number_id":"9"},"messages":[
                {"from":"1","id":"wamid.ok","timestamp":"5","type":"text","text":{"body":"hi"}},
                {"from":"1","id":7,"timestamp":"5","type":"text"}]}"#,
        );
        let parsed = parse(body.as_bytes()).expect("json");
        assert_eq!(parsed.items.len(), 1);
        assert_eq!(parsed.items[0].dedupe_key, "wamid.ok");
        assert_eq!(parsed.quarantined.len(), 1);
        assert!(parsed.quarantined[0].raw.contains("\"id\":7"));
    }

    #[test]
    fn unknown_type_is_kept_and_is_a_turn() {
        let item = one(&wrap(
            r#"{"metadata":{"phone_number_id":"9"},"messages":[{"from":"1","id":"w","timestamp":1,"type":"poll_vote","poll_vote":{"x":1},"new_field":true}]}"#,
        ));
        assert_eq!(item.item_type.as_deref(), Some("poll_vote"));
        assert_eq!(item.text, None);
        assert!(item.turn.is_some());
    }

    #[test]
    fn reactions_and_system_messages_are_not_turns() {
        for kind in ["reaction", "system"] {
            let item = one(&wrap(&format!(
                r#"{{"metadata":{{"phone_number_id":"9"}},"messages":[{{"from":"1","id":"w","timestamp":"1","type":"{kind}"}}]}}"#
            )));
            assert_eq!(item.turn, None, "{kind}");
        }
    }

    #[test]
    fn sender_without_phone_is_keyed_by_user_id() {
        let item = one(&wrap(
            r#"{"metadata":{"phone_number_id":"9"},"contacts":[{"user_id":"NG.1","profile":{"name":"K"}}],
                "messages":[{"from":"","from_user_id":"NG.1","id":"w","timestamp":"1","type":"text","text":{"body":"x"}}]}"#,
        ));
        assert_eq!(item.customer.as_deref(), Some("NG.1"));
        assert_eq!(item.facts["from"], Value::Null);
        assert_eq!(item.facts["contact_name"], "K");
    }

    #[test]
    fn echoes_and_calls_beside_messages_are_kept_whole() {
        let parsed = parse(
            wrap(
                r#"{"metadata":{"phone_number_id":"9"},
                "message_echoes":[{"from":"9","to":"1","id":"e","timestamp":"1","type":"text","text":{"body":"from the app"}}]}"#,
            )
            .as_bytes(),
        )
        .expect("json");
        assert_eq!(parsed.items.len(), 1);
        assert_eq!(parsed.items[0].kind, ItemKind::FieldEvent);
        assert!(parsed.items[0].facts["value"]["message_echoes"].is_array());
    }

    #[test]
    fn an_edited_caption_is_the_new_text() {
        let item = one(&wrap(
            r#"{"metadata":{"phone_number_id":"9"},
                "messages":[{"from":"1","id":"e","timestamp":"2","type":"edit",
                             "edit":{"original_message_id":"w","message":{"type":"image","image":{"caption":"new caption","id":"5"}}}}]}"#,
        ));
        assert_eq!(item.text.as_deref(), Some("new caption"));
    }

    #[test]
    fn a_location_with_odd_coordinates_keeps_the_message() {
        let item = one(&wrap(
            r#"{"metadata":{"phone_number_id":"9"},
                "messages":[{"from":"1","id":"l","timestamp":"1","type":"location",
                             "location":{"latitude":"6.45","longitude":"LONGITUDE","name":"Home"}}]}"#,
        ));
        assert_eq!(item.facts["latitude"], 6.45);
        assert!(item.facts.get("longitude").is_none());
        assert_eq!(item.facts["location_name"], "Home");
    }

    #[test]
    fn a_sender_known_only_from_its_contact_is_that_contact() {
        let item = one(&wrap(
            r#"{"metadata":{"phone_number_id":"9"},"contacts":[{"user_id":"NG.7","profile":{"name":"K"}}],
                "messages":[{"id":"w","timestamp":"1","type":"text","text":{"body":"x"}}]}"#,
        ));
        assert_eq!(item.customer.as_deref(), Some("NG.7"));
        assert_eq!(item.facts["from_user_id"], "NG.7");
        assert!(item.turn.is_some(), "it is answered");
    }

    #[test]
    fn deletions_and_edits_name_their_message_and_wake_nothing() {
        let revoke = one(&wrap(
            r#"{"metadata":{"phone_number_id":"9"},
                "messages":[{"from":"1","id":"r","timestamp":"2","type":"revoke","revoke":{"original_message_id":"w"}}]}"#,
        ));
        assert_eq!(revoke.facts["amends"], "w");
        assert!(revoke.turn.is_none());
        let edit = one(&wrap(
            r#"{"metadata":{"phone_number_id":"9"},
                "messages":[{"from":"1","id":"e","timestamp":"2","type":"edit",
                             "edit":{"original_message_id":"w","message":{"type":"text","text":{"body":"new"}}}}]}"#,
        ));
        assert_eq!(edit.facts["amends"], "w");
        assert_eq!(edit.text.as_deref(), Some("new"));
        assert!(edit.turn.is_none());
    }

    #[test]
    fn contacts_are_matched_by_id_not_index() {
        let parsed = parse(
            wrap(
                r#"{"metadata":{"phone_number_id":"9"},
                "contacts":[{"wa_id":"2","profile":{"name":"Two"}},{"wa_id":"1","profile":{"name":"One"}}],
                "messages":[{"from":"1","id":"a","timestamp":"1","type":"text","text":{"body":"x"}},
                            {"from":"2","id":"b","timestamp":"1","type":"text","text":{"body":"y"}},
                            {"from":"3","id":"c","timestamp":"1","type":"text","text":{"body":"z"}}]}"#,
            )
            .as_bytes(),
        )
        .expect("json");
        let names: Vec<_> = parsed
            .items
            .iter()
            .map(|i| i.facts["contact_name"].clone())
            .collect();
        assert_eq!(names, vec![json!("One"), json!("Two"), Value::Null]);
    }

    #[test]
    fn statuses_dedupe_on_id_and_status() {
        let item = one(&wrap(
            r#"{"metadata":{"phone_number_id":"9"},"statuses":[{"id":"wamid.x","status":"read","timestamp":"3","recipient_id":"1"}]}"#,
        ));
        assert_eq!(item.dedupe_key, "wamid.x:read");
        assert_eq!(item.facts["error_codes"], json!([]));
    }

    #[test]
    fn escaped_wire_text_decodes() {
        let item = one(&wrap(
            r#"{"metadata":{"phone_number_id":"9"},"messages":[{"from":"1","id":"w","timestamp":"1","type":"text","text":{"body":"caf\u00e9 \ud83d\ude00 a\/b"}}]}"#,
        ));
        assert_eq!(item.text.as_deref(), Some("café 😀 a/b"));
    }

    #[test]
    fn odd_contacts_and_errors_do_not_cost_the_messages() {
        let parsed = parse(
            wrap(
                r#"{"metadata":{"phone_number_id":"9"},"contacts":[{"wa_id":12,"profile":"x"}],
                "messages":[{"from":"1","id":"w","timestamp":"1","type":"text","text":{"body":"hi"}}],
                "errors":[{"code":"131000","title":"t"},{"code":{}}]}"#,
            )
            .as_bytes(),
        )
        .expect("json");
        let kinds: Vec<ItemKind> = parsed.items.iter().map(|i| i.kind).collect();
        assert_eq!(kinds, vec![ItemKind::Message, ItemKind::ValueError]);
        assert_eq!(parsed.items[1].facts["code"], 131000);
        assert_eq!(parsed.quarantined.len(), 1);
    }

    #[test]
    fn field_events_hash_the_same_on_redelivery() {
        let body = r#"{"object":"whatsapp_business_account","entry":[{"id":"1","time":5,"changes":[{"field":"account_update","value":{"event":"X"}}]}]}"#;
        let a = one(body);
        let b = one(body);
        assert_eq!(a.dedupe_key, b.dedupe_key);
        assert_eq!(a.facts["event"], "X");
        assert_eq!(a.facts["entry_time"], 5);
    }

    #[test]
    fn a_template_category_update_is_a_field_event_never_a_message() {
        let body = r#"{"object":"whatsapp_business_account","entry":[{"id":"240011223344556","time":1781000000,"changes":[{"field":"template_category_update","value":{"message_template_id":1689556908120042,"message_template_name":"order_update","message_template_language":"en_US","previous_category":"UTILITY","new_category":"MARKETING"}}]}]}"#;
        let parsed = parse(body.as_bytes()).expect("json");
        assert!(parsed.quarantined.is_empty(), "{:?}", parsed.quarantined);
        let [item] = parsed.items.as_slice() else {
            panic!("one item: {:?}", parsed.items);
        };
        assert_eq!(item.kind, ItemKind::FieldEvent);
        assert_eq!(item.turn, None, "no turn: nobody wrote");
        assert_eq!(item.customer, None);
        assert_eq!(item.facts["field"], "template_category_update");
        assert_eq!(item.facts["value"]["new_category"], "MARKETING");
    }
}
