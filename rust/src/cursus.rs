//! Cursus batches checked in compiled code: what producers send and what
//! CONSUME and STREAM deliver, validated field by field as
//! `decode_batch` in sluice/protocols/cursus/batch.py (the reference) does,
//! without making an object per message. The proxy's core needs a batch's
//! topic, partition, message count and last offset; the messages are
//! decoded in Python only when something asks for them.
//!
//! As for Pulsar frames, the check only ever says "valid, and here is its
//! head" or "not mine": a body the reference would refuse (or anything
//! this code does not handle) is left to the reference, which says what is
//! wrong. The differential tests look for a body vouched for here that the
//! reference refuses, or a head that differs from the reference's.

/// The batch magic.
const MAGIC: [u8; 2] = [0xBA, 0x7C];
/// The smallest message: every length zero (batch.py's MIN_MESSAGE_SIZE).
const MIN_MESSAGE_SIZE: usize = 8 + 8 + 2 + 2 + 8 + 4 + 2 + 4 + 8 + 2;

/// What the core needs of a valid batch body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Head {
    /// The topic's bytes: `body[topic.0..topic.1]`.
    pub topic: (usize, usize),
    pub partition: i32,
    pub count: u32,
    /// The last message's offset (None in a batch of none).
    pub last_offset: Option<u64>,
}

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let end = self.pos.checked_add(n)?;
        let out = self.buf.get(self.pos..end)?;
        self.pos = end;
        Some(out)
    }

    fn u8(&mut self) -> Option<u8> {
        Some(self.take(1)?[0])
    }

    fn u16(&mut self) -> Option<usize> {
        let b = self.take(2)?;
        Some(usize::from(u16::from_be_bytes([b[0], b[1]])))
    }

    fn u32(&mut self) -> Option<u32> {
        let b = self.take(4)?;
        Some(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn u64(&mut self) -> Option<u64> {
        let b = self.take(8)?;
        let mut out = [0u8; 8];
        out.copy_from_slice(b);
        Some(u64::from_be_bytes(out))
    }

    /// A string with a u16 length: skipped.
    fn string16(&mut self) -> Option<()> {
        let n = self.u16()?;
        self.take(n).map(|_| ())
    }
}

/// The head of a batch body (after any decompression) the reference
/// decodes without an error; None for any other body.
pub fn batch_head(body: &[u8]) -> Option<Head> {
    if body.get(0..2)? != MAGIC {
        return None;
    }
    let mut r = Reader { buf: body, pos: 2 };
    let topic_len = r.u16()?;
    if topic_len == 0 {
        return None;
    }
    let topic = (r.pos, r.pos + topic_len);
    r.take(topic_len)?;
    let partition = i32::from_be_bytes(r.take(4)?.try_into().ok()?);
    let acks = usize::from(r.u8()?);
    r.take(acks)?;
    r.take(1 + 8 + 8)?; // idempotent, seq_start, seq_end
    let count = i32::from_be_bytes(r.take(4)?.try_into().ok()?);
    let count = u32::try_from(count).ok()?;
    let left = body.len() - r.pos;
    if (count as usize).checked_mul(MIN_MESSAGE_SIZE)? > left {
        return None;
    }
    let mut last_offset = None;
    for _ in 0..count {
        last_offset = Some(r.u64()?); // offset
        r.take(8)?; // seq_num
        r.string16()?; // producer id
        r.string16()?; // key
        r.take(8)?; // epoch
        let payload = r.u32()? as usize;
        r.take(payload)?;
        r.string16()?; // event type
        r.take(4 + 8)?; // schema_version, aggregate_version
        r.string16()?; // metadata
    }
    if r.pos != body.len() {
        return None; // bytes after the last message
    }
    Some(Head {
        topic,
        partition,
        count,
        last_offset,
    })
}

/// One frame of a read a compiled step may carry from a broker that
/// streams: a keepalive (no head) or a batch the reference decodes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    /// Where the frame ends in the read.
    pub stop: usize,
    /// A batch's head, its topic's offsets counted from the read's start;
    /// None for a keepalive (an empty body).
    pub head: Option<Head>,
}

