//! The payload parser never panics: arbitrary bytes, arbitrary JSON, and corpus files mutated
//! byte by byte. Whatever it cannot read is an error or quarantine, never a crash.

use proptest::prelude::*;
use sabi::ingress::whatsapp::parse;

use crate::helpers::corpus_dir;

fn corpus() -> Vec<Vec<u8>> {
    let mut files: Vec<_> = std::fs::read_dir(corpus_dir())
        .expect("corpus dir")
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    files
        .iter()
        .map(|p| std::fs::read(p).expect("corpus file"))
        .collect()
}

fn json_value() -> impl Strategy<Value = serde_json::Value> {
    let leaf = prop_oneof![
        Just(serde_json::Value::Null),
        any::<bool>().prop_map(serde_json::Value::from),
        any::<i64>().prop_map(serde_json::Value::from),
        any::<f64>().prop_map(serde_json::Value::from),
        prop::sample::select(vec![
            "messages",
            "statuses",
            "text",
            "type",
            "id",
            "from",
            "entry",
            "changes",
            "value",
            "object",
            "whatsapp_business_account",
            "metadata",
            "timestamp",
            "interactive",
            "errors",
        ])
        .prop_map(serde_json::Value::from),
        ".*".prop_map(serde_json::Value::from),
    ];
    leaf.prop_recursive(5, 64, 8, |inner| {
        let keys = prop::sample::select(vec![
            "object",
            "entry",
            "changes",
            "field",
            "value",
            "messages",
            "statuses",
            "errors",
            "metadata",
            "phone_number_id",
            "contacts",
            "id",
            "from",
            "timestamp",
            "type",
            "text",
            "body",
            "image",
            "interactive",
            "button_reply",
            "context",
            "time",
            "code",
            "status",
            "event",
        ]);
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(serde_json::Value::from),
            prop::collection::btree_map(keys.prop_map(str::to_owned), inner, 0..6)
                .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..2048)) {
        let _ = parse(&bytes);
    }

    #[test]
    fn arbitrary_json_never_panics(value in json_value()) {
        let _ = parse(value.to_string().as_bytes());
        let envelope = serde_json::json!({"object": "whatsapp_business_account", "entry": [{"id": "1", "changes": [{"field": "messages", "value": value}]}]});
        let _ = parse(envelope.to_string().as_bytes());
    }

    #[test]
    fn mutated_corpus_files_never_panic(
        index in any::<prop::sample::Index>(),
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>(), 0u8..3), 1..8),
    ) {
        let files = corpus();
        let mut body = index.get(&files).clone();
        for (at, byte, op) in edits {
            if body.is_empty() { break; }
            let i = at.index(body.len());
            match op {
                0 => body[i] = byte,
                1 => { body.insert(i, byte); }
                _ => { body.truncate(i); }
            }
        }
        let _ = parse(&body);
    }
}
