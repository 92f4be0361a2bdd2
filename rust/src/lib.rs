//! Sluice's compiled frame scanner for the Pulsar binary protocol.
//!
//! One call per read: given the bytes a socket returned, find every complete
//! frame, and for the commands that make up nearly all traffic (SEND,
//! SEND_RECEIPT, MESSAGE, ACK, FLOW) check everything the Python decoder
//! checks (sizes, the command and its required fields, the CRC32-C, the
//! message metadata and its required fields) and read the few numbers the
//! proxy's core needs (producer, sequence and consumer ids, message counts).
//!
//! The scanner only ever says "valid, and here are its numbers" or "not
//! mine": anything unusual (another command type, a problem of any kind, an
//! encoding it does not handle) is left to the Python decoder, which stays the
//! reference and says what is wrong. So the two can only disagree by the
//! scanner calling valid what Python would not; the differential tests and
//! the fuzzer look for exactly that.
//!
//! Nothing here indexes a slice without a bound check: every read goes
//! through `get`, so no input can read past a buffer or panic.

pub const SEND: u32 = 6;
pub const SEND_RECEIPT: u32 = 7;
pub const MESSAGE: u32 = 9;
pub const ACK: u32 = 10;
pub const FLOW: u32 = 11;

pub mod account;
pub mod carrier;
pub mod cursus;
pub mod record;
pub mod seal;
pub mod sockets;
pub mod step;
pub mod summary;

const MAGIC_CHECKSUM: u16 = 0x0e01;
const MAGIC_BROKER_ENTRY_METADATA: u16 = 0x0e02;
// MessageIdData nests itself (first_chunk_message_id); real ids nest once.
const MAX_DEPTH: u32 = 8;

/// What the scanner found for one complete frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scanned {
    /// Offset just past the frame in the scanned buffer.
    pub stop: usize,
    /// The command type of a valid hot frame; 0 when the frame is left to
    /// the Python decoder.
    pub kind: u32,
    /// Offset of metaSize within the frame; -1 without a payload section.
    pub metadata_offset: i64,
    /// Offset of the application payload within the frame; -1 without one.
    pub payload_offset: i64,
    /// The checksum as sent; -1 when the frame carries none.
    pub checksum: i64,
    /// SEND, SEND_RECEIPT: producer id. MESSAGE, ACK, FLOW: consumer id.
    pub a: u64,
    /// SEND, SEND_RECEIPT: sequence id. FLOW: permits. Otherwise 0.
    pub b: u64,
    /// SEND: num_messages. MESSAGE: the metadata's num_messages_in_batch.
    pub c: i64,
    /// SEND, MESSAGE: the metadata's num_messages_in_batch (1 when absent):
    /// what the filter metrics count a SEND's messages by, not `c`.
    pub in_batch: i64,
    /// How many properties the message metadata holds (they may hold secrets).
    pub properties: u32,
    /// ACK: it carries a request_id, so its sender awaits an answer.
    pub asks: bool,
}

impl Scanned {
    fn left(stop: usize) -> Scanned {
        Scanned {
            stop,
            kind: 0,
            metadata_offset: -1,
            payload_offset: -1,
            checksum: -1,
            a: 0,
            b: 0,
            c: 0,
            in_batch: 0,
            properties: 0,
            asks: false,
        }
    }
}

/// Every complete frame in `buf` from `pos` on, stopping before a frame that
/// is incomplete or whose length prefix exceeds `max_total` (the Python
/// decoder deals with both: it waits for more bytes or says what is wrong).
pub fn scan(buf: &[u8], pos: usize, max_total: u32) -> Vec<Scanned> {
    let mut out = Vec::new();
    scan_into(buf, pos, max_total, &mut out);
    out
}