/// The frames of `data` (what a broker sent on a STREAM) when one call may
/// carry the read, and where they end: every complete frame a keepalive or
/// a batch `batch_head` vouches for, with a topic that is UTF-8 and a last
/// offset that has a next; and what follows them the start of a frame that
/// is only incomplete (its length not over `max_body`, and not longer than
/// `hold_max`). None: the read goes the reference's way, which says what
/// is wrong with it (or rewrites a reply, or ends the stream).
pub fn carriable(data: &[u8], max_body: u32, hold_max: usize) -> Option<(Vec<Delivery>, usize)> {
    let mut found = Vec::new();
    let mut pos = 0;
    while let Some(prefix) = data.get(pos..pos + 4) {
        let length = u32::from_be_bytes([prefix[0], prefix[1], prefix[2], prefix[3]]);
        if length > max_body {
            return None;
        }
        let start = pos + 4;
        let stop = start.checked_add(length as usize)?;
        let Some(body) = data.get(start..stop) else {
            break; // the start of a frame: the next read has the rest
        };
        let head = if body.is_empty() {
            None
        } else {
            let mut head = batch_head(body)?;
            std::str::from_utf8(&body[head.topic.0..head.topic.1]).ok()?;
            head.last_offset
                .map_or(Some(0), |last| last.checked_add(1))?;
            head.topic = (start + head.topic.0, start + head.topic.1);
            Some(head)
        };
        found.push(Delivery { stop, head });
        pos = stop;
    }
    if data.len() - pos > hold_max {
        return None;
    }
    Some((found, pos))
}

/// Where the read ends when `data` is, whole and alone, the OK a broker
/// answers a commit with: the two letters `OK` (COMMIT_OFFSET), or, for a
/// commit of several partitions (`batched`), `OK batched=N` with N a
/// decimal count of at most ten digits (BATCH_COMMIT). The reference
/// decodes either as an OK reply naming no broker. None for anything
/// else, left to the reference.
pub fn commit_ok(data: &[u8], batched: bool) -> Option<usize> {
    let length = u32::from_be_bytes(data.get(..4)?.try_into().ok()?);
    let body = data.get(4..)?;
    if length as usize != body.len() {
        return None;
    }
    let fits = if batched {
        body.strip_prefix(b"OK batched=")
            .is_some_and(|n| (1..=10).contains(&n.len()) && n.iter().all(u8::is_ascii_digit))
    } else {
        body == b"OK"
    };
    fits.then_some(data.len())
}

#[cfg(feature = "python")]
pub mod python {
    use pyo3::prelude::*;

    /// (topic start, topic end, partition, count, last offset or -1)
    type Found = (usize, usize, i32, u32, i128);

