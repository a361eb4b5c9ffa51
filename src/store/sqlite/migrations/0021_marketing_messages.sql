-- Each message template's latest category as Meta gave it (its template list, or a completed
-- `template_category_update`), and when: MARKETING templates go to the Marketing Messages API
-- when it is on. The newer word wins (`heard_at`, ms since the epoch).
CREATE TABLE template_categories (
    name     TEXT    NOT NULL,
    language TEXT    NOT NULL,
    category TEXT    NOT NULL,
    heard_at INTEGER NOT NULL,
    PRIMARY KEY (name, language)
) WITHOUT ROWID;

-- Meta's pricing category for a recipient's message (`marketing`, `marketing_lite` through the
-- Marketing Messages API, ...), as its statuses' pricing says: the report counts them apart.
ALTER TABLE broadcast_recipients ADD COLUMN pricing_category TEXT;
