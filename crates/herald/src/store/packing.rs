//! Payloads compressed at rest. A message's payload is most of its row (and of what a
//! commit writes), and JSON with its repeated keys packs well: zstd at level 1 takes a
//! payment event of 1 KiB to about two thirds for a few microseconds, paid by the request's
//! worker, not by the store's single writer. Small payloads stay text, as does one that
//! would not shrink. The packed form is a plain zstd frame that records its length, which is
//! checked before anything is allocated.

use std::cell::RefCell;

/// Payloads shorter than this stay text: a frame's own bytes would eat the saving.
const SMALLEST: usize = 256;
/// zstd's fastest ordinary level; higher ones cost more time for little more on small bodies.
const LEVEL: i32 = 1;
/// The largest payload a packed one may claim to unpack to. Herald's payload limit is far
/// below it; this only bounds what a damaged row can make a reader allocate.
const LARGEST_UNPACKED: u64 = 64 << 20;

thread_local! {
    /// Each thread keeps its contexts: making one allocates far more than a payload, and
    /// took four times as long as unpacking a kilobyte of JSON with one made before.
    static COMPRESSOR: RefCell<Option<zstd::bulk::Compressor<'static>>> = const { RefCell::new(None) };
    static DECOMPRESSOR: RefCell<Option<zstd::bulk::Decompressor<'static>>> = const { RefCell::new(None) };
}

/// The packed form of `payload`, when it is large enough to pack and packing shrinks it.
pub fn pack(payload: &str) -> Option<Vec<u8>> {
    if payload.len() < SMALLEST {
        return None;
    }
    let packed = COMPRESSOR.with_borrow_mut(|slot| {
        let compressor = match slot {
            Some(compressor) => compressor,
            None => slot.insert(zstd::bulk::Compressor::new(LEVEL).ok()?),
        };
        compressor.compress(payload.as_bytes()).ok()
    })?;
    (packed.len() < payload.len()).then_some(packed)
}

/// How a new message's payload is stored: its packed form when packing is `on` and pays,
/// otherwise `None` (text). Called by each backend's ingest on the request's own task.
pub fn packed_payload(message: &crate::store::Message, on: bool) -> Option<Vec<u8>> {
    message.payload.as_deref().filter(|_| on).and_then(pack)
}

/// Why a packed payload could not be read back.
#[derive(Debug, thiserror::Error)]
pub enum UnpackError {
    #[error("the packed payload is not a zstd frame that records its length")]
    NotAFrame,
    #[error("the packed payload claims {0} bytes, more than any payload can have")]
    TooLarge(u64),
    #[error("the packed payload is damaged: {0}")]
    Damaged(String),
}

/// The payload `packed` holds.
pub fn unpack(packed: &[u8]) -> Result<String, UnpackError> {
    let length = match zstd::zstd_safe::get_frame_content_size(packed) {
        Ok(Some(length)) => length,
        _ => return Err(UnpackError::NotAFrame),
    };
    if length > LARGEST_UNPACKED {
        return Err(UnpackError::TooLarge(length));
    }
    let bytes = DECOMPRESSOR.with_borrow_mut(|slot| {
        let decompressor = match slot {
            Some(decompressor) => decompressor,
            None => slot.insert(zstd::bulk::Decompressor::new().map_err(|e| UnpackError::Damaged(e.to_string()))?),
        };
        decompressor.decompress(packed, length as usize).map_err(|e| UnpackError::Damaged(e.to_string()))
    })?;
    if bytes.len() as u64 != length {
        return Err(UnpackError::Damaged(format!("{} bytes where the frame says {length}", bytes.len())));
    }
    String::from_utf8(bytes).map_err(|_| UnpackError::Damaged("not UTF-8".to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A payment event of about 1 KiB, with ids that do not repeat (as real payloads are).
    fn event() -> String {
        let items: Vec<String> = (0..12)
            .map(|i| {
                format!(r#"{{"id":"li_{:014x}","price":"price_{:014x}","quantity":{}}}"#, i * 7919, i * 104729, i % 9)
            })
            .collect();
        format!(
            r#"{{"id":"evt_1PqZ3kLx9","type":"payment_intent.succeeded","data":{{"object":{{"amount":4599,"currency":"usd","items":[{}]}}}}}}"#,
            items.join(",")
        )
    }

    #[test]
    fn a_json_payload_packs_and_comes_back_unchanged() {
        let payload = event();
        let packed = pack(&payload).expect("a kilobyte of JSON packs");
        assert!(packed.len() < payload.len() * 3 / 4, "{} of {}", packed.len(), payload.len());
        assert_eq!(unpack(&packed).unwrap(), payload);
    }

    #[test]
    fn small_payloads_stay_text() {
        assert_eq!(pack(r#"{"a":1}"#), None);
        assert_eq!(pack(&format!(r#"{{"a":"{}"}}"#, "x".repeat(SMALLEST - 9))), None, "one byte short");
        assert!(pack(&format!(r#"{{"a":"{}"}}"#, "x".repeat(SMALLEST - 8))).is_some());
    }

    #[test]
    fn a_damaged_or_boastful_frame_is_refused_before_it_is_unpacked() {
        assert!(matches!(unpack(b"not zstd at all"), Err(UnpackError::NotAFrame)));
        let mut packed = pack(&event()).unwrap();
        let cut = packed.len() / 2;
        packed.truncate(cut);
        assert!(matches!(unpack(&packed), Err(UnpackError::Damaged(_))));
        // A frame whose header claims 1 GiB (a single-segment frame, content size in 4 bytes).
        let mut boastful = vec![0x28, 0xb5, 0x2f, 0xfd, 0b1010_0000];
        boastful.extend_from_slice(&(1u32 << 30).to_le_bytes());
        assert!(matches!(unpack(&boastful), Err(UnpackError::TooLarge(n)) if n == 1 << 30));
        // The thread's context, used by the damaged frame, still unpacks a sound one.
        assert_eq!(unpack(&pack(&event()).unwrap()).unwrap(), event());
    }
}