/// `scan`, appending to `out` (the relay thread reuses one Vec for every
/// read instead of allocating one per read).
pub fn scan_into(buf: &[u8], mut pos: usize, max_total: u32, out: &mut Vec<Scanned>) {
    while let Some(prefix) = buf.get(pos..pos.saturating_add(4)) {
        if prefix.len() < 4 {
            break;
        }
        let total = be32(prefix);
        if total > max_total {
            break;
        }
        let stop = match pos.checked_add(4 + total as usize) {
            Some(stop) if stop <= buf.len() => stop,
            _ => break,
        };
        let mut found = check_frame(&buf[pos..stop]).unwrap_or_else(|| Scanned::left(0));
        found.stop = stop;
        out.push(found);
        pos = stop;
    }
}

/// A whole frame (length prefix included): its findings if it is a valid
/// frame of a hot type in a layout handled here, else None.
pub fn check_frame(frame: &[u8]) -> Option<Scanned> {
    let size = frame.len();
    let total = be32(frame.get(0..4)?) as usize;
    if total + 4 != size {
        return None;
    }
    let cmd_size = be32(frame.get(4..8)?) as usize;
    let cmd_end = 8usize.checked_add(cmd_size)?;
    let (kind, body) = base_command(frame.get(8..cmd_end)?)?;
    let mut found = Scanned::left(0);
    found.kind = kind;
    match kind {
        SEND => {
            let (producer, sequence, messages) = send(body)?;
            found.a = producer;
            found.b = sequence;
            found.c = messages;
        }
        SEND_RECEIPT => {
            let (producer, sequence) = send_receipt(body)?;
            found.a = producer;
            found.b = sequence;
        }
        MESSAGE => found.a = message(body)?,
        ACK => (found.a, found.asks) = ack(body)?,
        FLOW => {
            let (consumer, permits) = flow(body)?;
            found.a = consumer;
            found.b = permits;
        }
        _ => return None,
    }
    if kind != SEND && kind != MESSAGE {
        // Commands without a payload section end with the command.
        return (cmd_end == size).then_some(found);
    }
    // [0x0e01][crc32c]? [metaSize][MessageMetadata][payload]; frames with
    // broker entry metadata are left to Python (brokers add it only when
    // configured to).
    let magic = be16(frame.get(cmd_end..cmd_end + 2)?);
    frame.get(cmd_end..cmd_end + 6)?;
    let mut offset = cmd_end;
    if magic == MAGIC_BROKER_ENTRY_METADATA {
        return None;
    }
    if magic == MAGIC_CHECKSUM {
        let checksum = be32(frame.get(cmd_end + 2..cmd_end + 6)?);
        offset = cmd_end + 6;
        if crc32c(frame.get(offset..)?) != checksum {
            return None;
        }
        found.checksum = i64::from(checksum);
    }
    let meta_size = be32(frame.get(offset..offset + 4)?) as usize;
    let payload = (offset + 4).checked_add(meta_size)?;
    let (properties, in_batch, counted) = metadata(frame.get(offset + 4..payload)?)?;
    found.metadata_offset = offset as i64;
    found.payload_offset = payload as i64;
    found.properties = properties;
    found.in_batch = in_batch;
    if kind == MESSAGE {
        found.c = in_batch;
    }
    if !counted {
        found.c = 0; // a chunk before the last: its message is counted on the last
    }
    Some(found)
}

/// CRC32-C (Castagnoli) of `data`, as Pulsar's checksum: the one place the
/// compiled code computes it.
pub fn crc32c(data: &[u8]) -> u32 {
    crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, data) as u32
}

fn be32(bytes: &[u8]) -> u32 {
    u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]])
}

fn be16(bytes: &[u8]) -> u16 {
    u16::from_be_bytes([bytes[0], bytes[1]])
}

// --- protobuf wire format -------------------------------------------------------

