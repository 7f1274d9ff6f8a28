-- Herald's PostgreSQL schema, version 6: the trace context of the span that accepted a
-- message (OpenTelemetry, a W3C traceparent), so that its attempts, in any process and at
-- any time, join the same trace. NULL when tracing was off (and for outbox messages).
ALTER TABLE herald.message ADD COLUMN trace text;
