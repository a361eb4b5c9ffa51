//! Erasure: a customer's right to have Sabi forget them, the same on every backend.
//!
//! Erasure removes every trace of what a customer wrote or was sent: their messages (text,
//! media ids, facts, profile name) and the statuses that name them, the replies to them, review
//! items about their turns, web-chat jobs, quarantined raw bodies that are theirs ([`sent_by`]),
//! and what broadcasts held for them. Turns stay as bare counts (tokens, cost, the router's guess) under
//! a conversation that no longer names them.
//!
//! Two things stay, both keyed hashes ([`Marks`]): each erased message's deduplication key
//! ([`Marks::key_hash`]), so Meta's late retry of it is never taken in or answered again, with
//! the keys of the statuses Meta may still send about the messages to them
//! ([`Marks::status_hashes`]), so a late status never stores their number again; and on WhatsApp a do-not-contact marker ([`Marks::marker`]), an opt-out that no broadcast
//! passes. A customer who writes again is a new customer.
//!
//! The hashes are pseudonymous, not anonymous: whoever holds the deployment's marker secret
//! can tell whether a given number was erased. The secret is kept outside the store, so a copy
//! of the store alone reverses none of them (an unkeyed hash of a phone number is reversed by
//! trying every number).
//!
//! Erasure waits for a turn or a send under way for the customer ([`busy`]): it never pulls
//! a conversation out from under a worker.

use std::collections::{HashMap, HashSet};

use hmac::{Hmac, Mac};
use secrecy::{ExposeSecret, SecretString};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::domain::Channel;

/// The longest wa_id (E.164: 15 digits) and web-chat session id Sabi takes.
const MAX_NUMBER_DIGITS: usize = 15;
const MIN_NUMBER_DIGITS: usize = 7;
const MAX_SESSION_CHARS: usize = 128;

/// Who a request for erasure or export names: a customer on one channel, by the id that
/// channel knows them by (a WhatsApp number, a web-chat session).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subject {
    pub channel: Channel,
    pub customer: String,
}

impl Subject {
    /// The customer `id` names on `channel`: a WhatsApp number as digits (`+234 803 123 4567`
    /// is `2348031234567`) or a business-scoped user id (`NG.8812734650192837`), a web-chat
    /// session id as given.
    ///
    /// # Errors
    /// A clear sentence when `id` cannot name a customer of that channel.
    pub fn parse(channel: Channel, id: &str) -> Result<Subject, String> {
        let id = id.trim();
        let customer = match channel {
            // A customer who withholds their number is known by their BSUID alone.
            Channel::Whatsapp if super::identity::is_bsuid(id) => id.to_owned(),
            Channel::Whatsapp => {
                let digits: String = id
                    .strip_prefix('+')
                    .unwrap_or(id)
                    .chars()
                    .filter(|c| !matches!(c, ' ' | '-'))
                    .collect();
                let count = digits.chars().count();
                if !digits.chars().all(|c| c.is_ascii_digit())
                    || !(MIN_NUMBER_DIGITS..=MAX_NUMBER_DIGITS).contains(&count)
                {
                    return Err(format!(
                        "{id:?} is not a WhatsApp number: {MIN_NUMBER_DIGITS} to \
                         {MAX_NUMBER_DIGITS} digits with the country code, like 2348031234567, \
                         or a business-scoped user id like NG.8812734650192837"
                    ));
                }
                digits
            }
            Channel::Webchat => {
                let allowed =
                    |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':');
                if id.is_empty() || id.len() > MAX_SESSION_CHARS || !id.chars().all(allowed) {
                    return Err(format!(
                        "{id:?} is not a web-chat session id: 1 to {MAX_SESSION_CHARS} letters, \
                         digits, '-', '_', '.' or ':'"
                    ));
                }
                id.to_owned()
            }
        };
        Ok(Subject { channel, customer })
    }
}

/// What a marker starts with: no number or session id can be mistaken for one.
pub const MARKER_PREFIX: &str = "erased:";

/// The deployment's marker secrets, oldest first, the current one last (`privacy.marker_secret`
/// after `privacy.previous_marker_secrets`). A marker or key hash is the unkeyed SHA-256 of
/// what it stands for, then the HMAC-SHA256 of that (as hex) with each secret in turn. So a
/// store's hashes move to a new secret without knowing whom they stand for: each stored value
/// gets the new secret's HMAC on top ([`Rekey`]), and the store records which secrets it is
/// under ([`Marks::fingerprint`]).
#[derive(Clone)]
pub struct Marks {
    secrets: std::sync::Arc<Vec<SecretString>>,
}