const VARINT: u8 = 0;
const FIXED64: u8 = 1;
const LEN: u8 = 2;
const FIXED32: u8 = 5;

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }

    fn done(&self) -> bool {
        self.pos >= self.buf.len()
    }

    /// A varint of at most 10 bytes whose value fits 64 bits; None otherwise
    /// (left to Python, whatever its parser makes of it). Most keys and many
    /// values are one byte: that case is inlined at every field, the rest
    /// is a call. (Reading 8 bytes as one word and closing up their 7-bit
    /// groups took more instructions than this for the ids and sizes of real
    /// traffic, of 2 or 3 bytes.)
    #[inline(always)]
    fn varint(&mut self) -> Option<u64> {
        let byte = *self.buf.get(self.pos)?;
        if byte < 0x80 {
            self.pos += 1;
            return Some(u64::from(byte));
        }
        if let Some(&second) = self.buf.get(self.pos + 1) {
            if second < 0x80 {
                self.pos += 2;
                return Some(u64::from(byte & 0x7f) | u64::from(second) << 7);
            }
        }
        self.long_varint()
    }

    /// `varint` for a value nobody reads: the same bytes taken, or refused,
    /// without working the value out. Its end is found in one 8-byte word
    /// where it can be: a MessageIdData's partition and batch index of -1
    /// are ten bytes each, a publish time six, and the loop that adds up
    /// their 7-bit groups was a sixth of a consumed message's scan.
    #[inline(always)]
    fn skip_varint(&mut self) -> Option<()> {
        let rest = &self.buf[self.pos.min(self.buf.len())..];
        if let Some(word) = rest.get(..8) {
            let word = u64::from_le_bytes(word.try_into().ok()?);
            // A byte below 0x80 ends it: its high bit, the lowest such.
            let ends = !word & 0x8080_8080_8080_8080;
            if ends != 0 {
                self.pos += (ends.trailing_zeros() / 8) as usize + 1;
                return Some(());
            }
            // Eight bytes that go on: the ninth may end it; else the tenth
            // must, and may hold only the value's top bit.
            if *rest.get(8)? < 0x80 {
                self.pos += 9;
                return Some(());
            }
            if *rest.get(9)? > 1 {
                return None;
            }
            self.pos += 10;
            return Some(());
        }
        // Fewer than 8 bytes left (a field at the end of its message, such
        // as a MessageIdData's entry id): the first byte below 0x80 ends it,
        // and a varint of at most 7 bytes cannot overflow.
        let end = rest.iter().position(|&byte| byte < 0x80)?;
        self.pos += end + 1;
        Some(())
    }

    /// `varint`, of two bytes or more.
    #[inline(never)]
    fn long_varint(&mut self) -> Option<u64> {
        let mut value: u64 = 0;
        for i in 0..10 {
            let byte = *self.buf.get(self.pos)?;
            self.pos += 1;
            if i == 9 && byte > 1 {
                return None;
            }
            value |= u64::from(byte & 0x7f) << (7 * i);
            if byte & 0x80 == 0 {
                return Some(value);
            }
        }
        None
    }

    /// (field number, wire type). Field 0 and numbers past 2^29 - 1 are
    /// invalid protobuf, and so is a key of more than 5 bytes (protobuf's
    /// parser refuses one, however small its value: a padded key).
    #[inline(always)]
    fn key(&mut self) -> Option<(u32, u8)> {
        let start = self.pos;
        let key = self.varint()?;
        if self.pos - start > 5 {
            return None;
        }
        let field = key >> 3;
        if field == 0 || field > (1 << 29) - 1 {
            return None;
        }
        Some((field as u32, (key & 7) as u8))
    }

    /// A length-delimited field's bytes. Its length is read as protobuf's
    /// parser reads one: a varint of at most 5 bytes (a longer one, however
    /// small its value, is a corrupt message to it).
    fn bytes(&mut self) -> Option<&'a [u8]> {
        let start = self.pos;
        let len = self.varint()?;
        if self.pos - start > 5 {
            return None;
        }
        let len = usize::try_from(len).ok()?;
        let end = self.pos.checked_add(len)?;
        let out = self.buf.get(self.pos..end)?;
        self.pos = end;
        Some(out)
    }

    /// A string field: its bytes, which must be UTF-8 (as protobuf's
    /// parser insists). Names and keys are nearly always ASCII, checked a
    /// word at a time before the full check.
    fn string(&mut self) -> Option<&'a [u8]> {
        let out = self.bytes()?;
        if !out.is_ascii() {
            std::str::from_utf8(out).ok()?;
        }
        Some(out)
    }

    fn fixed(&mut self, n: usize) -> Option<()> {
        let end = self.pos.checked_add(n)?;
        self.buf.get(self.pos..end)?;
        self.pos = end;
        Some(())
    }

    /// Skip a field this scanner does not read (protobuf parsers keep such
    /// fields as unknown; groups are left to Python).
    fn skip(&mut self, wire: u8) -> Option<()> {
        match wire {
            VARINT => self.skip_varint(),
            FIXED64 => self.fixed(8),
            LEN => self.bytes().map(|_| ()),
            FIXED32 => self.fixed(4),
            _ => None,
        }
    }

    /// A repeated varint field, either encoding (one value, or packed).
    fn repeated_varint(&mut self, wire: u8) -> Option<()> {
        match wire {
            VARINT => self.skip_varint(),
            LEN => {
                let mut packed = Reader::new(self.bytes()?);
                while !packed.done() {
                    packed.skip_varint()?;
                }
                Some(())
            }
            _ => None,
        }
    }
}

