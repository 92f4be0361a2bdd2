//! Unit tests of the scanner on frames built here. The equivalence with the
//! Python decoder (the reference) is tested from Python on the same bytes:
//! tests/test_compiled_frames.py.

use super::*;

fn varint(mut value: u64, out: &mut Vec<u8>) {
    loop {
        let byte = (value & 0x7f) as u8;
        value >>= 7;
        if value == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

fn field_varint(field: u32, value: u64, out: &mut Vec<u8>) {
    varint(u64::from(field) << 3, out);
    varint(value, out);
}

fn field_bytes(field: u32, value: &[u8], out: &mut Vec<u8>) {
    varint((u64::from(field) << 3) | 2, out);
    varint(value.len() as u64, out);
    out.extend_from_slice(value);
}

fn command(kind: u32, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    field_varint(1, u64::from(kind), &mut out);
    field_bytes(kind, body, &mut out);
    out
}

fn metadata() -> Vec<u8> {
    let mut out = Vec::new();
    field_bytes(1, b"producer-1", &mut out);
    field_varint(2, 7, &mut out);
    field_varint(3, 1_700_000_000_000, &mut out);
    out
}

fn frame(cmd: &[u8], payload_section: Option<(&[u8], &[u8], bool)>) -> Vec<u8> {
    let mut rest = Vec::new();
    if let Some((meta, payload, with_checksum)) = payload_section {
        let mut section = Vec::new();
        section.extend_from_slice(&(meta.len() as u32).to_be_bytes());
        section.extend_from_slice(meta);
        section.extend_from_slice(payload);
        if with_checksum {
            rest.extend_from_slice(&[0x0e, 0x01]);
            rest.extend_from_slice(&crc32c::crc32c(&section).to_be_bytes());
        }
        rest.extend_from_slice(&section);
    }
    let total = 4 + cmd.len() + rest.len();
    let mut out = Vec::new();
    out.extend_from_slice(&(total as u32).to_be_bytes());
    out.extend_from_slice(&(cmd.len() as u32).to_be_bytes());
    out.extend_from_slice(cmd);
    out.extend_from_slice(&rest);
    out
}

fn send_frame(with_checksum: bool) -> Vec<u8> {
    let mut body = Vec::new();
    field_varint(1, 3, &mut body);
    field_varint(2, 41, &mut body);
    field_varint(3, 5, &mut body);
    frame(
        &command(SEND, &body),
        Some((&metadata(), &[b'x'; 100], with_checksum)),
    )
}

#[test]
fn send_with_checksum() {
    let bytes = send_frame(true);
    let found = scan(&bytes, 0, 1 << 20);
    assert_eq!(found.len(), 1);
    let s = found[0];
    assert_eq!(
        (s.stop, s.kind, s.a, s.b, s.c),
        (bytes.len(), SEND, 3, 41, 5)
    );
    assert!(s.checksum >= 0);
    let meta_offset = s.metadata_offset as usize;
    assert_eq!(s.payload_offset as usize, bytes.len() - 100);
    assert_eq!(
        meta_offset + 4 + metadata().len(),
        s.payload_offset as usize
    );
}

#[test]
fn send_without_checksum() {
    let s = check_frame(&send_frame(false)).unwrap();
    assert_eq!(s.checksum, -1);
}

#[test]
fn a_wrong_checksum_is_left_to_python() {
    let mut bytes = send_frame(true);
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    assert_eq!(check_frame(&bytes), None);
    assert_eq!(scan(&bytes, 0, 1 << 20)[0].kind, 0);
}

#[test]
fn missing_required_fields_are_left_to_python() {
    let mut body = Vec::new();
    field_varint(1, 3, &mut body); // no sequence_id
    let bytes = frame(&command(SEND, &body), Some((&metadata(), b"x", true)));
    assert_eq!(check_frame(&bytes), None);
    let mut meta = Vec::new();
    field_bytes(1, b"p", &mut meta);
    field_varint(2, 1, &mut meta); // no publish_time
    let mut body = Vec::new();
    field_varint(1, 3, &mut body);
    field_varint(2, 4, &mut body);
    let bytes = frame(&command(SEND, &body), Some((&meta, b"x", true)));
    assert_eq!(check_frame(&bytes), None);
}

#[test]
fn a_key_padded_past_five_bytes_is_left_to_python() {
    // protobuf reads a key of at most 5 bytes, whatever its value: a key
    // padded to 5 bytes is read; to 6 or more, the message is corrupt.
    for pad in 0..=6usize {
        let valid = pad < 5;
        let padded = |key: u8| {
            let mut out = vec![key | if pad > 0 { 0x80 } else { 0 }];
            if pad > 0 {
                out.extend(std::iter::repeat_n(0x80, pad - 1));
                out.push(0x00);
            }
            out
        };
        // In the SEND: producer_id's key.
        let mut body = padded(0x08);
        varint(3, &mut body);
        field_varint(2, 41, &mut body);
        let bytes = frame(&command(SEND, &body), Some((&metadata(), b"x", true)));
        assert_eq!(check_frame(&bytes).is_some(), valid, "body, pad {pad}");
        // In the metadata: event_time's key (field 12).
        let mut meta = metadata();
        meta.extend(padded(12 << 3));
        varint(1, &mut meta);
        let mut body = Vec::new();
        field_varint(1, 3, &mut body);
        field_varint(2, 41, &mut body);
        let bytes = frame(&command(SEND, &body), Some((&meta, b"x", false)));
        assert_eq!(check_frame(&bytes).is_some(), valid, "metadata, pad {pad}");
    }
}

#[test]
fn a_length_padded_past_five_bytes_is_left_to_python() {
    // protobuf reads a length of at most 5 bytes, whatever its value: a
    // length padded to 5 bytes is read; to 6 or more, the message is corrupt.
    for size in 1..=10usize {
        let valid = size <= 5;
        let padded = |len: u8| {
            let mut out = vec![len];
            if size > 1 {
                out[0] |= 0x80;
                out.extend(std::iter::repeat_n(0x80, size - 2));
                out.push(0x00);
            }
            out
        };
        // The SEND body's length, in the BaseCommand.
        let mut body = Vec::new();
        field_varint(1, 3, &mut body);
        field_varint(2, 41, &mut body);
        let mut cmd = Vec::new();
        field_varint(1, u64::from(SEND), &mut cmd);
        varint(u64::from(SEND) << 3 | 2, &mut cmd);
        cmd.extend(padded(body.len() as u8));
        cmd.extend_from_slice(&body);
        let bytes = frame(&cmd, Some((&metadata(), b"x", true)));
        assert_eq!(check_frame(&bytes).is_some(), valid, "body, {size} bytes");
        // The producer name's length, in the metadata.
        let mut meta = vec![0x0a];
        meta.extend(padded(1));
        meta.push(b'p');
        field_varint(2, 7, &mut meta);
        field_varint(3, 1, &mut meta);
        let bytes = frame(&command(SEND, &body), Some((&meta, b"x", false)));
        assert_eq!(
            check_frame(&bytes).is_some(),
            valid,
            "metadata, {size} bytes"
        );
    }
}

#[test]
fn receipts_flow_and_ack() {
    let mut id = Vec::new();
    field_varint(1, 10, &mut id);
    field_varint(2, 20, &mut id);
    let mut body = Vec::new();
    field_varint(1, 3, &mut body);
    field_varint(2, 41, &mut body);
    field_bytes(3, &id, &mut body);
    let s = check_frame(&frame(&command(SEND_RECEIPT, &body), None)).unwrap();
    assert_eq!((s.kind, s.a, s.b), (SEND_RECEIPT, 3, 41));

    let mut body = Vec::new();
    field_varint(1, 9, &mut body);
    field_varint(2, 1000, &mut body);
    let s = check_frame(&frame(&command(FLOW, &body), None)).unwrap();
    assert_eq!((s.kind, s.a, s.b), (FLOW, 9, 1000));

    let mut body = Vec::new();
    field_varint(1, 9, &mut body);
    field_varint(2, 0, &mut body);
    field_bytes(3, &id, &mut body);
    let s = check_frame(&frame(&command(ACK, &body), None)).unwrap();
    assert_eq!((s.kind, s.a, s.asks), (ACK, 9, false));
    // With a request_id (field 8), its sender awaits an answer.
    field_varint(8, 77, &mut body);
    let s = check_frame(&frame(&command(ACK, &body), None)).unwrap();
    assert_eq!((s.kind, s.a, s.asks), (ACK, 9, true));
    // An AckType outside the enum leaves the required field unset.
    let mut body = Vec::new();
    field_varint(1, 9, &mut body);
    field_varint(2, 7, &mut body);
    assert_eq!(check_frame(&frame(&command(ACK, &body), None)), None);
}

#[test]
fn message_counts_its_batch_and_properties() {
    let mut id = Vec::new();
    field_varint(1, 10, &mut id);
    field_varint(2, 20, &mut id);
    let mut body = Vec::new();
    field_varint(1, 4, &mut body);
    field_bytes(2, &id, &mut body);
    let mut meta = metadata();
    field_varint(11, 12, &mut meta);
    let mut kv = Vec::new();
    field_bytes(1, b"k", &mut kv);
    field_bytes(2, b"v", &mut kv);
    field_bytes(4, &kv, &mut meta);
    let s = check_frame(&frame(&command(MESSAGE, &body), Some((&meta, b"x", true)))).unwrap();
    assert_eq!((s.kind, s.a, s.c, s.properties), (MESSAGE, 4, 12, 1));
}

#[test]
fn a_send_reads_its_batch_count_from_the_metadata_not_num_messages() {
    // What the filter metrics count a sealed SEND by (filtering.message_count):
    // the metadata's num_messages_in_batch, 1 without one, as sent (negatives too).
    let mut body = Vec::new();
    field_varint(1, 3, &mut body);
    field_varint(2, 41, &mut body);
    let s = check_frame(&frame(
        &command(SEND, &body),
        Some((&metadata(), b"x", true)),
    ))
    .unwrap();
    assert_eq!((s.c, s.in_batch), (1, 1));
    field_varint(3, 2, &mut body);
    let mut meta = metadata();
    field_varint(11, u64::MAX, &mut meta); // -1 as an int32 is sent
    let s = check_frame(&frame(&command(SEND, &body), Some((&meta, b"x", true)))).unwrap();
    assert_eq!((s.c, s.in_batch), (2, -1));
}

#[test]
fn the_turn_is_given_back_when_the_steps_holding_it_panic() {
    use crate::carrier::{holding, Semaphore};
    let turn = Semaphore::default();
    turn.acquire();
    assert_eq!(holding(&turn, || 7), 7);
    assert!(turn.try_acquire(), "given back after steps that return");
    // Held again. A step's panic unwinds out of the compiled loop: trio's
    // thread, which waits for the turn (without the GIL), must still get it.
    let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        holding(&turn, || panic!("a bug in a step"))
    }));
    assert!(unwound.is_err());
    assert!(turn.try_acquire(), "given back after a panic");
}