impl std::fmt::Debug for Marks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Marks({} secrets)", self.secrets.len())
    }
}

impl Marks {
    /// Hashes made with `previous` (oldest first), then `current`.
    pub fn new(current: SecretString, previous: Vec<SecretString>) -> Marks {
        let mut secrets = previous;
        secrets.push(current);
        Marks {
            secrets: std::sync::Arc::new(secrets),
        }
    }

    /// What stays of an erased message's deduplication key: a keyed hash that a retry of the
    /// same key finds, and that names no one.
    pub fn key_hash(&self, channel: Channel, key: &str) -> String {
        keyed(&self.secrets, digest(&["key", channel.as_str(), key]))
    }

    /// What stays of an erased customer: a keyed hash that takes their place wherever a
    /// customer is named (an opt-out, a broadcast's counts), the same for every erasure of
    /// them.
    pub fn marker(&self, channel: Channel, customer: &str) -> String {
        let inner = digest(&["customer", channel.as_str(), customer]);
        format!("{MARKER_PREFIX}{}", keyed(&self.secrets, inner))
    }

    /// Names these secrets in the store without giving them away: a keyed hash of a fixed
    /// text, chained like the markers.
    pub fn fingerprint(&self) -> String {
        fingerprint(&self.secrets)
    }

    /// What turns the hashes of a store under `recorded` (its fingerprint; `None`: unkeyed, as
    /// builds before the marker secret wrote them) into hashes under these secrets.
    ///
    /// # Errors
    /// When `recorded` is not these secrets or a beginning of them: the store's hashes were
    /// made with a secret this configuration does not list, and would no longer be found.
    pub fn rekey_from(&self, recorded: Option<&str>) -> Result<Rekey, String> {
        let from = match recorded {
            None => 0,
            Some(recorded) => (1..=self.secrets.len())
                .rev()
                .find(|&n| fingerprint(&self.secrets[..n]) == recorded)
                .ok_or_else(|| {
                    "the store's erasure markers were made with a marker secret this \
                     configuration does not have: set privacy.marker_secret \
                     (SABI_MARKER_SECRET) back, or list the old one in \
                     privacy.previous_marker_secrets"
                        .to_owned()
                })?,
        };
        Ok(Rekey {
            secrets: self.secrets[from..].to_vec(),
        })
    }
}

/// What Meta says became of a message, as status webhooks name it (`<wamid>:<status>` is a
/// status's key).
const STATUSES: &[&str] = &[
    "sent",
    "delivered",
    "read",
    "failed",
    "deleted",
    "played",
    "warning",
];

impl Marks {
    /// The key hashes of every status Meta may still send about `wamid`, a message to an erased
    /// customer: kept with the erased keys, they make a late status a known duplicate, so it
    /// never stores the customer's number again.
    pub fn status_hashes(&self, wamid: &str) -> Vec<String> {
        STATUSES
            .iter()
            .map(|status| self.key_hash(Channel::Whatsapp, &format!("{wamid}:{status}")))
            .collect()
    }
}

/// Whether a quarantined raw part is the customer's: a message they sent (`from`), a status
/// about a message to them (`recipient_id`), or a web-chat question of their session. A part
/// that only mentions them (another customer quoting their number) is not.
pub fn sent_by(raw: &str, customer: &str) -> bool {
    let Ok(serde_json::Value::Object(part)) = serde_json::from_str::<serde_json::Value>(raw) else {
        return false;
    };
    ["from", "recipient_id", "session_id"]
        .iter()
        .filter_map(|field| part.get(*field))
        .any(|value| match value {
            serde_json::Value::String(s) => s == customer,
            serde_json::Value::Number(n) => n.to_string() == customer,
            _ => false,
        })
}

/// The secrets a store's hashes still lack, applied to each stored value in turn.
#[derive(Debug)]
pub struct Rekey {
    secrets: Vec<SecretString>,
}

impl Rekey {
    /// Nothing to do: the store is under these secrets already.
    pub fn is_empty(&self) -> bool {
        self.secrets.is_empty()
    }

    /// A stored key hash, re-keyed.
    pub fn key_hash(&self, stored: &str) -> String {
        keyed(&self.secrets, stored.to_owned())
    }

    /// A stored marker, re-keyed; `None` for a name that is not a marker.
    pub fn marker(&self, stored: &str) -> Option<String> {
        let inner = stored.strip_prefix(MARKER_PREFIX)?;
        // Conversations keep `erased:<id>`, no hash: only 64 hex digits are markers.
        (inner.len() == 64 && inner.bytes().all(|b| b.is_ascii_hexdigit()))
            .then(|| format!("{MARKER_PREFIX}{}", keyed(&self.secrets, inner.to_owned())))
    }
}

