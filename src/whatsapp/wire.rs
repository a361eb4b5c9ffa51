//! PURE: JSON in Meta's wire format, as its webhooks arrive.
//!
//! Compact, every non-ASCII character written as a lowercase `\uXXXX` escape (astral characters
//! as UTF-16 surrogate pairs) and every `/` written as `\/`. `sabi send` and the tests sign
//! exactly these bytes, so the signature check is exercised the way Meta exercises it.

use std::fmt::Write;

use serde_json::Value;

/// A realistic Cloud API webhook for one inbound text message.
pub fn text_webhook(
    business: &str,
    from: &str,
    name: &str,
    id: &str,
    timestamp: u64,
    text: &str,
) -> Value {
    serde_json::json!({
        "object": "whatsapp_business_account",
        "entry": [{
            "id": "100000000000000",
            "changes": [{
                "value": {
                    "messaging_product": "whatsapp",
                    "metadata": {"display_phone_number": "15550000000", "phone_number_id": business},
                    "contacts": [{"profile": {"name": name}, "wa_id": from}],
                    "messages": [{
                        "from": from,
                        "id": id,
                        "timestamp": timestamp.to_string(),
                        "type": "text",
                        "text": {"body": text}
                    }]
                },
                "field": "messages"
            }]
        }]
    })
}

/// A Cloud API status webhook for one message a business sent: `status` is `sent`,
/// `delivered`, `read` or `failed`; `callback` is the send's `biz_opaque_callback_data`.
pub fn status_webhook(
    business: &str,
    recipient: &str,
    wamid: &str,
    status: &str,
    timestamp: u64,
    callback: Option<&str>,
) -> Value {
    let mut entry = serde_json::json!({
        "id": wamid,
        "status": status,
        "timestamp": timestamp.to_string(),
        "recipient_id": recipient,
    });
    if let Some(callback) = callback {
        entry["biz_opaque_callback_data"] = callback.into();
    }
    serde_json::json!({
        "object": "whatsapp_business_account",
        "entry": [{
            "id": "100000000000000",
            "changes": [{
                "value": {
                    "messaging_product": "whatsapp",
                    "metadata": {"display_phone_number": "15550000000", "phone_number_id": business},
                    "statuses": [entry]
                },
                "field": "messages"
            }]
        }]
    })
}

pub fn encode(value: &Value) -> String {
    let compact = value.to_string();
    let mut wire = String::with_capacity(compact.len() + compact.len() / 8);
    for c in compact.chars() {
        match c {
            // Outside strings JSON has no '/' and no non-ASCII, so escaping everywhere is safe.
            '/' => wire.push_str("\\/"),
            c if c.is_ascii() => wire.push(c),
            c => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    // Writing to a String cannot fail.
                    let _ = write!(wire, "\\u{unit:04x}");
                }
            }
        }
    }
    wire
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_reference_bytes() {
        let value: Value =
            serde_json::from_str(r#"{"text":{"body":"café 😀 a/b"}}"#).expect("json");
        assert_eq!(
            encode(&value),
            r#"{"text":{"body":"caf\u00e9 \ud83d\ude00 a\/b"}}"#
        );
    }

    #[test]
    fn round_trips() {
        let value = serde_json::json!({"a": "Ẹ káàrọ̀ 👨‍👩‍👧 \"q\" \\ \n ₦", "b": [1, 2.5, null]});
        let back: Value = serde_json::from_str(&encode(&value)).expect("json");
        assert_eq!(back, value);
        assert!(encode(&value).is_ascii());
    }
}