/// proto2 int32: the varint's low 32 bits, signed.
fn int32(value: u64) -> i64 {
    i64::from(value as u32 as i32)
}

/// BaseCommand: `type` and the one body it names, nothing else.
fn base_command(bytes: &[u8]) -> Option<(u32, &[u8])> {
    // As clients and brokers lay it out: the type (one byte), then its body
    // as the last field. Anything else is read field by field.
    if let [0x08, kind, key, rest @ ..] = bytes {
        let field = u32::from(*kind);
        if matches!(field, SEND | SEND_RECEIPT | MESSAGE | ACK | FLOW)
            && u32::from(*key) == field << 3 | u32::from(LEN)
        {
            let mut r = Reader::new(rest);
            if let Some(body) = r.bytes() {
                if r.done() {
                    return Some((field, body));
                }
            }
        }
    }
    base_command_fields(bytes)
}

/// `base_command`, field by field.
fn base_command_fields(bytes: &[u8]) -> Option<(u32, &[u8])> {
    let mut r = Reader::new(bytes);
    let mut kind: Option<u64> = None;
    let mut body: Option<(u32, &[u8])> = None;
    while !r.done() {
        let (field, wire) = r.key()?;
        match (field, wire) {
            (1, VARINT) => kind = Some(r.varint()?),
            (SEND | SEND_RECEIPT | MESSAGE | ACK | FLOW, LEN) => {
                if body.is_some() {
                    return None; // a repeated body merges: left to Python
                }
                body = Some((field, r.bytes()?));
            }
            _ => return None,
        }
    }
    let (field, bytes) = body?;
    (kind? == u64::from(field)).then_some((field, bytes))
}

/// MessageIdData: ledgerId and entryId required.
fn message_id(bytes: &[u8], depth: u32) -> Option<()> {
    if depth > MAX_DEPTH {
        return None;
    }
    let mut r = Reader::new(bytes);
    let (mut ledger, mut entry) = (false, false);
    while !r.done() {
        let (field, wire) = r.key()?;
        match (field, wire) {
            (1, VARINT) => {
                r.skip_varint()?;
                ledger = true;
            }
            (2, VARINT) => {
                r.skip_varint()?;
                entry = true;
            }
            (3 | 4 | 6, VARINT) => {
                r.skip_varint()?;
            }
            (5, _) => r.repeated_varint(wire)?,
            (7, LEN) => message_id(r.bytes()?, depth + 1)?,
            (1..=7, _) => return None,
            _ => r.skip(wire)?,
        }
    }
    (ledger && entry).then_some(())
}