fn keyed(secrets: &[SecretString], mut value: String) -> String {
    for secret in secrets {
        // HMAC takes a key of any length.
        let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(secret.expose_secret().as_bytes()) else {
            continue;
        };
        mac.update(value.as_bytes());
        value = hex::encode(mac.finalize().into_bytes());
    }
    value
}

fn fingerprint(secrets: &[SecretString]) -> String {
    keyed(secrets, digest(&["sabi marker secret"]))
}

/// Asks whether WhatsApp customers opted out, the erased among them included: a backend
/// looks up [`OptOuts::names`] (each customer and the marker they would have left) and
/// [`OptOuts::of`] reads the answer back as customers.
pub struct OptOuts {
    names: Vec<String>,
    customer_of: HashMap<String, String>,
}

impl OptOuts {
    pub fn ask(marks: &Marks, customers: &[String]) -> OptOuts {
        let customer_of: HashMap<String, String> = customers
            .iter()
            .map(|c| (marks.marker(Channel::Whatsapp, c), c.clone()))
            .collect();
        let names = customers
            .iter()
            .cloned()
            .chain(customer_of.keys().cloned())
            .collect();
        OptOuts { names, customer_of }
    }

    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// The customers among those asked whom `found` (the names opted out) keeps out.
    pub fn of(&self, found: HashSet<String>) -> HashSet<String> {
        found
            .into_iter()
            .map(|name| self.customer_of.get(&name).cloned().unwrap_or(name))
            .collect()
    }
}

fn digest(parts: &[&str]) -> String {
    let mut hasher = Sha256::new();
    for part in parts {
        hasher.update(part.as_bytes());
        hasher.update(b"\n");
    }
    hex::encode(hasher.finalize())
}

/// Why erasure waits: a turn for the customer holds its lease, or a reply to them is on its
/// way to Meta. Both end within seconds; erasing under them would let the worker write the
/// reply back, or lose track of a message that did go.
pub fn busy(turn_running: bool, send_under_way: bool) -> Option<&'static str> {
    if turn_running {
        Some("a turn for this customer is under way")
    } else if send_under_way {
        Some("a reply to this customer is being sent")
    } else {
        None
    }
}

/// What an erasure removed, by kind. All zero: Sabi held nothing about the customer (or had
/// already forgotten them).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Erased {
    /// Customer messages: text, media ids, facts and profile name.
    pub messages: u64,
    /// Other items naming them: delivery statuses, errors.
    pub statuses: u64,
    /// Reply parts to them, Sabi's and people's.
    pub replies: u64,
    /// Review items about their turns.
    pub reviews: u64,
    /// Web-chat jobs.
    pub chat_jobs: u64,
    /// Quarantined raw bodies that are theirs.
    pub quarantined: u64,
    /// Broadcast sends to them (the broadcasts' counts stay, under the marker).
    pub broadcast_sends: u64,
    /// Conversations, kept as bare turn counts under the marker.
    pub conversations: u64,
    /// Their opt-out choice, replaced by the marker.
    pub consents: u64,
}

impl std::ops::AddAssign for Erased {
    fn add_assign(&mut self, other: Erased) {
        self.messages += other.messages;
        self.statuses += other.statuses;
        self.replies += other.replies;
        self.reviews += other.reviews;
        self.chat_jobs += other.chat_jobs;
        self.quarantined += other.quarantined;
        self.broadcast_sends += other.broadcast_sends;
        self.conversations += other.conversations;
        self.consents += other.consents;
    }
}