#[test]
fn other_commands_and_trailing_bytes_are_left_to_python() {
    let mut body = Vec::new();
    field_varint(1, 1, &mut body);
    assert_eq!(check_frame(&frame(&command(18, &body), None)), None); // PING
    let mut body = Vec::new();
    field_varint(1, 9, &mut body);
    field_varint(2, 1000, &mut body);
    let mut bytes = frame(&command(FLOW, &body), Some((&metadata(), b"", false)));
    assert_eq!(check_frame(&bytes), None);
    bytes.truncate(bytes.len() - 1);
    assert_eq!(check_frame(&bytes), None);
}

#[test]
fn scan_stops_at_incomplete_and_oversized_frames() {
    let one = send_frame(true);
    let mut two = one.clone();
    two.extend_from_slice(&one);
    assert_eq!(scan(&two, 0, 1 << 20).len(), 2);
    assert_eq!(scan(&two[..two.len() - 1], 0, 1 << 20).len(), 1);
    assert_eq!(scan(&two, one.len(), 1 << 20).len(), 1);
    assert_eq!(scan(&two, 0, 10).len(), 0);
    assert_eq!(scan(&two, two.len() + 5, 1 << 20).len(), 0);
}

#[test]
fn no_input_panics_or_reads_past_its_buffer() {
    // Every prefix and every single-byte change of a valid frame.
    let bytes = send_frame(true);
    for cut in 0..bytes.len() {
        let _ = scan(&bytes[..cut], 0, 1 << 20);
        let _ = check_frame(&bytes[..cut]);
    }
    for i in 0..bytes.len() {
        for value in [0u8, 1, 0x7f, 0x80, 0xff] {
            let mut changed = bytes.clone();
            changed[i] = value;
            let _ = scan(&changed, 0, u32::MAX);
        }
    }
}