/// CommandSend: (producer_id, sequence_id, num_messages).
fn send(bytes: &[u8]) -> Option<(u64, u64, i64)> {
    let mut r = Reader::new(bytes);
    let (mut producer, mut sequence, mut messages) = (None, None, 1);
    while !r.done() {
        let (field, wire) = r.key()?;
        match (field, wire) {
            (1, VARINT) => producer = Some(r.varint()?),
            (2, VARINT) => sequence = Some(r.varint()?),
            (3, VARINT) => messages = int32(r.varint()?),
            (4..=8, VARINT) => {
                r.skip_varint()?;
            }
            (9, LEN) => message_id(r.bytes()?, 0)?,
            (1..=9, _) => return None,
            _ => r.skip(wire)?,
        }
    }
    Some((producer?, sequence?, messages))
}

/// CommandSendReceipt: (producer_id, sequence_id).
fn send_receipt(bytes: &[u8]) -> Option<(u64, u64)> {
    let mut r = Reader::new(bytes);
    let (mut producer, mut sequence) = (None, None);
    while !r.done() {
        let (field, wire) = r.key()?;
        match (field, wire) {
            (1, VARINT) => producer = Some(r.varint()?),
            (2, VARINT) => sequence = Some(r.varint()?),
            (3, LEN) => message_id(r.bytes()?, 0)?,
            (4, VARINT) => {
                r.skip_varint()?;
            }
            (1..=4, _) => return None,
            _ => r.skip(wire)?,
        }
    }
    Some((producer?, sequence?))
}

/// CommandMessage: consumer_id (message_id required too).
fn message(bytes: &[u8]) -> Option<u64> {
    let mut r = Reader::new(bytes);
    let (mut consumer, mut id) = (None, false);
    while !r.done() {
        let (field, wire) = r.key()?;
        match (field, wire) {
            (1, VARINT) => consumer = Some(r.varint()?),
            (2, LEN) => {
                message_id(r.bytes()?, 0)?;
                id = true;
            }
            (3 | 5, VARINT) => {
                r.skip_varint()?;
            }
            (4, _) => r.repeated_varint(wire)?,
            (1..=5, _) => return None,
            _ => r.skip(wire)?,
        }
    }
    if !id {
        return None;
    }
    consumer
}

/// CommandAck: (consumer_id, whether it carries a request_id); ack_type is
/// required, a known AckType.
fn ack(bytes: &[u8]) -> Option<(u64, bool)> {
    let mut r = Reader::new(bytes);
    let (mut consumer, mut ack_type, mut asks) = (None, false, false);
    while !r.done() {
        let (field, wire) = r.key()?;
        match (field, wire) {
            (1, VARINT) => consumer = Some(r.varint()?),
            // A value outside the enum is an unknown field to protobuf, which
            // leaves the required field unset: left to Python.
            (2, VARINT) => {
                if r.varint()? > 1 {
                    return None;
                }
                ack_type = true;
            }
            (3, LEN) => message_id(r.bytes()?, 0)?,
            (5, LEN) => key_long_value(r.bytes()?)?,
            (4 | 6 | 7, VARINT) => {
                r.skip_varint()?;
            }
            (8, VARINT) => {
                r.skip_varint()?;
                asks = true;
            }
            (1..=8, _) => return None,
            _ => r.skip(wire)?,
        }
    }
    if !ack_type {
        return None;
    }
    Some((consumer?, asks))
}

/// CommandFlow: (consumer_id, messagePermits).
fn flow(bytes: &[u8]) -> Option<(u64, u64)> {
    let mut r = Reader::new(bytes);
    let (mut consumer, mut permits) = (None, None);
    while !r.done() {
        let (field, wire) = r.key()?;
        match (field, wire) {
            (1, VARINT) => consumer = Some(r.varint()?),
            (2, VARINT) => permits = Some(u64::from(r.varint()? as u32)),
            (1 | 2, _) => return None,
            _ => r.skip(wire)?,
        }
    }
    Some((consumer?, permits?))
}