impl Erased {
    pub fn total(&self) -> u64 {
        let Erased {
            messages,
            statuses,
            replies,
            reviews,
            chat_jobs,
            quarantined,
            broadcast_sends,
            conversations,
            consents,
        } = *self;
        messages
            + statuses
            + replies
            + reviews
            + chat_jobs
            + quarantined
            + broadcast_sends
            + conversations
            + consents
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_number_is_its_digits_and_anything_else_is_refused() {
        for given in ["2348031234567", "+234 803 123 4567", "+234-803-123-4567"] {
            let subject = Subject::parse(Channel::Whatsapp, given).expect(given);
            assert_eq!(subject.customer, "2348031234567");
        }
        for bad in [
            "",
            "12345",
            "2348031234567890",
            "234803abc4567",
            "0803;DROP",
        ] {
            let refused = Subject::parse(Channel::Whatsapp, bad).expect_err(bad);
            assert!(refused.contains("not a WhatsApp number"), "{refused}");
        }
        assert!(Subject::parse(Channel::Webchat, "s-1.a:b_c").is_ok());
        assert!(Subject::parse(Channel::Webchat, "a b").is_err());
        assert!(Subject::parse(Channel::Webchat, &"x".repeat(129)).is_err());
    }

    fn marks(secret: &str, previous: &[&str]) -> Marks {
        let of = |s: &str| SecretString::from(s.to_owned());
        Marks::new(of(secret), previous.iter().map(|s| of(s)).collect())
    }

    #[test]
    fn hashes_are_stable_apart_by_channel_and_name_no_one() {
        let number = "2348031234567";
        let m = marks("one", &[]);
        let marker = |c: Channel, n: &str| m.marker(c, n);
        assert_eq!(
            marker(Channel::Whatsapp, number),
            marker(Channel::Whatsapp, number)
        );
        assert_ne!(
            marker(Channel::Whatsapp, number),
            marker(Channel::Webchat, number)
        );
        assert_ne!(
            m.key_hash(Channel::Whatsapp, "wamid.1"),
            m.key_hash(Channel::Webchat, "wamid.1")
        );
        assert!(!marker(Channel::Whatsapp, number).contains(number));
        assert!(Subject::parse(Channel::Whatsapp, "erased:00").is_err());
    }

    #[test]
    fn markers_are_keyed_and_the_unkeyed_ones_move_under_the_secret() {
        let number = "2348031234567";
        let unkeyed = format!("erased:{}", digest(&["customer", "whatsapp", number]));
        let (one, other) = (marks("one", &[]), marks("other", &[]));
        assert_ne!(one.marker(Channel::Whatsapp, number), unkeyed);
        assert_ne!(
            one.marker(Channel::Whatsapp, number),
            other.marker(Channel::Whatsapp, number),
            "without the secret, trying every number finds nothing"
        );
        let rekey = one.rekey_from(None).expect("from unkeyed");
        assert_eq!(
            rekey.marker(&unkeyed),
            Some(one.marker(Channel::Whatsapp, number))
        );
        assert_eq!(rekey.marker("erased:42"), None, "a conversation's name");
        let key = digest(&["key", "whatsapp", "wamid.1"]);
        assert_eq!(
            rekey.key_hash(&key),
            one.key_hash(Channel::Whatsapp, "wamid.1")
        );
        assert!(
            one.rekey_from(Some(&one.fingerprint()))
                .expect("same")
                .is_empty()
        );
        assert!(one.rekey_from(Some(&other.fingerprint())).is_err());
    }

    #[test]
    fn a_new_secret_takes_over_with_the_old_one_listed() {
        let number = "2348031234567";
        let (old, new) = (marks("old", &[]), marks("new", &["old"]));
        let rekey = new.rekey_from(Some(&old.fingerprint())).expect("rotation");
        assert_eq!(
            rekey.marker(&old.marker(Channel::Whatsapp, number)),
            Some(new.marker(Channel::Whatsapp, number))
        );
        assert!(
            marks("new", &[])
                .rekey_from(Some(&old.fingerprint()))
                .is_err()
        );
    }

    #[test]
    fn an_erased_customer_stays_opted_out_by_their_marker() {
        let m = marks("one", &[]);
        let asked = vec!["2348031234567".to_owned(), "2348030000000".to_owned()];
        let opt_outs = OptOuts::ask(&m, &asked);
        assert_eq!(opt_outs.names().len(), 4);
        let found = HashSet::from([m.marker(Channel::Whatsapp, "2348031234567")]);
        assert_eq!(
            opt_outs.of(found),
            HashSet::from(["2348031234567".to_owned()])
        );
    }

    #[test]
    fn a_quarantined_part_is_the_customer_s_only_when_they_sent_it() {
        let ada = "2348031234567";
        assert!(sent_by(r#"{"from": "2348031234567", "type": 7}"#, ada));
        assert!(sent_by(r#"{"from": 2348031234567}"#, ada));
        assert!(sent_by(
            r#"{"recipient_id": "2348031234567", "status": 1}"#,
            ada
        ));
        let quoted = r#"{"from": "2348030000002", "text": {"body": "call 2348031234567"}}"#;
        assert!(!sent_by(quoted, ada));
        assert!(!sent_by("not json 2348031234567", ada));
    }

    #[test]
    fn erasure_waits_only_for_work_under_way() {
        assert!(busy(false, false).is_none());
        assert!(busy(true, false).is_some());
        assert!(busy(false, true).is_some());
    }
}