#[test]
fn a_varint_read_or_skipped_with_its_shortcuts_is_read_as_byte_by_byte() {
    // Every length from 1 to 10 bytes (values at each 7-bit boundary and
    // between), every terminating byte, a run with no end, an 11th byte and a
    // 10th byte too large, at every offset and cut of a buffer padded with
    // bytes that go on or end: the read's value and end, and the skip's
    // end (skip_varint, which reads 8 bytes at once), as the loop's.
    let mut values: Vec<u64> = vec![0, 1, u64::MAX, u64::MAX - 1, 0x0123_4567_89ab_cdef];
    for bits in 1..64 {
        values.extend([(1u64 << bits) - 1, 1u64 << bits, (1u64 << bits) | 0x55]);
    }
    let mut encodings: Vec<Vec<u8>> = values
        .iter()
        .map(|&v| {
            let mut out = Vec::new();
            varint(v, &mut out);
            out
        })
        .collect();
    encodings.push(vec![0xff; 11]);
    encodings.push([vec![0x80; 9], vec![0x02]].concat());
    encodings.push([vec![0x80; 9], vec![0x01]].concat());
    encodings.push(vec![0x80, 0x00]); // non-minimal, still a varint
    for encoding in &encodings {
        for before in 0..3 {
            for (after, fill) in [0usize, 1, 7, 9]
                .into_iter()
                .flat_map(|a| [(a, 0x80u8), (a, 0)])
            {
                let mut buf = vec![0x81; before];
                buf.extend_from_slice(encoding);
                buf.extend(std::iter::repeat_n(fill, after));
                for cut in before..=buf.len() {
                    let reader = || Reader {
                        buf: &buf[..cut],
                        pos: before,
                    };
                    let (mut quick, mut bytewise, mut skipping) = (reader(), reader(), reader());
                    let got = quick.varint();
                    assert_eq!(got, bytewise.long_varint(), "{encoding:02x?} cut at {cut}");
                    let skipped = skipping.skip_varint();
                    assert_eq!(skipped, got.map(|_| ()), "{encoding:02x?} cut at {cut}");
                    if got.is_some() {
                        assert_eq!(quick.pos, bytewise.pos, "{encoding:02x?} cut at {cut}");
                        assert_eq!(skipping.pos, bytewise.pos, "{encoding:02x?} cut at {cut}");
                    }
                }
            }
        }
    }
    for &v in &values {
        let mut out = Vec::new();
        varint(v, &mut out);
        out.extend([0u8; 8]);
        assert_eq!(Reader::new(&out).varint(), Some(v));
    }
}

