//! Template categories: Meta's latest word on a template's category is kept per name and
//! language, from its template list or a completed `template_category_update` webhook; an
//! older word and an impending change move nothing.

use std::sync::Arc;

use sabi::clock::{At, UnixSeconds};
use sabi::domain::{Channel, InboundItem, ItemKind};
use sabi::store::{Store, TemplateCategory};

use super::T0;
use super::fixtures::deliver;
use crate::helpers::ms;

fn category_update(value: serde_json::Value, at: At) -> InboundItem {
    InboundItem {
        kind: ItemKind::FieldEvent,
        channel: Channel::Whatsapp,
        dedupe_key: format!("field:category:{}", at.millis()),
        business: None,
        customer: None,
        item_type: Some("template_category_update".into()),
        text: None,
        media_id: None,
        provider_ts: Some(UnixSeconds(at.unix_seconds())),
        turn: None,
        facts: serde_json::json!({
            "kind": "field_event",
            "field": "template_category_update",
            "value": value,
        }),
    }
}

async fn category(store: &Arc<dyn Store>, language: &str) -> Option<String> {
    store
        .template_category("order_update", language)
        .await
        .expect("read")
}

pub async fn template_categories_keep_meta_s_latest_word(store: Arc<dyn Store>) {
    assert_eq!(category(&store, "en_US").await, None, "never heard");
    let listed = TemplateCategory::new("order_update", "en_US", "utility", T0 + ms(10_000));
    store.keep_category(listed).await.expect("kept");
    assert_eq!(category(&store, "en_US").await.as_deref(), Some("UTILITY"));
    let older = TemplateCategory::new("order_update", "en_US", "MARKETING", T0 + ms(5_000));
    store.keep_category(older).await.expect("dropped");
    assert_eq!(
        category(&store, "en_US").await.as_deref(),
        Some("UTILITY"),
        "an older word is dropped"
    );

    let impending = serde_json::json!({
        "message_template_name": "order_update", "message_template_language": "en_US",
        "correct_category": "MARKETING", "new_category": "UTILITY",
        "category_update_timestamp": 1_781_086_400,
    });
    let at = T0 + ms(20_000);
    deliver(&store, category_update(impending, at), at).await;
    assert_eq!(category(&store, "en_US").await.as_deref(), Some("UTILITY"));

    let completed = serde_json::json!({
        "message_template_id": 1_689_556_908_120_042_i64,
        "message_template_name": "order_update", "message_template_language": "en_US",
        "previous_category": "UTILITY", "new_category": "MARKETING",
    });
    let at = T0 + ms(30_000);
    let receipt = deliver(&store, category_update(completed, at), at).await;
    assert_eq!(receipt.stored, 1, "kept as a field event");
    assert_eq!(
        category(&store, "en_US").await.as_deref(),
        Some("MARKETING")
    );
    assert_eq!(
        category(&store, "pt_BR").await,
        None,
        "one language at a time"
    );
}
