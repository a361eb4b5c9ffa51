-- Web-chat jobs: the handle a browser polls for its answer. The question itself is an inbox
-- message like any other; the job only names it, unguessably, for one session.
CREATE TABLE chat_jobs (
    job_id      TEXT    PRIMARY KEY,
    session_id  TEXT    NOT NULL,
    -- The inbox dedupe key: (session, message id), so a double submit finds the same job.
    message_key TEXT    NOT NULL UNIQUE,
    inbox_seq   INTEGER NOT NULL REFERENCES inbox (seq),
    created_at  INTEGER NOT NULL,
    expires_at  INTEGER NOT NULL
);
CREATE INDEX chat_jobs_session ON chat_jobs (session_id, created_at);
CREATE INDEX inbox_webchat_pending ON inbox (seq) WHERE state = 'pending' AND channel = 'webchat';