#[test]
fn a_base_command_in_the_usual_layout_is_read_as_field_by_field() {
    let mut bodies = Vec::new();
    let mut body = Vec::new();
    field_varint(1, 3, &mut body);
    field_varint(2, 300, &mut body);
    bodies.push(body);
    bodies.push(Vec::new());
    bodies.push(vec![0x55; 200]);
    for kind in [SEND, SEND_RECEIPT, MESSAGE, ACK, FLOW, 2, 12, 200] {
        for body in &bodies {
            let usual = command(kind, body);
            let mut other_order = Vec::new();
            field_bytes(kind, body, &mut other_order);
            field_varint(1, u64::from(kind), &mut other_order);
            let mut twice = usual.clone();
            field_bytes(kind, body, &mut twice);
            for bytes in [usual, other_order, twice] {
                for cut in 0..=bytes.len() {
                    let cut = &bytes[..cut];
                    assert_eq!(base_command(cut), base_command_fields(cut), "{cut:02x?}");
                }
                for i in 0..bytes.len().min(8) {
                    for value in [0u8, 1, 0x08, 0x32, 0x7f, 0x80, 0xff] {
                        let mut changed = bytes.clone();
                        changed[i] = value;
                        let changed = &changed[..];
                        assert_eq!(
                            base_command(changed),
                            base_command_fields(changed),
                            "{changed:02x?}"
                        );
                    }
                }
            }
        }
    }
    let usual = command(SEND, &bodies[0]);
    assert_eq!(base_command(&usual), Some((SEND, &bodies[0][..])));
}

