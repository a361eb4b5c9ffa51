-- Learning from use: what the router made of a turn's messages, and a person's label of what
-- they asked.
ALTER TABLE batches ADD COLUMN route_intent TEXT;
ALTER TABLE batches ADD COLUMN route_confidence REAL;
ALTER TABLE batches ADD COLUMN route_local BOOLEAN;
ALTER TABLE batches ADD COLUMN label TEXT;
CREATE INDEX batches_routed ON batches (finished_at) WHERE route_intent IS NOT NULL;
