-- A broadcast's start and deadline given as wall-clock times (2026-11-11T09:00), read on each
-- recipient's clock (store/rules/hours.rs); and each recipient's IANA time zone, when the
-- audience gave one or its country has one (the broadcast's tz otherwise).
ALTER TABLE broadcasts ADD COLUMN local_start TEXT;
ALTER TABLE broadcasts ADD COLUMN local_until TEXT;
ALTER TABLE broadcast_recipients ADD COLUMN tz TEXT;
-- Whether Meta charges for the recipient's message, as its statuses' pricing says: a
-- broadcast's actual cost.
ALTER TABLE broadcast_recipients ADD COLUMN billed BOOLEAN;
