-- OpenTelemetry: the trace context of the span that accepted a message (a W3C traceparent),
-- so that its attempts, in any process and at any time, join the same trace. NULL when
-- tracing was off.
ALTER TABLE message ADD COLUMN trace TEXT;
