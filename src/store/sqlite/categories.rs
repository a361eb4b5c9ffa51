//! Template categories: the newer word on a template's category is kept, an older one dropped
//! ([`rules::category::replaces`], here as the upsert's condition).

use rusqlite::{Connection, OptionalExtension, params};

use super::unavailable;
use crate::store::Result;
use crate::store::rules::category::TemplateCategory;

pub(super) fn keep(conn: &Connection, c: &TemplateCategory) -> Result<()> {
    conn.prepare_cached(
        "INSERT INTO template_categories (name, language, category, heard_at)
         VALUES (?1, ?2, ?3, ?4)
         ON CONFLICT (name, language) DO UPDATE
            SET category = excluded.category, heard_at = excluded.heard_at
          WHERE excluded.heard_at >= template_categories.heard_at",
    )
    .and_then(|mut s| s.execute(params![c.name, c.language, c.category, c.heard_at.millis()]))
    .map(drop)
    .map_err(unavailable)
}

pub(super) fn category(conn: &Connection, name: &str, language: &str) -> Result<Option<String>> {
    conn.prepare_cached(
        "SELECT category FROM template_categories WHERE name = ?1 AND language = ?2",
    )
    .and_then(|mut s| {
        s.query_row(params![name, language], |r| r.get(0))
            .optional()
    })
    .map_err(unavailable)
}