mod sealing {
    use super::*;
    use crate::seal::{seal_frame, Sealed, IV_BYTES, TAG_BYTES};
    use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM};

    fn key() -> LessSafeKey {
        LessSafeKey::new(UnboundKey::new(&AES_256_GCM, &[7; 32]).unwrap())
    }

    fn send_frame(meta: &[u8], payload: &[u8], with_checksum: bool) -> Vec<u8> {
        let mut body = Vec::new();
        field_varint(1, 3, &mut body); // producer_id
        field_varint(2, 9, &mut body); // sequence_id
        frame(&command(SEND, &body), Some((meta, payload, with_checksum)))
    }

    fn sealed(frame: &[u8], keys_field: &[u8], max_total: u32) -> (Option<Sealed>, Vec<u8>) {
        let s = check_frame(frame).expect("a SEND the scanner takes");
        let mut out = b"before".to_vec();
        let done = seal_frame(
            frame,
            &s,
            &key(),
            keys_field,
            &[5; IV_BYTES],
            max_total,
            &mut out,
        );
        (done, out)
    }

    #[test]
    fn a_sealed_send_is_a_valid_frame_whose_payload_decrypts() {
        let mut keys_field = Vec::new();
        field_bytes(13, b"\x0a\x01k\x12\x03abc", &mut keys_field);
        for with_checksum in [true, false] {
            let original = send_frame(&metadata(), b"hello", with_checksum);
            let (done, out) = sealed(&original, &keys_field, u32::MAX);
            assert_eq!(done, Some(Sealed::Done));
            assert_eq!(&out[..6], b"before");
            let frame = &out[6..];
            let s = check_frame(frame).expect("sealed: still valid, checksum made anew");
            assert!(s.checksum >= 0);
            let meta = &frame[s.metadata_offset as usize + 4..s.payload_offset as usize];
            let mut expected = metadata();
            expected.extend_from_slice(&keys_field);
            expected.extend_from_slice(&[0x7a, 12]);
            expected.extend_from_slice(&[5; IV_BYTES]);
            assert_eq!(meta, &expected[..]);
            let ciphertext = &frame[s.payload_offset as usize..];
            assert_eq!(ciphertext.len(), 5 + TAG_BYTES);
            let mut opened = ciphertext.to_vec();
            let nonce = Nonce::assume_unique_for_key([5; IV_BYTES]);
            let plain = key()
                .open_in_place(nonce, Aad::empty(), &mut opened)
                .unwrap();
            assert_eq!(plain, b"hello");
        }
    }

    #[test]
    fn a_send_the_client_encrypted_goes_as_it_is_and_a_too_large_one_is_said() {
        let mut meta = metadata();
        field_bytes(13, b"\x0a\x01k\x12\x03abc", &mut meta);
        let original = send_frame(&meta, b"ciphertext", true);
        assert_eq!(
            sealed(&original, b"", u32::MAX),
            (Some(Sealed::AsIs), b"before".to_vec())
        );
        let plain = send_frame(&metadata(), b"x", true);
        let total = be32(&plain[..4]);
        let (done, out) = sealed(&plain, b"", total + 2 + 12 + 15);
        assert_eq!((done, out), (Some(Sealed::TooLarge), b"before".to_vec()));
        assert_eq!(
            sealed(&plain, b"", total + 2 + 12 + 16).0,
            Some(Sealed::Done)
        );
    }
}