    /// cursus_batch_head(data, start=0) -> (topic_start, topic_end,
    /// partition, count, last_offset) of ``data[start:]``, a batch body
    /// the reference decodes without an error (the topic's offsets are in
    /// ``data``; last_offset -1 when it holds no message); None for any
    /// other body, left to the reference.
    #[pyfunction]
    #[pyo3(signature = (data, start=0))]
    pub fn cursus_batch_head(data: &[u8], start: usize) -> Option<Found> {
        super::batch_head(data.get(start..)?).map(|h| {
            let last = h.last_offset.map_or(-1, i128::from);
            (
                start + h.topic.0,
                start + h.topic.1,
                h.partition,
                h.count,
                last,
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(topic: &[u8], messages: &[(u64, &[u8])]) -> Vec<u8> {
        let mut out = MAGIC.to_vec();
        out.extend_from_slice(&(topic.len() as u16).to_be_bytes());
        out.extend_from_slice(topic);
        out.extend_from_slice(&7i32.to_be_bytes());
        out.extend_from_slice(b"\x011");
        out.push(0);
        out.extend_from_slice(&[0; 16]);
        out.extend_from_slice(&(messages.len() as i32).to_be_bytes());
        for (offset, payload) in messages {
            out.extend_from_slice(&offset.to_be_bytes());
            out.extend_from_slice(&[0; 8]);
            out.extend_from_slice(b"\x00\x02p1\x00\x00");
            out.extend_from_slice(&[0; 8]);
            out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
            out.extend_from_slice(payload);
            out.extend_from_slice(b"\x00\x00");
            out.extend_from_slice(&[0; 12]);
            out.extend_from_slice(b"\x00\x00");
        }
        out
    }

    #[test]
    fn a_batch_and_its_head() {
        let body = batch(b"orders", &[(3, b"a"), (4, b"bc")]);
        let head = batch_head(&body).unwrap();
        assert_eq!(&body[head.topic.0..head.topic.1], b"orders");
        assert_eq!(
            (head.partition, head.count, head.last_offset),
            (7, 2, Some(4))
        );
        let empty = batch(b"t", &[]);
        assert_eq!(batch_head(&empty).map(|h| h.last_offset), Some(None));
    }

    #[test]
    fn every_cut_and_anything_after_is_left_to_the_reference() {
        let body = batch(b"orders", &[(3, b"a"), (4, b"bc")]);
        for cut in 0..body.len() {
            assert_eq!(batch_head(&body[..cut]), None, "cut at {cut}");
        }
        let mut longer = body.clone();
        longer.push(0);
        assert_eq!(batch_head(&longer), None);
        assert_eq!(batch_head(&batch(b"", &[])), None); // an empty topic
        let mut negative = batch(b"t", &[]);
        let at = negative.len() - 4;
        negative[at..].copy_from_slice(&(-1i32).to_be_bytes());
        assert_eq!(batch_head(&negative), None);
    }

    #[test]
    fn a_stream_read_is_carried_up_to_the_start_of_a_frame() {
        let body = batch(b"orders", &[(3, b"a"), (4, b"bc")]);
        let mut stream = (body.len() as u32).to_be_bytes().to_vec();
        stream.extend_from_slice(&body);
        stream.extend_from_slice(&[0, 0, 0, 0]); // a keepalive
        let whole = stream.len();
        stream.extend_from_within(..9); // a frame begun
        let (found, end) = carriable(&stream, 1 << 20, 1 << 20).unwrap();
        assert_eq!(end, whole);
        assert_eq!(found.len(), 2);
        let head = found[0].head.unwrap();
        assert_eq!(&stream[head.topic.0..head.topic.1], b"orders");
        assert_eq!((head.count, head.last_offset), (2, Some(4)));
        assert_eq!(
            found[1],
            Delivery {
                stop: whole,
                head: None
            }
        );
        // Every cut: the frames before it, and the rest held.
        for cut in 0..=stream.len() {
            let (found, end) = carriable(&stream[..cut], 1 << 20, 1 << 20).unwrap();
            assert!(end <= cut && found.last().map_or(0, |d| d.stop) == end);
        }
        // Held no longer than asked; a length over the limit; a reply.
        assert!(carriable(&stream, 1 << 20, 8).is_none());
        assert!(carriable(&stream, 4, 1 << 20).is_none());
        assert!(carriable(b"\x00\x00\x00\x02OK", 1 << 20, 1 << 20).is_none());
        // ... which commit_ok takes, whole and alone, as it answers a commit.
        assert_eq!(commit_ok(b"\x00\x00\x00\x02OK", false), Some(6));
        let batched = b"\x00\x00\x00\x0cOK batched=2";
        assert_eq!(commit_ok(batched, true), Some(batched.len()));
        assert_eq!(commit_ok(batched, false), None);
        assert_eq!(commit_ok(b"\x00\x00\x00\x02OK", true), None);
        for other in [
            &b"\x00\x00\x00\x02OKx"[..],
            b"\x00\x00\x00\x02O",
            b"\x00\x00\x00\x03OK!",
            b"\x00\x00\x00\x0bOK batched=",
            b"\x00\x00\x00\x0cOK batched=x",
            b"\x00\x00\x00\x0dOK batched=2 ",
            b"\x00\x00\x00\x16OK batched=12345678901",
            b"",
        ] {
            assert_eq!(commit_ok(other, false), None);
            assert_eq!(commit_ok(other, true), None);
        }
        // Every cut of either is left alone.
        for cut in 0..batched.len() {
            assert_eq!(commit_ok(&batched[..cut], true), None);
        }
        // A topic that is not UTF-8, and a last offset with no next.
        let bad = batch(b"\xff", &[(3, b"a")]);
        let mut frame = (bad.len() as u32).to_be_bytes().to_vec();
        frame.extend_from_slice(&bad);
        assert!(carriable(&frame, 1 << 20, 1 << 20).is_none());
        let last = batch(b"t", &[(u64::MAX, b"a")]);
        let mut frame = (last.len() as u32).to_be_bytes().to_vec();
        frame.extend_from_slice(&last);
        assert!(carriable(&frame, 1 << 20, 1 << 20).is_none());
    }
}
