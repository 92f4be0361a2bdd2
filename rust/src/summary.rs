//! What a reader of a recording needs of a recorded Pulsar frame of a hot
//! type (SEND, SEND_RECEIPT, MESSAGE, ACK, FLOW): the numbers its summary
//! is made of, read in one call instead of parsing the command and the
//! message metadata into protobuf objects.
//!
//! A recorded frame's payload is usually left out (the length prefix still
//! says the size on the wire), so the checksum cannot be checked, and the
//! summary never depended on it: the reader summarizes whatever parses. This
//! reads the frame as the Python reader does (`_whole_prefix`: the frame
//! ends where the recorded bytes end, whatever the prefix says), takes the
//! command and metadata checks of the scanner (`crate::send`,
//! `crate::metadata`...: they accept only what the Python decoder parses
//! into initialized messages) and reads the few fields the summary shows.
//!
//! As with the scanner, it only ever says "here are the numbers" or "not
//! mine" (None): anything else (another type, a problem of any kind, a body
//! or metadata the checks refuse, an ACK that asks for a receipt, a field
//! repeated where protobuf would merge) is left to the Python reader, the
//! reference, and tests/test_compiled_summaries.py compares the two.
//!
//! Every read goes through `get`: no input panics or reads past a buffer.

use crate::{
    ack, base_command, be16, be32, flow, int32, message, metadata, send, send_receipt, Reader, ACK,
    FLOW, LEN, MAGIC_BROKER_ENTRY_METADATA, MAGIC_CHECKSUM, MESSAGE, SEND, SEND_RECEIPT, VARINT,
};

/// A MessageIdData as the summary shows it: `[ledgerId, entryId,
/// partition, batch_index]` (the last two default to -1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MessageId {
    pub ledger: u64,
    pub entry: u64,
    pub partition: i64,
    pub batch_index: i64,
}

/// The message metadata's counting fields, at their protobuf defaults when
/// absent: what the summary's `msgs` and `chunk` are worked out from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Counted<'a> {
    pub in_batch: i64,
    pub chunks: i64,
    pub chunk_id: i64,
    pub uuid: &'a str,
    pub total_size: i64,
}

/// The numbers of a hot frame's summary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Summary<'a> {
    pub kind: u32,
    /// SEND, SEND_RECEIPT: producer id; MESSAGE, ACK, FLOW: consumer id.
    pub a: u64,
    /// SEND, SEND_RECEIPT: sequence id; otherwise 0.
    pub b: u64,
    /// SEND, SEND_RECEIPT: their optional message_id; MESSAGE: its message_id.
    pub message_id: Option<MessageId>,
    /// SEND, MESSAGE: the metadata's counting fields.
    pub counted: Option<Counted<'a>>,
}

/// The summary's numbers for the recorded bytes of one frame, or None.
pub fn summary(raw: &[u8]) -> Option<Summary<'_>> {
    let size = raw.len();
    let cmd_size = be32(raw.get(4..8)?) as usize;
    let cmd_end = 8usize.checked_add(cmd_size)?;
    let (kind, body) = base_command(raw.get(8..cmd_end)?)?;
    let mut found = Summary {
        kind,
        a: 0,
        b: 0,
        message_id: None,
        counted: None,
    };
    match kind {
        SEND => {
            let (producer, sequence, _) = send(body)?;
            found.a = producer;
            found.b = sequence;
            found.message_id = single_message_id(body, 9)?;
        }
        SEND_RECEIPT => {
            let (producer, sequence) = send_receipt(body)?;
            found.a = producer;
            found.b = sequence;
            found.message_id = single_message_id(body, 3)?;
        }
        MESSAGE => {
            found.a = message(body)?;
            found.message_id = Some(single_message_id(body, 2)??);
        }
        ACK => {
            // With a request_id the ACK is a request the correlator keeps
            // (the frame with it): left to Python.
            let (consumer, asks) = ack(body)?;
            if asks {
                return None;
            }
            found.a = consumer;
        }
        FLOW => found.a = flow(body)?.0,
        _ => return None,
    }
    if kind != SEND && kind != MESSAGE {
        // Anything after such a command is a problem: left to Python.
        return (cmd_end == size).then_some(found);
    }
    // The payload section as the Python decoder walks it: an optional
    // checksum (not checked: the payload is usually not recorded), the
    // metadata's size, the metadata. Broker entry metadata: left to Python.
    let magic = be16(raw.get(cmd_end..cmd_end.checked_add(6)?)?);
    if magic == MAGIC_BROKER_ENTRY_METADATA {
        return None;
    }
    let offset = if magic == MAGIC_CHECKSUM {
        cmd_end + 6
    } else {
        cmd_end
    };
    let meta_start = offset.checked_add(4)?;
    let meta_size = be32(raw.get(offset..meta_start)?) as usize;
    let meta = raw.get(meta_start..meta_start.checked_add(meta_size)?)?;
    metadata(meta)?;
    found.counted = Some(counted(meta)?);
    Some(found)
}