/// A SEND of producer 3, sequence 9, with a 1 KiB payload and its CRC32-C:
/// what the timings below time.
fn send_1k() -> Vec<u8> {
    let mut body = Vec::new();
    field_varint(1, 3, &mut body);
    field_varint(2, 9, &mut body);
    frame(
        &command(SEND, &body),
        Some((&metadata(), &[7u8; 1024], true)),
    )
}

/// Not a test: `cargo test --release -- --ignored --nocapture seal_timing`
/// prints what sealing a 1 KiB SEND costs here, and the AES-GCM part of it.
#[test]
#[ignore]
fn seal_timing() {
    use crate::seal::{seal_frame, IV_BYTES};
    use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM};
    let original = send_1k();
    let s = check_frame(&original).unwrap();
    let cipher = LessSafeKey::new(UnboundKey::new(&AES_256_GCM, &[7; 32]).unwrap());
    let keys = vec![0u8; 270];
    let n = 200_000;
    let mut out = Vec::with_capacity(2048);
    let started = std::time::Instant::now();
    for _ in 0..n {
        out.clear();
        seal_frame(
            &original,
            &s,
            &cipher,
            &keys,
            &[5; IV_BYTES],
            u32::MAX,
            &mut out,
        )
        .unwrap();
    }
    let whole = started.elapsed().as_secs_f64() / n as f64 * 1e9;
    let mut buf = vec![0u8; 1024];
    let started = std::time::Instant::now();
    for _ in 0..n {
        let nonce = Nonce::assume_unique_for_key([5; 12]);
        let _ = cipher.seal_in_place_separate_tag(nonce, Aad::empty(), &mut buf);
    }
    let aes = started.elapsed().as_secs_f64() / n as f64 * 1e9;
    println!("seal_frame 1 KiB: {whole:.0} ns, of which AES-256-GCM about {aes:.0} ns");
}

/// Not a test: `cargo test --release -- --ignored --nocapture record_timing`
/// prints what laying out a 1 KiB SEND's record costs here, by policy.
#[test]
#[ignore]
fn record_timing() {
    use crate::record::{frame_record, Payloads};
    let original = send_1k();
    let s = check_frame(&original).unwrap();
    let prefix = [0x87u8; 40];
    let n = 200_000;
    for payloads in [Payloads::Full, Payloads::Hash, Payloads::Size] {
        let started = std::time::Instant::now();
        let mut kept = 0;
        for _ in 0..n {
            kept += frame_record(&prefix, &original, s.payload_offset, payloads).len();
        }
        let each = started.elapsed().as_secs_f64() / n as f64 * 1e9;
        println!("{payloads:?}: {each:.0} ns a record ({} bytes)", kept / n);
    }
}

