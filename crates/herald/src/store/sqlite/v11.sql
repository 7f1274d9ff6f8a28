-- Payloads compressed at rest (`store::packing`): a message's payload is in `payload` as
-- text, or in `packed` as a zstd frame, never both. Rows written before stay text.
ALTER TABLE message ADD COLUMN packed BLOB;
