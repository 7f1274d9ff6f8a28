//! The message-creation body (`POST /api/v1/app/{app_id}/msg`) as the API parses it.
//!
//! Property: `api::parse_message_body` never panics (and never overflows the stack) on any
//! bytes: invalid UTF-8, malformed JSON, wrong shapes, or nesting far deeper than the
//! 64 levels it accepts (serde_json alone would stop at 128).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = herald::api::parse_message_body(data);
});