fn key_value(bytes: &[u8]) -> Option<()> {
    let mut r = Reader::new(bytes);
    let (mut key, mut value) = (false, false);
    while !r.done() {
        let (field, wire) = r.key()?;
        match (field, wire) {
            (1, LEN) => {
                r.string()?;
                key = true;
            }
            (2, LEN) => {
                r.string()?;
                value = true;
            }
            (1 | 2, _) => return None,
            _ => r.skip(wire)?,
        }
    }
    (key && value).then_some(())
}

fn key_long_value(bytes: &[u8]) -> Option<()> {
    let mut r = Reader::new(bytes);
    let (mut key, mut value) = (false, false);
    while !r.done() {
        let (field, wire) = r.key()?;
        match (field, wire) {
            (1, LEN) => {
                r.string()?;
                key = true;
            }
            (2, VARINT) => {
                r.skip_varint()?;
                value = true;
            }
            (1 | 2, _) => return None,
            _ => r.skip(wire)?,
        }
    }
    (key && value).then_some(())
}

fn encryption_keys(bytes: &[u8]) -> Option<()> {
    let mut r = Reader::new(bytes);
    let (mut key, mut value) = (false, false);
    while !r.done() {
        let (field, wire) = r.key()?;
        match (field, wire) {
            (1, LEN) => {
                r.string()?;
                key = true;
            }
            (2, LEN) => {
                r.bytes()?;
                value = true;
            }
            (3, LEN) => key_value(r.bytes()?)?,
            (1..=3, _) => return None,
            _ => r.skip(wire)?,
        }
    }
    (key && value).then_some(())
}

/// MessageMetadata: (number of properties, num_messages_in_batch, whether
/// the frame's messages count: false for a chunk before a chunked message's
/// last, which counts the message once).
fn metadata(bytes: &[u8]) -> Option<(u32, i64, bool)> {
    let mut r = Reader::new(bytes);
    let (mut producer, mut sequence, mut published) = (false, false, false);
    let mut properties: u32 = 0;
    let mut in_batch: i64 = 1;
    let (mut chunk_id, mut chunks): (i64, i64) = (0, 0);
    while !r.done() {
        let (field, wire) = r.key()?;
        match (field, wire) {
            (1, LEN) => {
                r.string()?;
                producer = true;
            }
            (2, VARINT) => {
                r.skip_varint()?;
                sequence = true;
            }
            (3, VARINT) => {
                r.skip_varint()?;
                published = true;
            }
            (4, LEN) => {
                key_value(r.bytes()?)?;
                properties = properties.saturating_add(1);
            }
            // strings
            (5 | 6 | 7 | 14 | 26, LEN) => {
                r.string()?;
            }
            // bytes
            (15 | 16 | 18 | 32, LEN) => {
                r.bytes()?;
            }
            (11, VARINT) => in_batch = int32(r.varint()?),
            (27, VARINT) => chunks = int32(r.varint()?),
            (29, VARINT) => chunk_id = int32(r.varint()?),
            (8 | 9 | 12 | 17 | 19 | 20 | 22 | 23 | 24 | 25 | 28 | 30 | 33 | 34, VARINT) => {
                r.skip_varint()?;
            }
            (13, LEN) => encryption_keys(r.bytes()?)?,
            (31, _) => r.repeated_varint(wire)?,
            (1..=34, _) => return None,
            _ => r.skip(wire)?,
        }
    }
    let counted = chunks <= 1 || chunk_id == chunks - 1;
    (producer && sequence && published).then_some((properties, in_batch, counted))
}

#[cfg(feature = "python")]
pub mod python {
    use pyo3::exceptions::{PyIndexError, PyValueError};
    use pyo3::intern;
    use pyo3::prelude::*;
    use pyo3::types::{PyBytes, PyIterator, PyList};

