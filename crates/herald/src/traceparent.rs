//! A span context as a W3C `traceparent` (`00-<trace id>-<span id>-<flags>`): the form a
//! message's trace context is stored in, and sent to receivers that asked for it.

use opentelemetry::trace::{SpanContext, SpanId, TraceFlags, TraceId, TraceState};

pub fn format_traceparent(context: &SpanContext) -> String {
    format!("00-{}-{}-{:02x}", context.trace_id(), context.span_id(), context.trace_flags().to_u8())
}

/// A stored `traceparent` back as a remote span context; `None` if it is not one.
pub fn parse_traceparent(text: &str) -> Option<SpanContext> {
    let mut parts = text.split('-');
    let (version, trace, span, flags) = (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    if version != "00" || parts.next().is_some() || trace.len() != 32 || span.len() != 16 || flags.len() != 2 {
        return None;
    }
    let lower_hex = |s: &str| s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    if !lower_hex(trace) || !lower_hex(span) || !lower_hex(flags) {
        return None;
    }
    let flags = TraceFlags::new(u8::from_str_radix(flags, 16).ok()?);
    let context = SpanContext::new(
        TraceId::from_hex(trace).ok()?,
        SpanId::from_hex(span).ok()?,
        flags,
        true,
        TraceState::default(),
    );
    context.is_valid().then_some(context)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_refuses_what_is_not_a_version_00_traceparent() {
        let text = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let context = parse_traceparent(text).unwrap();
        assert!(context.is_sampled() && context.is_remote());
        assert_eq!(format_traceparent(&context), text);
        for bad in [
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "garbage",
        ] {
            assert!(parse_traceparent(bad).is_none(), "{bad}");
        }
    }
}
