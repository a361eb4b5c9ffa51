//! Template categories: the newer word on a template's category is kept, an older one dropped
//! ([`rules::category::replaces`], here as the upsert's condition).

use sqlx::PgConnection;

use crate::store::rules::category::TemplateCategory;
use crate::store::{Error, Result};

pub(super) async fn keep(conn: &mut PgConnection, c: &TemplateCategory) -> Result<()> {
    sqlx::query(
        "INSERT INTO template_categories (name, language, category, heard_at)
         VALUES ($1, $2, $3, $4)
         ON CONFLICT (name, language) DO UPDATE
            SET category = excluded.category, heard_at = excluded.heard_at
          WHERE excluded.heard_at >= template_categories.heard_at",
    )
    .bind(&c.name)
    .bind(&c.language)
    .bind(&c.category)
    .bind(c.heard_at.millis())
    .execute(&mut *conn)
    .await?;
    Ok(())
}

pub(super) async fn category(
    conn: &mut PgConnection,
    name: &str,
    language: &str,
) -> Result<Option<String>> {
    sqlx::query_scalar("SELECT category FROM template_categories WHERE name = $1 AND language = $2")
        .bind(name)
        .bind(language)
        .fetch_optional(&mut *conn)
        .await
        .map_err(Error::from)
}
