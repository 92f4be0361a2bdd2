//! The recorder's frame records, laid out as `FrameRecorder.packed` in
//! sluice/recording/format.py lays them out (the reference, tested against
//! this on the same frames): a msgpack map of k, c, d, t, w, n, raw and, when
//! the payload is left out, p. The caller passes the part that is the same
//! for every frame of a read (the map's first byte up to "w"'s value);
//! here come the sizes, the bytes kept and the payload's size and SHA-256.

use sha2::{Digest, Sha256};

pub const MAP_7: u8 = 0x87;
pub const MAP_8: u8 = 0x88;

/// What the recorder keeps of a payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Payloads {
    /// The frame whole.
    Full,
    /// The payload's size and SHA-256 instead of its bytes.
    Hash,
    /// The payload's size only.
    Size,
}

/// One frame's record. `prefix` starts with the 7-entry map marker;
/// `payload_offset` is -1 for frames without a payload.
pub fn frame_record(prefix: &[u8], raw: &[u8], payload_offset: i64, payloads: Payloads) -> Vec<u8> {
    let n = raw.len();
    let offset = match payloads {
        Payloads::Full => None,
        _ => usize::try_from(payload_offset).ok().filter(|&o| o <= n),
    };
    let kept = offset.unwrap_or(n);
    let mut out = Vec::with_capacity(prefix.len() + 20 + kept + 48);
    out.extend_from_slice(prefix);
    if offset.is_some() {
        if let Some(first) = out.first_mut() {
            *first = MAP_8;
        }
    }
    out.extend_from_slice(b"\xa1n");
    size(&mut out, n, 0xcc, 0xce);
    out.extend_from_slice(b"\xa3raw");
    size(&mut out, kept, 0xc4, 0xc6);
    out.extend_from_slice(&raw[..kept]);
    if let Some(offset) = offset {
        let payload = &raw[offset..];
        let len = u32::try_from(payload.len()).unwrap_or(u32::MAX);
        if payloads == Payloads::Hash {
            out.extend_from_slice(b"\xa1p\x92\xce");
            out.extend_from_slice(&len.to_be_bytes());
            out.extend_from_slice(b"\xc4\x20");
            out.extend_from_slice(&Sha256::digest(payload));
        } else {
            out.extend_from_slice(b"\xa1p\x91\xce");
            out.extend_from_slice(&len.to_be_bytes());
        }
    }
    out
}

/// A size as the reference writes it: one byte below 256, else four.
fn size(out: &mut Vec<u8>, value: usize, small: u8, large: u8) {
    if value < 256 {
        out.push(small);
        out.push(value as u8);
    } else {
        out.push(large);
        out.extend_from_slice(&u32::try_from(value).unwrap_or(u32::MAX).to_be_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts() {
        let prefix = [MAP_7, 1, 2];
        let raw: Vec<u8> = (0..300u32).map(|i| i as u8).collect();
        let whole = frame_record(&prefix, &raw, 100, Payloads::Full);
        assert_eq!(whole[0], MAP_7);
        assert_eq!(&whole[3..6], b"\xa1n\xce");
        assert_eq!(whole.len(), 3 + 7 + 9 + 300);
        let hashed = frame_record(&prefix, &raw, 100, Payloads::Hash);
        assert_eq!(hashed[0], MAP_8);
        assert_eq!(&hashed[10..16], b"\xa3raw\xc4\x64");
        assert_eq!(hashed.len(), 3 + 7 + 6 + 100 + 4 + 4 + 2 + 32);
        let sized = frame_record(&prefix, &raw, 100, Payloads::Size);
        assert_eq!(sized.len(), 3 + 7 + 6 + 100 + 4 + 4);
        // No payload: the frame whole, whatever the policy.
        assert_eq!(frame_record(&prefix, &raw, -1, Payloads::Hash), whole);
        // An offset past the frame is treated as no payload, never read past.
        assert_eq!(frame_record(&prefix, &raw, 301, Payloads::Hash), whole);
        // "n" 0 and "raw" empty (4 + 6 bytes), then "p" with its digest (42).
        assert_eq!(frame_record(&[], &[], 0, Payloads::Hash).len(), 4 + 6 + 42);
    }
}