/// Whether a message holds field `number`, of any wire type (None: it
/// does not read as protobuf).
pub(crate) fn has_field(bytes: &[u8], number: u32) -> Option<bool> {
    let mut r = Reader::new(bytes);
    let mut seen = false;
    while !r.done() {
        let (field, wire) = r.key()?;
        if field == number {
            seen = true;
        }
        r.skip(wire)?;
    }
    Some(seen)
}

/// The MessageIdData of field `number` of a body the scanner's checks
/// accepted: Some(None) when absent, None when it is there more than once
/// (protobuf merges the occurrences: left to Python).
fn single_message_id(body: &[u8], number: u32) -> Option<Option<MessageId>> {
    let mut r = Reader::new(body);
    let mut found = None;
    while !r.done() {
        let (field, wire) = r.key()?;
        if field == number && wire == LEN {
            if found.is_some() {
                return None;
            }
            found = Some(message_id(r.bytes()?)?);
        } else {
            r.skip(wire)?;
        }
    }
    Some(found)
}

/// ledgerId, entryId, partition and batch_index of a MessageIdData the
/// scanner's checks accepted (the last occurrence of each wins, as in
/// protobuf).
fn message_id(bytes: &[u8]) -> Option<MessageId> {
    let mut r = Reader::new(bytes);
    let mut id = MessageId {
        ledger: 0,
        entry: 0,
        partition: -1,
        batch_index: -1,
    };
    while !r.done() {
        let (field, wire) = r.key()?;
        match (field, wire) {
            (1, VARINT) => id.ledger = r.varint()?,
            (2, VARINT) => id.entry = r.varint()?,
            (3, VARINT) => id.partition = int32(r.varint()?),
            (4, VARINT) => id.batch_index = int32(r.varint()?),
            _ => r.skip(wire)?,
        }
    }
    Some(id)
}

/// The counting fields of a MessageMetadata the scanner's checks accepted.
fn counted(bytes: &[u8]) -> Option<Counted<'_>> {
    let mut r = Reader::new(bytes);
    let mut out = Counted {
        in_batch: 1,
        chunks: 0,
        chunk_id: 0,
        uuid: "",
        total_size: 0,
    };
    while !r.done() {
        let (field, wire) = r.key()?;
        match (field, wire) {
            (11, VARINT) => out.in_batch = int32(r.varint()?),
            (26, LEN) => out.uuid = std::str::from_utf8(r.bytes()?).ok()?,
            (27, VARINT) => out.chunks = int32(r.varint()?),
            (28, VARINT) => out.total_size = int32(r.varint()?),
            (29, VARINT) => out.chunk_id = int32(r.varint()?),
            _ => r.skip(wire)?,
        }
    }
    Some(out)
}

#[cfg(feature = "python")]
pub mod python {
    use pyo3::prelude::*;
    use pyo3::types::{PyList, PyTuple};

