-- Meta redelivers what it did not see acknowledged: a quarantined part is kept once.
ALTER TABLE quarantine ADD COLUMN hash BLOB;
CREATE UNIQUE INDEX quarantine_once ON quarantine (channel, hash);
