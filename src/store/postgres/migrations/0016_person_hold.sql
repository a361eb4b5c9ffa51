-- A person who replied to the customer (the desk, the admin API, the WhatsApp Business app)
-- holds the conversation until then (ms since the epoch): the assistant stands down, and what
-- the customer writes goes to the person. NULL: nobody holds it.
ALTER TABLE conversations ADD COLUMN held_until BIGINT;