#[test]
fn the_checksum_agrees_with_another_crc32c_at_every_length_and_alignment() {
    // crc-fast picks its code by CPU and length (folding, then a tail): the
    // crc32c crate, another implementation, on every length to 4 KiB from
    // 8 alignments, and on frames' usual sizes up to 1 MiB.
    let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
    let data: Vec<u8> = (0..(1 << 20) + 64)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect();
    for length in 0..=4096 {
        for at in 0..8 {
            let part = &data[at..at + length];
            assert_eq!(crc32c(part), crc32c::crc32c(part), "{length} bytes at {at}");
        }
    }
    for length in [5_000, 65_536, 131_071, 1 << 20] {
        assert_eq!(
            crc32c(&data[3..3 + length]),
            crc32c::crc32c(&data[3..3 + length])
        );
    }
    assert_eq!(crc32c(b"123456789"), 0xE306_9283); // the check value
}

/// Not a test: `cargo test --release -- --ignored --nocapture scan_timing`
/// prints what scanning a read costs here per frame: 200 1 KiB SENDs, 200
/// receipts, 200 1 KiB MESSAGEs (reads of about 200 KiB, as at full rate).
#[test]
#[ignore]
fn scan_timing() {
    let mut sends = Vec::new();
    let mut receipts = Vec::new();
    let mut messages = Vec::new();
    for sequence in 0..200u64 {
        let mut body = Vec::new();
        field_varint(1, 3, &mut body);
        field_varint(2, 1000 + sequence, &mut body);
        let payload = vec![sequence as u8; 1024];
        sends.extend(frame(
            &command(SEND, &body),
            Some((&metadata(), &payload, true)),
        ));
        let mut id = Vec::new();
        field_varint(1, 17, &mut id);
        field_varint(2, 5000 + sequence, &mut id);
        let mut body = Vec::new();
        field_varint(1, 3, &mut body);
        field_varint(2, 1000 + sequence, &mut body);
        field_bytes(3, &id, &mut body);
        receipts.extend(frame(&command(SEND_RECEIPT, &body), None));
        let mut body = Vec::new();
        field_varint(1, 4, &mut body);
        field_bytes(2, &id, &mut body);
        messages.extend(frame(
            &command(MESSAGE, &body),
            Some((&metadata(), &payload, true)),
        ));
    }
    let mut found = Vec::new();
    for (name, read) in [
        ("SEND", &sends),
        ("SEND_RECEIPT", &receipts),
        ("MESSAGE", &messages),
    ] {
        let n = 2_000;
        let mut best = f64::INFINITY;
        for _ in 0..5 {
            let started = std::time::Instant::now();
            for _ in 0..n {
                found.clear();
                scan_into(std::hint::black_box(read), 0, u32::MAX, &mut found);
                assert_eq!(found.len(), 200);
                assert!(found.iter().all(|s| s.kind != 0));
            }
            best = best.min(started.elapsed().as_secs_f64() / (n * 200) as f64 * 1e9);
        }
        println!("{name}: {best:.1} ns a frame");
    }
}

#[test]
fn a_chunked_message_counts_once_on_its_last_chunk() {
    // num_chunks_from_msg = 27, chunk_id = 29: chunks 0 and 1 of 3 count no
    // message, the last counts the SEND's num_messages (a MESSAGE's batch).
    let mut body = Vec::new();
    field_varint(1, 3, &mut body);
    field_varint(2, 5, &mut body);
    for (chunk, counted) in [(0u64, 0i64), (1, 0), (2, 1)] {
        let mut meta = metadata();
        field_varint(27, 3, &mut meta);
        field_varint(29, chunk, &mut meta);
        let s = check_frame(&frame(&command(SEND, &body), Some((&meta, b"x", true)))).unwrap();
        assert_eq!((s.kind, s.c), (SEND, counted), "chunk {chunk}");
    }
    let mut meta = metadata();
    field_varint(27, 1, &mut meta); // one chunk: a whole message
    let s = check_frame(&frame(&command(SEND, &body), Some((&meta, b"x", true)))).unwrap();
    assert_eq!(s.c, 1);
}