    /// summary(raw) -> (kind, a, b, message_id, counted) for a recorded
    /// frame of a hot type, or None: summarize it in Python. `message_id` is
    /// a new list [ledgerId, entryId, partition, batch_index] or None;
    /// `counted` is (num_messages_in_batch, num_chunks_from_msg, chunk_id,
    /// uuid, total_chunk_msg_size), None without metadata.
    #[pyfunction]
    pub fn summary<'py>(py: Python<'py>, raw: &[u8]) -> PyResult<Option<Bound<'py, PyTuple>>> {
        let Some(found) = super::summary(raw) else {
            return Ok(None);
        };
        let message_id = match found.message_id {
            Some(id) => Some(PyList::new(
                py,
                [
                    id.ledger.into_pyobject(py)?,
                    id.entry.into_pyobject(py)?,
                    id.partition.into_pyobject(py)?,
                    id.batch_index.into_pyobject(py)?,
                ],
            )?),
            None => None,
        };
        let counted = found
            .counted
            .map(|c| (c.in_batch, c.chunks, c.chunk_id, c.uuid, c.total_size));
        let tuple = (found.kind, found.a, found.b, message_id, counted);
        tuple.into_pyobject(py).map(Some)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crc32c::crc32c;

    fn varint(mut value: u64, out: &mut Vec<u8>) {
        while value >= 0x80 {
            out.push((value as u8) | 0x80);
            value >>= 7;
        }
        out.push(value as u8);
    }

    fn int(field: u32, value: u64, out: &mut Vec<u8>) {
        varint(u64::from(field) << 3, out);
        varint(value, out);
    }

    fn field_bytes(field: u32, value: &[u8], out: &mut Vec<u8>) {
        varint((u64::from(field) << 3) | 2, out);
        varint(value.len() as u64, out);
        out.extend_from_slice(value);
    }

    /// A whole frame: command, then (metadata, payload) behind a checksum.
    fn frame(kind: u32, body: &[u8], section: Option<(&[u8], &[u8])>) -> Vec<u8> {
        let mut cmd = Vec::new();
        int(1, u64::from(kind), &mut cmd);
        field_bytes(kind, body, &mut cmd);
        let mut rest = Vec::new();
        if let Some((meta, payload)) = section {
            let mut checked = (meta.len() as u32).to_be_bytes().to_vec();
            checked.extend_from_slice(meta);
            checked.extend_from_slice(payload);
            rest.extend_from_slice(&[0x0e, 0x01]);
            rest.extend_from_slice(&crc32c(&checked).to_be_bytes());
            rest.extend_from_slice(&checked);
        }
        let mut out = ((4 + cmd.len() + rest.len()) as u32).to_be_bytes().to_vec();
        out.extend_from_slice(&(cmd.len() as u32).to_be_bytes());
        out.extend_from_slice(&cmd);
        out.extend_from_slice(&rest);
        out
    }

    fn meta(extra: &[(u32, u64)]) -> Vec<u8> {
        let mut out = Vec::new();
        field_bytes(1, b"producer-1", &mut out);
        int(2, 7, &mut out);
        int(3, 1_700_000_000_000, &mut out);
        for &(field, value) in extra {
            int(field, value, &mut out);
        }
        out
    }

    fn id(ledger: u64, entry: u64, partition: Option<u64>) -> Vec<u8> {
        let mut out = Vec::new();
        int(1, ledger, &mut out);
        int(2, entry, &mut out);
        if let Some(partition) = partition {
            int(3, partition, &mut out);
        }
        out
    }

    fn send(message_ids: &[Vec<u8>]) -> Vec<u8> {
        let mut body = Vec::new();
        int(1, 3, &mut body);
        int(2, 41, &mut body);
        for message_id in message_ids {
            field_bytes(9, message_id, &mut body);
        }
        body
    }

    #[test]
    fn a_send_with_or_without_its_payload() {
        let whole = frame(SEND, &send(&[]), Some((&meta(&[(11, 10)]), &[b'x'; 300])));
        let payload_offset = whole.len() - 300;
        let expected = Summary {
            kind: SEND,
            a: 3,
            b: 41,
            message_id: None,
            counted: Some(Counted {
                in_batch: 10,
                chunks: 0,
                chunk_id: 0,
                uuid: "",
                total_size: 0,
            }),
        };
        assert_eq!(summary(&whole), Some(expected));
        // As recorded with the payload left out: the prefix still says the
        // size on the wire, the checksum no longer matches.
        assert_eq!(summary(&whole[..payload_offset]), Some(expected));
        // A broken payload changes nothing either.
        let mut broken = whole.clone();
        let last = broken.len() - 1;
        broken[last] ^= 1;
        assert_eq!(summary(&broken), Some(expected));
    }

    #[test]
    fn message_ids_and_chunks() {
        // A negative partition is a 10-byte varint; the batch index defaults to -1.
        let body = send(&[id(5, 6, Some(u64::MAX - 1))]);
        let mut chunked = meta(&[(27, 3), (29, 2), (28, 3000)]);
        field_bytes(26, b"uuid-1", &mut chunked);
        let wire = frame(SEND, &body, Some((&chunked, b"x")));
        let found = summary(&wire).unwrap();
        let message_id = MessageId {
            ledger: 5,
            entry: 6,
            partition: -2,
            batch_index: -1,
        };
        assert_eq!(found.message_id, Some(message_id));
        let expected = Counted {
            in_batch: 1,
            chunks: 3,
            chunk_id: 2,
            uuid: "uuid-1",
            total_size: 3000,
        };
        assert_eq!(found.counted, Some(expected));

        let mut body = Vec::new();
        int(1, 4, &mut body);
        field_bytes(2, &id(10, 20, None), &mut body);
        let wire = frame(MESSAGE, &body, Some((&meta(&[]), b"x")));
        let found = summary(&wire).unwrap();
        assert_eq!((found.kind, found.a, found.b), (MESSAGE, 4, 0));
        assert_eq!(
            found.message_id.map(|m| (m.ledger, m.entry)),
            Some((10, 20))
        );
        assert_eq!(found.counted.map(|c| c.in_batch), Some(1));
    }

    #[test]
    fn receipts_flow_and_ack() {
        let mut body = Vec::new();
        int(1, 3, &mut body);
        int(2, 41, &mut body);
        field_bytes(3, &id(1, 2, Some(0)), &mut body);
        let wire = frame(SEND_RECEIPT, &body, None);
        let found = summary(&wire).unwrap();
        assert_eq!((found.kind, found.a, found.b), (SEND_RECEIPT, 3, 41));
        assert_eq!(found.message_id.map(|m| m.partition), Some(0));
        assert_eq!(found.counted, None);

        let mut body = Vec::new();
        int(1, 9, &mut body);
        int(2, 1000, &mut body);
        let wire = frame(FLOW, &body, None);
        let found = summary(&wire).unwrap();
        assert_eq!((found.kind, found.a, found.b), (FLOW, 9, 0));

        let mut body = Vec::new();
        int(1, 9, &mut body);
        int(2, 0, &mut body);
        field_bytes(3, &id(1, 2, None), &mut body);
        let wire = frame(ACK, &body, None);
        let found = summary(&wire).unwrap();
        assert_eq!((found.kind, found.a, found.message_id), (ACK, 9, None));
        int(8, 77, &mut body); // a request: the correlator keeps it, in Python
        assert_eq!(summary(&frame(ACK, &body, None)), None);
    }

    #[test]
    fn what_is_left_to_python() {
        let meta = meta(&[]);
        // A message_id twice (protobuf merges them).
        let twice = send(&[id(1, 2, None), id(3, 4, None)]);
        assert_eq!(summary(&frame(SEND, &twice, Some((&meta, b"x")))), None);
        // A SEND without metadata; a receipt with bytes after it.
        assert_eq!(summary(&frame(SEND, &send(&[]), None)), None);
        let mut body = Vec::new();
        int(1, 3, &mut body);
        int(2, 41, &mut body);
        let mut trailing = frame(SEND_RECEIPT, &body, None);
        trailing.push(0);
        assert_eq!(summary(&trailing), None);
        // Broker entry metadata.
        let mut bem = frame(SEND, &send(&[]), Some((&meta, b"x")));
        let cmd_end = 8 + be32(&bem[4..8]) as usize;
        bem[cmd_end + 1] = 0x02;
        assert_eq!(summary(&bem), None);
        // Metadata without its required fields; another command (PING).
        let mut partial = Vec::new();
        field_bytes(1, b"p", &mut partial);
        assert_eq!(
            summary(&frame(SEND, &send(&[]), Some((&partial, b"x")))),
            None
        );
        assert_eq!(summary(&frame(18, &[], None)), None);
    }

    #[test]
    fn no_input_panics_or_reads_past_its_buffer() {
        let mut chunked = meta(&[(27, 3), (29, 2), (28, 3000)]);
        field_bytes(26, b"uuid-1", &mut chunked);
        let wire = frame(SEND, &send(&[id(5, 6, Some(1))]), Some((&chunked, b"xyz")));
        for cut in 0..=wire.len() {
            let _ = summary(&wire[..cut]);
        }
        for i in 0..wire.len() {
            for value in [0u8, 1, 0x02, 0x0e, 0x7f, 0x80, 0xff] {
                let mut changed = wire.clone();
                changed[i] = value;
                let _ = summary(&changed);
                let _ = summary(&changed[..i]);
            }
        }
    }
}
