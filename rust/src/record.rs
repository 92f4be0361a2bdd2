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
    let mut out = Vec::with_capacity(prefix.len() + 20 + raw.len() + 48);
    frame_record_into(&mut out, prefix, raw, payload_offset, payloads);
    out
}

/// `frame_record`, appended to `out`: the records of a read (or of many)
/// laid out one after another in one buffer.
pub fn frame_record_into(
    out: &mut Vec<u8>,
    prefix: &[u8],
    raw: &[u8],
    payload_offset: i64,
    payloads: Payloads,
) {
    let n = raw.len();
    let offset = match payloads {
        Payloads::Full => None,
        _ => usize::try_from(payload_offset).ok().filter(|&o| o <= n),
    };
    let kept = offset.unwrap_or(n);
    let start = out.len();
    out.reserve(prefix.len() + 20 + kept + 48);
    out.extend_from_slice(prefix);
    if offset.is_some() {
        if let Some(first) = out.get_mut(start) {
            *first = MAP_8;
        }
    }
    out.extend_from_slice(b"\xa1n");
    size(out, n, 0xcc, 0xce);
    out.extend_from_slice(b"\xa3raw");
    size(out, kept, 0xc4, 0xc6);
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

#[cfg(feature = "python")]
pub mod python {
    use std::sync::Mutex;

    use pyo3::prelude::*;
    use pyo3::types::PyBytes;

    use super::{frame_record_into, Payloads};
    use crate::Scanned;

    /// Past this, a taken buffer gives its memory back (a burst's).
    const KEEP_CAPACITY: usize = 4 << 20;

    /// RecordSink(max_frames, max_bytes, wake_frames, wake_bytes, wake):
    /// where compiled relay steps lay out the frame records of the reads
    /// they carry, one after another in one buffer, for the recorder's
    /// writer to take (sluice/recording/writer.py, ``Recorder``): no Python
    /// call and no Python object per read or per record. It keeps the
    /// recorder's bounds: ``max_frames`` records or ``max_bytes`` bytes
    /// queued, counting what the recorder's own queue held when it last
    /// took (``take``), and past them a read's records are dropped and
    /// counted; once ``wake_frames`` or ``wake_bytes`` are queued it calls
    /// ``wake()``, once until the next ``take``.
    #[pyclass(module = "sluice._frames", frozen)]
    pub struct RecordSink {
        state: Mutex<Sink>,
        wake: Py<PyAny>,
        max_frames: u64,
        max_bytes: u64,
        wake_frames: u64,
        wake_bytes: u64,
    }

    struct Sink {
        data: Vec<u8>,
        frames: u64,
        /// Records dropped since the sink was made.
        dropped: u64,
        /// What the recorder's own queue held (records, bytes) at the last take.
        others: (u64, u64),
        woken: bool,
    }

    impl RecordSink {
        fn state(&self) -> std::sync::MutexGuard<'_, Sink> {
            self.state.lock().unwrap_or_else(|e| e.into_inner())
        }

        /// The records of one read's frames (`found`, stops into `data`),
        /// each starting with `prefix`: laid out, or dropped and counted.
        pub(crate) fn append(
            &self,
            py: Python<'_>,
            prefix: &[u8],
            data: &[u8],
            found: &[Scanned],
            payloads: Payloads,
        ) {
            let mut sink = self.state();
            let n = found.len() as u64;
            if sink.others.0 + sink.frames >= self.max_frames
                || sink.others.1 + sink.data.len() as u64 >= self.max_bytes
            {
                sink.dropped += n;
                return;
            }
            let mut from = 0;
            for s in found {
                let Some(frame) = data.get(from..s.stop) else {
                    break; // never: the scanner's stops are within the read
                };
                from = s.stop;
                frame_record_into(&mut sink.data, prefix, frame, s.payload_offset, payloads);
                sink.frames += 1;
            }
            let wake = !sink.woken
                && (sink.others.0 + sink.frames >= self.wake_frames
                    || sink.others.1 + sink.data.len() as u64 >= self.wake_bytes);
            sink.woken |= wake;
            drop(sink);
            if wake {
                if let Err(error) = self.wake.bind(py).call0() {
                    error.write_unraisable(py, Some(self.wake.bind(py)));
                }
            }
        }
    }

    #[pymethods]
    impl RecordSink {
        #[new]
        fn new(
            max_frames: u64,
            max_bytes: u64,
            wake_frames: u64,
            wake_bytes: u64,
            wake: Py<PyAny>,
        ) -> Self {
            RecordSink {
                state: Mutex::new(Sink {
                    data: Vec::new(),
                    frames: 0,
                    dropped: 0,
                    others: (0, 0),
                    woken: false,
                }),
                wake,
                max_frames,
                max_bytes,
                wake_frames,
                wake_bytes,
            }
        }

        /// take(queued, queued_bytes) -> (records, count): the records laid
        /// out since the last take, joined, and how many, for the
        /// recorder's own queue, which holds ``queued`` records of
        /// ``queued_bytes`` bytes before it takes these: until the next
        /// take, the bounds count those and these.
        fn take<'py>(
            &self,
            py: Python<'py>,
            queued: u64,
            queued_bytes: u64,
        ) -> (Bound<'py, PyBytes>, u64) {
            let mut sink = self.state();
            let out = PyBytes::new(py, &sink.data);
            let (frames, taken) = (sink.frames, sink.data.len() as u64);
            sink.data.clear();
            if sink.data.capacity() > KEEP_CAPACITY {
                sink.data.shrink_to(KEEP_CAPACITY / 4);
            }
            sink.frames = 0;
            sink.others = (queued + frames, queued_bytes + taken);
            sink.woken = false;
            (out, frames)
        }

        /// Records laid out and not yet taken.
        #[getter]
        fn frames(&self) -> u64 {
            self.state().frames
        }

        /// Their bytes.
        #[getter]
        fn size(&self) -> u64 {
            self.state().data.len() as u64
        }

        /// Records dropped (the bounds reached) since the sink was made.
        #[getter]
        fn dropped(&self) -> u64 {
            self.state().dropped
        }
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
