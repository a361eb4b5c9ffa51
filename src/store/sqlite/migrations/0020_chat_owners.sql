-- A web-chat session belongs to the first verified user (`user_id` vouched for by the site's
-- `user_hash`) whose question it kept: from then on its history, its jobs and its message ids
-- (idempotency keys) are that user's alone, and anyone else asking in it is refused.
CREATE TABLE chat_owners (
    session_id TEXT    PRIMARY KEY,
    user_id    TEXT    NOT NULL,
    bound_at   INTEGER NOT NULL
) WITHOUT ROWID;