    /// scan(data, pos, max_total) -> list of (stop, kind, metadata_offset,
    /// payload_offset, checksum, a, b, c, properties), one per complete
    /// frame from `pos`; kind 0 means "decode this one in Python".
    #[pyfunction]
    fn scan<'py>(
        py: Python<'py>,
        data: &[u8],
        pos: usize,
        max_total: u32,
    ) -> PyResult<Bound<'py, PyList>> {
        if pos > data.len() {
            return Err(PyValueError::new_err("pos is past the end of data"));
        }
        let found = super::scan(data, pos, max_total);
        PyList::new(py, found.iter().map(as_tuple))
    }

    /// pack_frames(prefix, frames, payloads) -> list of records (bytes), with
    /// None for each frame left to the Python recorder: any frame but one
    /// the scanner vouched for and counted no properties in (``properties``
    /// 0, ``error`` None), as only those are known to hold no credentials.
    /// payloads: 0 full, 1 hash, 2 size.
    #[pyfunction]
    fn pack_frames<'py>(
        py: Python<'py>,
        prefix: &[u8],
        frames: &Bound<'py, PyList>,
        payloads: u8,
    ) -> PyResult<Bound<'py, PyList>> {
        let payloads = payload_policy(payloads)?;
        let out = PyList::empty(py);
        for frame in frames.iter() {
            let properties: i64 = frame.getattr(intern!(py, "properties"))?.extract()?;
            if properties != 0 || !frame.getattr(intern!(py, "error"))?.is_none() {
                out.append(py.None())?;
                continue;
            }
            let raw = frame.getattr(intern!(py, "raw"))?;
            let raw = raw.cast::<PyBytes>()?;
            let offset: i64 = frame.getattr(intern!(py, "payload_offset"))?.extract()?;
            let record = super::record::frame_record(prefix, raw.as_bytes(), offset, payloads);
            out.append(PyBytes::new(py, &record))?;
        }
        Ok(out)
    }

    /// (command type, frames, bytes)
    type Tally = (u32, u64, u64);

    /// One ``scan`` tuple: (stop, kind, metadata_offset, payload_offset,
    /// checksum, a, b, c, properties).
    type Found = (usize, u32, i64, i64, i64, u64, u64, i64, u32);

    fn as_tuple(s: &super::Scanned) -> Found {
        (
            s.stop,
            s.kind,
            s.metadata_offset,
            s.payload_offset,
            s.checksum,
            s.a,
            s.b,
            s.c,
            s.properties,
        )
    }

    /// The frames of a read the scanner took whole, kept in Rust: a
    /// sequence of ``scan`` tuples (made when asked for), their tallies by
    /// type, and the recorder's records. Made by ``scan_batch``.
    #[pyclass(module = "sluice._frames", frozen, sequence)]
    pub struct Batch {
        pub(crate) found: Vec<super::Scanned>,
        /// Where the first frame starts in the scanned bytes.
        #[pyo3(get)]
        start: usize,
    }

    #[pymethods]
    impl Batch {
        fn __len__(&self) -> usize {
            self.found.len()
        }

        fn __getitem__(&self, index: isize) -> PyResult<Found> {
            let n = self.found.len() as isize;
            let i = if index < 0 { index + n } else { index };
            if i < 0 || i >= n {
                return Err(PyIndexError::new_err("batch index out of range"));
            }
            Ok(as_tuple(&self.found[i as usize]))
        }

        fn __iter__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyIterator>> {
            PyList::new(py, self.found.iter().map(as_tuple))?.try_iter()
        }

        /// Where the last frame ends in the scanned bytes.
        #[getter]
        fn stop(&self) -> usize {
            self.found.last().map_or(self.start, |s| s.stop)
        }

        /// [(kind, frames, bytes), ...], one per command type, in the order
        /// types first come.
        #[getter]
        fn counts(&self) -> Vec<Tally> {
            let mut counts: Vec<Tally> = Vec::new();
            let mut from = self.start;
            for s in &self.found {
                let size = s.stop.saturating_sub(from) as u64;
                from = s.stop;
                match counts.iter_mut().find(|c| c.0 == s.kind) {
                    Some(c) => {
                        c.1 += 1;
                        c.2 += size;
                    }
                    None => counts.push((s.kind, 1, size)),
                }
            }
            counts
        }

        /// pack(prefix, data, payloads) -> records as ``pack_frames`` makes
        /// them, for these frames of ``data`` (the bytes scanned), with None
        /// for each whose metadata holds properties (left to Python: they
        /// may hold credentials).
        fn pack<'py>(
            &self,
            py: Python<'py>,
            prefix: &[u8],
            data: &[u8],
            payloads: u8,
        ) -> PyResult<Bound<'py, PyList>> {
            let payloads = payload_policy(payloads)?;
            let out = PyList::empty(py);
            let mut from = self.start;
            for s in &self.found {
                let frame = data
                    .get(from..s.stop)
                    .ok_or_else(|| PyValueError::new_err("a frame outside data"))?;
                from = s.stop;
                if s.properties != 0 {
                    out.append(py.None())?;
                    continue;
                }
                let record = super::record::frame_record(prefix, frame, s.payload_offset, payloads);
                out.append(PyBytes::new(py, &record))?;
            }
            Ok(out)
        }
    }

    /// scan_batch(data, pos, max_total) -> Batch of every complete frame
    /// from `pos` when the scanner took every one of them; None when there
    /// is none, or one is left to the Python decoder.
    #[pyfunction]
    fn scan_batch(data: &[u8], pos: usize, max_total: u32) -> PyResult<Option<Batch>> {
        if pos > data.len() {
            return Err(PyValueError::new_err("pos is past the end of data"));
        }
        let found = super::scan(data, pos, max_total);
        if found.is_empty() || found.iter().any(|s| s.kind == 0) {
            return Ok(None);
        }
        Ok(Some(Batch { found, start: pos }))
    }

    pub(crate) fn payload_policy(code: u8) -> PyResult<super::record::Payloads> {
        match code {
            0 => Ok(super::record::Payloads::Full),
            1 => Ok(super::record::Payloads::Hash),
            2 => Ok(super::record::Payloads::Size),
            _ => Err(PyValueError::new_err("payloads is 0, 1 or 2")),
        }
    }

    #[pymodule]
    fn _frames(m: &Bound<'_, PyModule>) -> PyResult<()> {
        m.add("STEP_HOLD_MAX", crate::step::HOLD_MAX)?;
        m.add_function(wrap_pyfunction!(scan_batch, m)?)?;
        m.add_function(wrap_pyfunction!(
            crate::cursus::python::cursus_batch_head,
            m
        )?)?;
        m.add_class::<Batch>()?;
        m.add_function(wrap_pyfunction!(scan, m)?)?;
        m.add_function(wrap_pyfunction!(pack_frames, m)?)?;
        m.add_function(wrap_pyfunction!(crate::summary::python::summary, m)?)?;
        m.add_class::<crate::account::python::SendTable>()?;
        m.add_class::<crate::step::python::Figures>()?;
        m.add_class::<crate::step::python::Step>()?;
        m.add_class::<crate::seal::python::Seal>()?;
        m.add_class::<crate::seal::python::Sealing>()?;
        m.add_class::<crate::carrier::python::Lane>()?;
        m.add_class::<crate::carrier::python::Carrier>()?;
        m.add_class::<crate::carrier::python::Turn>()?;
        m.add_function(wrap_pyfunction!(crate::sockets::python::accept_now, m)?)?;
        m.add_function(wrap_pyfunction!(crate::sockets::python::connect_now, m)?)?;
        m.add_class::<crate::record::python::RecordSink>()?;
        Ok(())
    }
}

#[cfg(test)]
mod tests;
