//! One read of a relayed direction, from the socket to the other socket, in
//! one call: the proxy's relay thread reads, checks every frame (the
//! scanner), accounts them (the send table, frame and topic tallies, the
//! receipt and relay-delay histograms) and writes the read on, all without
//! a Python object per read. This is what `PulsarConnection._relay` does
//! for a read the scanner takes whole, with the metrics tap alone watching;
//! `Step.carry` does it only for such reads and gives every other read back
//! to Python as the bytes it read, untouched, for the usual path (the
//! reference: tests/test_quick_step.py compares the two on the same reads).
//! A read that ends in the start of a frame is such a read too: the step
//! holds that start and reads on from it next time, as the decoder would
//! (at full rate nearly every 256 KiB read ends mid-frame); a read it gives
//! back finds it in the core's decoder first (`take_held`).
//!
//! The tallies live here (`Figures`) and are folded into the proxy's
//! metrics when Prometheus scrapes.

use crate::{be32, scan_into, Scanned, MESSAGE, SEND, SEND_RECEIPT};

/// How much one read asks the socket for (relay.py's READ_SIZE).
pub const READ_SIZE: usize = 256 * 1024;

/// Counts per bucket (not cumulative) and the sum, as `Timer` in
/// sluice/proxy/metrics.py: a value goes in the first bucket whose upper
/// bound is at least the value (the bounds end with +inf).
#[derive(Debug, Clone)]
pub struct Timer {
    pub bounds: Vec<f64>,
    pub counts: Vec<u64>,
    pub total: f64,
}

impl Timer {
    pub fn new(bounds: Vec<f64>) -> Timer {
        let counts = vec![0; bounds.len()];
        Timer {
            bounds,
            counts,
            total: 0.0,
        }
    }

    pub fn observe(&mut self, value: f64) {
        let bucket = self.bounds.partition_point(|bound| *bound < value);
        if let Some(count) = self.counts.get_mut(bucket) {
            *count += 1;
        }
        self.total += value;
    }

    /// What was counted since the last take, and zero from now on.
    pub fn take(&mut self) -> (Vec<u64>, f64) {
        let counts = std::mem::replace(&mut self.counts, vec![0; self.bounds.len()]);
        (counts, std::mem::take(&mut self.total))
    }
}

/// The most of an incomplete frame a step keeps from one read to the
/// next (its first bytes, up to the end of the read); a longer one goes
/// to the Python decoder, which waits for the rest.
pub const HOLD_MAX: usize = READ_SIZE;

/// The frames of `data` when one call may carry the read, and where they
/// end: every complete frame valid and of a hot type (the scanner's
/// checks), no ACK among them asking for a receipt (an ACK with a
/// request_id is a request the correlator keeps, in Python), and what
/// follows them the start of a frame that is only incomplete (not over
/// `max_total`, not longer than `HOLD_MAX`): it waits for the next read.
/// None: the read goes the usual way. The frames are put in `found`
/// (emptied first).
pub fn carriable(data: &[u8], max_total: u32, found: &mut Vec<Scanned>) -> Option<usize> {
    found.clear();
    scan_into(data, 0, max_total, found);
    let end = found.last().map_or(0, |s| s.stop);
    let tail = &data[end..];
    if tail.len() > HOLD_MAX || (tail.len() >= 4 && be32(tail) > max_total) {
        return None;
    }
    if found.iter().any(|s| s.kind == 0 || s.asks) {
        return None;
    }
    Some(end)
}

/// The frame kinds the accounting below looks at.
pub fn accounted(kind: u32, from_client: bool) -> bool {
    if from_client {
        kind == SEND
    } else {
        kind == MESSAGE || kind == SEND_RECEIPT
    }
}

#[cfg(feature = "python")]
pub mod python {
    use ahash::AHashMap as HashMap;
    use std::cell::RefCell;
    use std::fs::File;
    use std::io::{ErrorKind, Read, Write};
    use std::mem::ManuallyDrop;
    use std::os::fd::FromRawFd;
    use std::sync::Mutex;
    use std::time::{Instant, SystemTime, UNIX_EPOCH};

    use pyo3::exceptions::PyValueError;
    use pyo3::prelude::*;
    use pyo3::types::{PyBytes, PyDict, PyList, PyString};

    use crate::record::frame_record;
    use crate::record::python::RecordSink;

    use super::{accounted, carriable, Timer, HOLD_MAX, READ_SIZE};
    use crate::account::python::SendTable;
    use crate::seal::python::Sealing;
    use crate::seal::Sealed;
    use crate::sockets::python::os_error;
    use crate::{MESSAGE, SEND, SEND_RECEIPT};

    /// Command types are small numbers (metrics.py's TYPE_SLOTS).
    const SLOTS: usize = 256;

    thread_local! {
        // One read buffer per thread (the relay thread), not per connection:
        // what a step held of the last read, then the read.
        static BUFFER: RefCell<Vec<u8>> = RefCell::new(vec![0; HOLD_MAX + READ_SIZE]);
        // The Vec a read's frames are scanned into, kept between reads.
        static SPARE: RefCell<Vec<crate::Scanned>> = const { RefCell::new(Vec::new()) };
    }

    /// This thread's spare Vec of scanned frames, lent to one read and
    /// given back when dropped: no allocation per read.
    struct Spare(Vec<crate::Scanned>);

    /// A spare grown past this many frames is let go rather than kept.
    const SPARE_KEPT: usize = 1024;

    impl Spare {
        fn lend() -> Spare {
            Spare(SPARE.with(|spare| std::mem::take(&mut *spare.borrow_mut())))
        }
    }

    impl Drop for Spare {
        fn drop(&mut self) {
            if self.0.capacity() <= SPARE_KEPT {
                let found = std::mem::take(&mut self.0);
                SPARE.with(|spare| *spare.borrow_mut() = found);
            }
        }
    }

    /// What relayed reads added to the proxy's metrics since the last
    /// ``take()``: frames and bytes by direction and command type, messages
    /// and bytes by topic and direction, answer times by request, relay
    /// delay by direction. Indexed by "from the client" (0: from brokers).
    #[pyclass(module = "sluice._frames")]
    pub struct Figures {
        frames: Vec<[u64; 2]>,
        /// Messages and bytes by topic and direction, in the order first
        /// counted (the metrics give the first topics their own labels),
        /// and where each is in that list.
        topics: Vec<Traffic>,
        topic_index: [HashMap<String, usize>; 2],
        answered: HashMap<String, Timer>,
        latency: Vec<f64>,
        relay: [Timer; 2],
        /// Messages the compiled path encrypted, by filter.
        sealed: HashMap<String, u64>,
        /// Frames and bytes by direction and name, for protocols whose
        /// commands are names (Cursus): (from_client, name) -> [frames, bytes].
        named: HashMap<(bool, &'static str), [u64; 2]>,
    }

    /// (from_client, type, frames, bytes)
    type Counted = (bool, u32, u64, u64);
    /// (topic, from_client, messages, bytes)
    type Traffic = (String, bool, i64, i64);
    /// (name, counts per bucket, sum)
    type Histogram<N> = (N, Vec<u64>, f64);

    impl Figures {
        fn count(&mut self, from_client: bool, kind: u32, size: u64) {
            let slot = kind as usize + usize::from(from_client) * SLOTS;
            if let Some(tally) = self.frames.get_mut(slot) {
                tally[0] += 1;
                tally[1] += size;
            }
        }

        fn count_named(&mut self, from_client: bool, name: &'static str, size: u64) {
            let tally = self.named.entry((from_client, name)).or_insert([0, 0]);
            tally[0] += 1;
            tally[1] += size;
        }

        fn traffic(&mut self, from_client: bool, topic: &str, messages: i64, size: u64) {
            let index = &mut self.topic_index[usize::from(from_client)];
            let at = match index.get(topic) {
                Some(at) => *at,
                None => {
                    self.topics.push((topic.to_owned(), from_client, 0, 0));
                    index.insert(topic.to_owned(), self.topics.len() - 1);
                    self.topics.len() - 1
                }
            };
            let tally = &mut self.topics[at];
            // (num_messages is an int32 as sent, added as it is, as in Python.)
            tally.2 += messages;
            tally.3 += size as i64;
        }

        fn answered(&mut self, request: &str, seconds: f64) {
            let timer = match self.answered.get_mut(request) {
                Some(timer) => timer,
                None => {
                    let timer = Timer::new(self.latency.clone());
                    self.answered.entry(request.to_owned()).or_insert(timer)
                }
            };
            timer.observe(seconds);
        }
    }

    #[pymethods]
    impl Figures {
        /// Figures(latency_bounds, relay_bounds): the histograms' upper
        /// bounds, +inf last.
        #[new]
        fn new(latency_bounds: Vec<f64>, relay_bounds: Vec<f64>) -> Self {
            Figures {
                frames: vec![[0, 0]; 2 * SLOTS],
                topics: Vec::new(),
                topic_index: [HashMap::new(), HashMap::new()],
                answered: HashMap::new(),
                latency: latency_bounds,
                relay: [Timer::new(relay_bounds.clone()), Timer::new(relay_bounds)],
                sealed: HashMap::new(),
                named: HashMap::new(),
            }
        }

        /// take_named() -> [(from_client, name, frames, bytes)] counted by
        /// name (protocols whose commands are names) since the last take.
        fn take_named(&mut self) -> Vec<(bool, String, u64, u64)> {
            self.named
                .drain()
                .map(|((from_client, name), [frames, size])| {
                    (from_client, name.to_owned(), frames, size)
                })
                .collect()
        }

        /// take_sealed() -> [(filter, messages)] the compiled path encrypted
        /// since the last take.
        fn take_sealed(&mut self) -> Vec<(String, u64)> {
            self.sealed.drain().filter(|(_, n)| *n != 0).collect()
        }

        /// take() -> (frames, topics, answered, relay), each a list of what
        /// was added since the last take (nothing where nothing was; topics
        /// in the order first counted):
        /// [(from_client, type, frames, bytes)], [(topic, from_client,
        /// messages, bytes)], [(request, counts, sum)], [(from_client,
        /// counts, sum)]. Everything is zero again afterwards.
        #[allow(clippy::type_complexity)]
        fn take(
            &mut self,
        ) -> (
            Vec<Counted>,
            Vec<Traffic>,
            Vec<Histogram<String>>,
            Vec<Histogram<bool>>,
        ) {
            let mut frames = Vec::new();
            for (slot, tally) in self.frames.iter_mut().enumerate() {
                if tally[0] != 0 {
                    frames.push((slot >= SLOTS, (slot % SLOTS) as u32, tally[0], tally[1]));
                    *tally = [0, 0];
                }
            }
            let topics = std::mem::take(&mut self.topics);
            for index in &mut self.topic_index {
                index.clear();
            }
            let mut answered = Vec::new();
            for (request, timer) in self.answered.iter_mut() {
                if timer.counts.iter().any(|c| *c != 0) {
                    let (counts, total) = timer.take();
                    answered.push((request.clone(), counts, total));
                }
            }
            let mut relay = Vec::new();
            for (index, timer) in self.relay.iter_mut().enumerate() {
                if timer.counts.iter().any(|c| *c != 0) {
                    let (counts, total) = timer.take();
                    relay.push((index == 1, counts, total));
                }
            }
            (frames, topics, answered, relay)
        }
    }

    /// Step(sends, producers, consumers, figures, max_total, request): one
    /// proxied Pulsar connection's way to carry a read in one call
    /// (``carry``). ``sends`` is its send table, ``producers`` and
    /// ``consumers`` its correlator's {id: topic} (read as they are at each
    /// read), ``request`` the name receipts are timed under.
    /// ``Step.cursus(figures, max_body)``: a Cursus connection's, for what
    /// its broker streams.
    #[pyclass(module = "sluice._frames", frozen)]
    pub struct Step {
        figures: Py<Figures>,
        /// The longest frame (Pulsar: its total size; Cursus: its body).
        max_total: u32,
        /// By direction (from the client?): the start of a frame the last
        /// read ended in, carried with the next read. The core takes it
        /// (``take_held``) when a read goes its usual way.
        held: Mutex<[Vec<u8>; 2]>,
        kind: Kind,
    }

    /// What a step checks and accounts, by protocol.
    enum Kind {
        Pulsar(Pulsar),
        Cursus(Cursus),
    }

    struct Pulsar {
        sends: Py<SendTable>,
        producers: Py<PyDict>,
        consumers: Py<PyDict>,
        request: String,
        record: Option<Recording>,
        /// The producers whose SENDs it encrypts (the `encrypt` filter), if any.
        sealing: Option<Py<Sealing>>,
    }

    /// A Cursus connection whose broker streams (STREAM answered): its
    /// deliveries, batches and keepalives, carried and tallied by topic.
    /// Or one that waits for the OK of its one request (a commit): that
    /// reply alone, timed as the core times an answer.
    struct Cursus {
        /// Where the stream goes on from (the last delivered offset + 1),
        /// as carried reads moved it since the core last took it.
        offset: Mutex<Option<u64>>,
        /// Whether the core waits for a reply (``expect_ok``), and whether
        /// the step carried it.
        reply: Mutex<Reply>,
    }

    /// What a Cursus step may carry of the broker's reads.
    enum Reply {
        /// A stream's deliveries (what the core offers the step for once a
        /// STREAM is answered; and nothing is expected).
        Stream,
        /// The OK answering this commit (its command, when it was sent by
        /// the core's clock, and whether it commits several partitions:
        /// `crate::cursus::commit_ok`), and nothing else.
        Expect(String, f64, bool),
        /// That OK, carried: nothing more until the core takes it back.
        Answered,
    }

    /// What a read the step carries holds, as its protocol checked it.
    enum Found {
        /// The frames, and the read with SENDs sealed (if any were).
        Pulsar(Spare, Option<(Vec<u8>, String, u64)>),
        Cursus(Vec<crate::cursus::Delivery>),
        /// The OK a Cursus commit waited for.
        CursusOk,
    }

    /// Where a carried read's frame records go, when the proxy records.
    struct Recording {
        queue: Target,
        payloads: crate::record::Payloads,
        conn: u32,
        /// The monotonic clock (ns, as time.monotonic_ns() reads it) at
        /// `since`: Instant is the same clock, read without Python.
        clock: (Instant, u64),
    }

    /// Where records go: laid out into the recorder's buffer, or given to
    /// a callable once per read as (records, their bytes) (the live view).
    enum Target {
        Sink(Py<RecordSink>),
        Call(Py<PyAny>),
    }

    impl Recording {
        /// The part of each record that is the same for a whole read: the
        /// map's first byte up to "w"'s value (FrameRecorder.packed's prefix).
        fn prefix(&self, from_client: bool) -> Vec<u8> {
            let (since, at) = self.clock;
            let mono = at.saturating_add(since.elapsed().as_nanos() as u64);
            let wall = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64);
            let mut out = Vec::with_capacity(44);
            out.push(crate::record::MAP_7);
            out.extend_from_slice(b"\xa1k\xa5frame\xa1c\xce");
            out.extend_from_slice(&self.conn.to_be_bytes());
            out.extend_from_slice(b"\xa1d");
            // The recorded direction: 0 client to broker, 1 broker to client.
            out.push(u8::from(!from_client));
            out.extend_from_slice(b"\xa1t\xcf");
            out.extend_from_slice(&mono.to_be_bytes());
            out.extend_from_slice(b"\xa1w\xcf");
            out.extend_from_slice(&wall.to_be_bytes());
            out
        }
    }

    /// `f` with the descriptor as a file, which it does not close.
    fn with_fd<T>(fd: i32, f: impl FnOnce(&mut File) -> T) -> T {
        // SAFETY: the caller's descriptor stays open for the call (checked
        // to be one: not negative); ManuallyDrop keeps it from being closed.
        let mut file = ManuallyDrop::new(unsafe { File::from_raw_fd(fd) });
        f(&mut file)
    }

    fn read(fd: i32, buf: &mut [u8]) -> std::io::Result<usize> {
        with_fd(fd, |file| loop {
            match file.read(buf) {
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                other => return other,
            }
        })
    }

    /// Write as much of `data` as the socket takes now: how much, and the
    /// error that stopped it (none when it would block).
    fn write(fd: i32, data: &[u8]) -> (usize, Option<std::io::Error>) {
        with_fd(fd, |file| {
            let mut written = 0;
            while written < data.len() {
                match file.write(&data[written..]) {
                    Ok(0) => break,
                    Ok(n) => written += n,
                    Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                    Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                    Err(e) => return (written, Some(e)),
                }
            }
            (written, None)
        })
    }

    #[pymethods]
    impl Step {
        /// With ``record``, each carried read's frame records, laid out as
        /// the recorder lays them out for connection ``conn`` (``payloads``:
        /// 0 full, 1 hash, 2 size), go to it: a RecordSink (the recorder's
        /// buffer), or a callable given ``(records, size)`` once per read;
        /// ``monotonic_ns`` is time.monotonic_ns() now. ``conn`` is any
        /// connection id; one recorded must fit the record's uint32 (a
        /// recorder lays out the records of a wider one in Python).
        #[new]
        #[pyo3(signature = (sends, producers, consumers, figures, max_total, request,
                            record=None, payloads=1, conn=0, monotonic_ns=0, sealing=None))]
        #[allow(clippy::too_many_arguments)]
        fn new(
            py: Python<'_>,
            sends: Py<SendTable>,
            producers: Py<PyDict>,
            consumers: Py<PyDict>,
            figures: Py<Figures>,
            max_total: u32,
            request: String,
            record: Option<Py<PyAny>>,
            payloads: u8,
            conn: u64,
            monotonic_ns: u64,
            sealing: Option<Py<Sealing>>,
        ) -> PyResult<Self> {
            let record = match record {
                Some(queue) => Some(Recording {
                    conn: u32::try_from(conn).map_err(|_| {
                        PyValueError::new_err("a recorded connection id fits in 32 bits")
                    })?,
                    queue: match queue.bind(py).cast::<RecordSink>() {
                        Ok(sink) => Target::Sink(sink.clone().unbind()),
                        Err(_) => Target::Call(queue),
                    },
                    payloads: crate::python::payload_policy(payloads)?,
                    clock: (Instant::now(), monotonic_ns),
                }),
                None => None,
            };
            Ok(Step {
                figures,
                max_total,
                held: Mutex::new([Vec::new(), Vec::new()]),
                kind: Kind::Pulsar(Pulsar {
                    sends,
                    producers,
                    consumers,
                    request,
                    record,
                    sealing,
                }),
            })
        }

        /// Step.cursus(figures, max_body): a Cursus connection's step, for
        /// the reads its broker sends once a STREAM is answered: each a run
        /// of deliveries (batches, keepalives) counted by name and tallied
        /// by topic, as the core does; anything else (a reply, a frame the
        /// reference refuses, a read from the client) is given back.
        /// ``max_body`` is the longest frame body taken.
        #[staticmethod]
        fn cursus(figures: Py<Figures>, max_body: u32) -> Self {
            Step {
                figures,
                max_total: max_body,
                held: Mutex::new([Vec::new(), Vec::new()]),
                kind: Kind::Cursus(Cursus {
                    offset: Mutex::new(None),
                    reply: Mutex::new(Reply::Stream),
                }),
            }
        }

        /// take_offset() -> int | None: where a Cursus stream goes on from
        /// (the last offset carried reads delivered, plus one) if they
        /// delivered any since the last take; None otherwise, and always
        /// for Pulsar.
        fn take_offset(&self) -> Option<u64> {
            match &self.kind {
                Kind::Cursus(c) => c.offset.lock().unwrap_or_else(|e| e.into_inner()).take(),
                Kind::Pulsar(_) => None,
            }
        }

        /// expect_ok(request, sent, batched=False): the next read of a
        /// Cursus broker that is not streaming may be the OK answering the
        /// commit ``request`` (its command, sent at ``sent`` by the core's
        /// clock; ``batched``: one of several partitions, answered
        /// ``OK batched=N``): that read alone, the frame whole and nothing
        /// else, is carried, counted as an OK and timed as that request's
        /// answer; after it, nothing is carried until ``take_answered``.
        /// Any other read is given back, as always. (A Pulsar step: nothing.)
        #[pyo3(signature = (request, sent, batched=false))]
        fn expect_ok(&self, request: String, sent: f64, batched: bool) {
            if let Kind::Cursus(c) = &self.kind {
                *c.reply.lock().unwrap_or_else(|e| e.into_inner()) =
                    Reply::Expect(request, sent, batched);
            }
        }

        /// take_answered() -> int: the requests carried reads answered
        /// since the last take (0 or 1), for the core to pair; the step
        /// goes back to carrying a stream's deliveries only.
        fn take_answered(&self) -> u32 {
            match &self.kind {
                Kind::Cursus(c) => {
                    let mut reply = c.reply.lock().unwrap_or_else(|e| e.into_inner());
                    let answered = u32::from(matches!(*reply, Reply::Answered));
                    *reply = Reply::Stream;
                    answered
                }
                Kind::Pulsar(_) => 0,
            }
        }

        /// carry(source, sink, from_client, now) -> what became of one read
        /// of the non-blocking descriptor ``source``:
        ///
        /// - None: nothing to read now;
        /// - bytes: what was read (b"" at the end), nothing done with it:
        ///   for the usual path;
        /// - an int: that many bytes read, accounted and written to
        ///   ``sink`` whole;
        /// - (read, rest, error, seconds): read and accounted, but ``rest``
        ///   is left to write (the socket took no more), or writing failed
        ///   with ``error`` (rest is then b""); ``seconds`` spent so far.
        ///
        /// Reading fails with the socket's OSError.
        fn carry(
            &self,
            py: Python<'_>,
            source: i32,
            sink: i32,
            from_client: bool,
            now: f64,
        ) -> PyResult<Py<PyAny>> {
            self.carry_fds(py, source, sink, from_client, now)
        }

        /// take_held(from_client) -> bytes: the start of a frame the last
        /// carried read of that direction ended in (b"" if none), no longer
        /// kept here: for the core's decoder, before the bytes read next.
        fn take_held<'py>(&self, py: Python<'py>, from_client: bool) -> Bound<'py, PyBytes> {
            let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
            let slot = &mut held[usize::from(from_client)];
            let out = PyBytes::new(py, slot);
            slot.clear();
            out
        }

        /// give_held(from_client, start) -> bool: hold ``start``, the start
        /// of a frame the core's decoder had buffered, as if this step's last
        /// read of that direction had ended in it: the next carried read
        /// goes on from it. False (nothing taken) when the step holds
        /// something of that direction already, or ``start`` is longer than
        /// a step holds.
        fn give_held(&self, from_client: bool, start: &[u8]) -> bool {
            let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
            let slot = &mut held[usize::from(from_client)];
            if !slot.is_empty() || start.len() > HOLD_MAX {
                return false;
            }
            slot.extend_from_slice(start);
            true
        }
    }

    impl Step {
        /// ``carry``, for the relay thread's compiled loop too.
        pub(crate) fn carry_fds(
            &self,
            py: Python<'_>,
            source: i32,
            sink: i32,
            from_client: bool,
            now: f64,
        ) -> PyResult<Py<PyAny>> {
            if source < 0 || sink < 0 {
                return Err(PyValueError::new_err("not a descriptor"));
            }
            BUFFER.with(|buffer| {
                let mut buffer = buffer.borrow_mut();
                let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
                let slot = &mut held[usize::from(from_client)];
                let h = slot.len();
                buffer[..h].copy_from_slice(slot);
                let n = match read(source, &mut buffer[h..h + READ_SIZE]) {
                    Ok(n) => n,
                    Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(py.None()),
                    // As os.read raises it: its errno and words (the relay logs them).
                    Err(e) => return Err(os_error(e)),
                };
                let data = &buffer[..h + n];
                let started = Instant::now();
                let found = if n == 0 {
                    None // the end: the core closes
                } else {
                    match &self.kind {
                        Kind::Pulsar(p) => self.pulsar_found(py, p, data, from_client, now),
                        Kind::Cursus(_) if from_client => None,
                        Kind::Cursus(c) => match *c.reply.lock().unwrap_or_else(|e| e.into_inner())
                        {
                            Reply::Stream => {
                                crate::cursus::carriable(data, self.max_total, HOLD_MAX)
                                    .map(|(d, end)| (Found::Cursus(d), end))
                            }
                            Reply::Expect(_, _, batched) => crate::cursus::commit_ok(data, batched)
                                .map(|end| (Found::CursusOk, end)),
                            Reply::Answered => None,
                        },
                    }
                };
                let Some((found, end)) = found else {
                    // What was held stays for the core to take first.
                    return Ok(PyBytes::new(py, &data[h..]).into_any().unbind());
                };
                slot.clear();
                slot.extend_from_slice(&data[end..]);
                drop(held);
                if end == 0 {
                    // Only the start of a frame so far: as the decoder, wait.
                    return Ok(n.into_pyobject(py)?.into_any().unbind());
                }
                let frames = &data[..end];
                let mut sealed = None;
                match (&self.kind, found) {
                    (Kind::Pulsar(p), Found::Pulsar(found, seal)) => {
                        self.account(py, p, &found.0, from_client, now)?;
                        if let Some(recording) = &p.record {
                            recording.queue(py, frames, &found.0, from_client);
                        }
                        sealed = seal;
                    }
                    (Kind::Cursus(c), Found::Cursus(found)) => {
                        self.account_cursus(py, c, frames, &found, from_client);
                    }
                    (Kind::Cursus(c), Found::CursusOk) => {
                        self.account_ok(py, c, frames.len(), now);
                    }
                    _ => unreachable!("a step finds what its own protocol finds"),
                }
                let (frames, end) = match &sealed {
                    Some((out, name, messages)) => {
                        let mut figures = self.figures.bind(py).borrow_mut();
                        *figures.sealed.entry(name.clone()).or_insert(0) += *messages;
                        (&out[..], out.len())
                    }
                    None => (frames, end),
                };
                let (written, failed) = write(sink, frames);
                let seconds = started.elapsed().as_secs_f64();
                if written == end {
                    let mut figures = self.figures.bind(py).borrow_mut();
                    figures.relay[usize::from(from_client)].observe(seconds);
                    return Ok(n.into_pyobject(py)?.into_any().unbind());
                }
                let error: Option<PyErr> = failed.map(os_error);
                let rest = if error.is_some() {
                    &[][..]
                } else {
                    &frames[written..]
                };
                let out = (
                    n,
                    PyBytes::new(py, rest),
                    error.map(|e| e.into_value(py)),
                    seconds,
                );
                Ok(out.into_pyobject(py)?.into_any().unbind())
            })
        }
    }

    impl Step {
        /// A Pulsar read's frames when the step may carry it (with the
        /// SENDs of sealed producers encrypted), and where they end.
        fn pulsar_found(
            &self,
            py: Python<'_>,
            p: &Pulsar,
            data: &[u8],
            from_client: bool,
            now: f64,
        ) -> Option<(Found, usize)> {
            let mut found = Spare::lend();
            let end = carriable(data, self.max_total, &mut found.0)?;
            // Metadata properties may hold credentials: the Python
            // recorder redacts them.
            if p.record.is_some() && found.0.iter().any(|s| s.properties != 0) {
                return None;
            }
            // SENDs to encrypt: sealed here, or the read goes the Python way
            // (recording, no key good now, too large).
            let sealed = match (from_client, &p.sealing) {
                (true, Some(sealing)) => self
                    .sealed_read(py, p, sealing, &data[..end], &found.0, now)
                    .ok()?,
                _ => None,
            };
            Some((Found::Pulsar(found, sealed), end))
        }

        /// What ``CursusConnection`` and the metrics tap do for deliveries
        /// on a stream: every frame counted by name, each batch's messages
        /// and bytes tallied under its topic, and the stream's offset moved
        /// past its last message.
        fn account_cursus(
            &self,
            py: Python<'_>,
            c: &Cursus,
            frames: &[u8],
            found: &[crate::cursus::Delivery],
            from_client: bool,
        ) {
            let mut figures = self.figures.bind(py).borrow_mut();
            let mut offset = c.offset.lock().unwrap_or_else(|e| e.into_inner());
            let mut before = 0;
            for d in found {
                let size = (d.stop - before) as u64;
                before = d.stop;
                let Some(head) = &d.head else {
                    figures.count_named(from_client, "KEEPALIVE", size);
                    continue;
                };
                figures.count_named(from_client, "BATCH", size);
                if let Some(last) = head.last_offset {
                    // Checked by `carriable`: UTF-8, and a next offset.
                    let topic = std::str::from_utf8(&frames[head.topic.0..head.topic.1])
                        .unwrap_or_default();
                    figures.traffic(from_client, topic, i64::from(head.count), size);
                    *offset = last.checked_add(1);
                }
            }
        }

        /// What the core and the metrics tap do for the OK a commit
        /// waited for: the frame counted by name, the request's answer
        /// timed, and the request answered (for ``take_answered``).
        fn account_ok(&self, py: Python<'_>, c: &Cursus, size: usize, now: f64) {
            let mut reply = c.reply.lock().unwrap_or_else(|e| e.into_inner());
            let Reply::Expect(request, sent, _) = std::mem::replace(&mut *reply, Reply::Answered)
            else {
                return; // (found only while one is expected: the GIL is held throughout)
            };
            drop(reply);
            let mut figures = self.figures.bind(py).borrow_mut();
            figures.count_named(false, "OK", size as u64);
            figures.answered(&request, now - sent);
        }

        /// The frames of a read with the SENDs of sealed producers encrypted:
        /// Ok(None) when it has none, Ok((bytes, filter, messages sealed)),
        /// or Err when the read must go the Python way (recorded, whose
        /// filter records Python writes; no key good at `now`; a SEND that
        /// sealed would be over the limit, which Python refuses).
        fn sealed_read(
            &self,
            py: Python<'_>,
            p: &Pulsar,
            sealing: &Py<Sealing>,
            frames: &[u8],
            found: &[crate::Scanned],
            now: f64,
        ) -> Result<Option<(Vec<u8>, String, u64)>, ()> {
            let state = sealing
                .get()
                .state
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            let (producers, seal) = (&state.0, &state.1);
            let wanted = |s: &crate::Scanned| s.kind == SEND && producers.contains(&s.a);
            if !found.iter().any(wanted) {
                return Ok(None);
            }
            let Some(seal) = seal else { return Err(()) };
            if p.record.is_some() {
                return Err(());
            }
            let seal = seal.bind(py).get();
            let mut out = Vec::with_capacity(frames.len() + frames.len() / 8);
            let (mut from, mut messages) = (0, 0);
            for s in found {
                let frame = &frames[from..s.stop];
                from = s.stop;
                if !wanted(s) {
                    out.extend_from_slice(frame);
                    continue;
                }
                match seal.seal_into(frame, s, now, self.max_total, &mut out) {
                    // As the Python path counts them (filtering.message_count):
                    // the batch's messages, none for a count below zero.
                    Some(Sealed::Done) => messages += s.in_batch.max(0) as u64,
                    Some(Sealed::AsIs) => out.extend_from_slice(frame),
                    Some(Sealed::TooLarge) | None => return Err(()),
                }
            }
            Ok(Some((out, seal.name.clone(), messages)))
        }
    }

    impl Recording {
        /// The read's frame records to the recorder, as its tap would queue
        /// them. A recorder that fails never stops traffic: its error is
        /// reported as unraisable and the read goes on.
        fn queue(&self, py: Python<'_>, data: &[u8], found: &[crate::Scanned], from_client: bool) {
            let prefix = self.prefix(from_client);
            let call = match &self.queue {
                Target::Sink(sink) => {
                    return sink.get().append(py, &prefix, data, found, self.payloads);
                }
                Target::Call(call) => call.bind(py),
            };
            let mut size = 0;
            let mut records = Vec::with_capacity(found.len());
            let mut from = 0;
            for s in found {
                let frame = &data[from..s.stop];
                from = s.stop;
                let record = frame_record(&prefix, frame, s.payload_offset, self.payloads);
                size += record.len();
                records.push(PyBytes::new(py, &record));
            }
            let done = PyList::new(py, records)
                .and_then(|records| call.call1((records, size)).map(|_| ()));
            if let Err(error) = done {
                error.write_unraisable(py, Some(call));
            }
        }
    }

    impl Step {
        /// What ``PulsarConnection._relay`` and the metrics tap do for a
        /// scanned read: every frame counted; from the client each SEND in
        /// flight under its producer's topic and tallied there; from the
        /// broker each MESSAGE tallied under its consumer's topic and each
        /// SEND_RECEIPT's SEND ended and timed.
        fn account(
            &self,
            py: Python<'_>,
            p: &Pulsar,
            found: &[crate::Scanned],
            from_client: bool,
            now: f64,
        ) -> PyResult<()> {
            let mut figures = self.figures.bind(py).borrow_mut();
            let mut sends = p.sends.bind(py).borrow_mut();
            let ids = if from_client {
                &p.producers
            } else {
                &p.consumers
            };
            let ids = ids.bind(py);
            // The frames of a read mostly share one producer or consumer:
            // its topic is looked up once per run of frames with its id,
            // and the run's messages and bytes tallied under it at once.
            let mut run: Option<(u64, Option<Bound<'_, PyAny>>)> = None;
            let mut tally: (i64, u64) = (0, 0);
            let mut before = 0;
            for s in found {
                let size = (s.stop - before) as u64;
                before = s.stop;
                figures.count(from_client, s.kind, size);
                if !accounted(s.kind, from_client) {
                    continue;
                }
                if s.kind == SEND_RECEIPT {
                    let copy = |t: &Option<Py<PyAny>>| t.as_ref().map(|t| t.clone_ref(py));
                    if let Some((started, _)) = sends.table.sent(s.a, s.b, copy) {
                        // (Timed by request: the metrics keep no topic for it.)
                        figures.answered(&p.request, now - started);
                    }
                    continue;
                }
                let topic = match &run {
                    Some((id, topic)) if *id == s.a => topic,
                    _ => {
                        tallied(&mut figures, from_client, &run, tally)?;
                        tally = (0, 0);
                        &run.insert((s.a, ids.get_item(s.a)?)).1
                    }
                };
                if s.kind == SEND {
                    let kept = topic.as_ref().map(|t| t.clone().unbind());
                    sends.table.sending(s.a, s.b, now, || kept);
                }
                debug_assert!(s.kind == SEND || s.kind == MESSAGE);
                if topic.is_some() {
                    // (num_messages is an int32 as sent, added as it is, as in Python.)
                    tally.0 += s.c;
                    tally.1 += size;
                }
            }
            tallied(&mut figures, from_client, &run, tally)?;
            Ok(())
        }
    }

    /// A run's messages and bytes, under its topic (if its id has one).
    fn tallied(
        figures: &mut Figures,
        from_client: bool,
        run: &Option<(u64, Option<Bound<'_, PyAny>>)>,
        (messages, size): (i64, u64),
    ) -> PyResult<()> {
        if let Some((_, Some(topic))) = run {
            let topic = topic.cast::<PyString>()?;
            figures.traffic(from_client, topic.to_str()?, messages, size);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::{carriable, Timer, HOLD_MAX};

    #[test]
    fn a_value_goes_in_the_first_bucket_at_least_as_large() {
        let mut t = Timer::new(vec![0.001, 0.01, f64::INFINITY]);
        for v in [0.0005, 0.001, 0.002, 5.0] {
            t.observe(v);
        }
        assert_eq!(t.counts, vec![2, 1, 1]);
        let (counts, total) = t.take();
        assert_eq!(counts, vec![2, 1, 1]);
        assert!((total - 5.0035).abs() < 1e-12);
        assert_eq!(t.counts, vec![0, 0, 0]);
    }

    fn carried(data: &[u8], max_total: u32) -> Option<(Vec<crate::Scanned>, usize)> {
        // What was in the Vec before is not kept.
        let mut found = vec![crate::Scanned::left(7); 3];
        carriable(data, max_total, &mut found).map(|end| (found, end))
    }

    #[test]
    fn only_checked_frames_and_the_start_of_one_are_carried() {
        // Nothing yet, or the start of a frame: held for the next read.
        assert_eq!(carried(b"", 1 << 20), Some((vec![], 0)));
        assert_eq!(carried(&[0, 0, 1], 1 << 20), Some((vec![], 0)));
        assert_eq!(carried(&[0, 0, 1, 0, 9], 1 << 20), Some((vec![], 0)));
        // A frame the scanner leaves to Python (an empty command).
        assert!(carried(&[0, 0, 0, 4, 0, 0, 0, 0], 1 << 20).is_none());
        // A length over the limit: the decoder says what is wrong.
        assert!(carried(&[0, 0, 1, 1, 0], 256).is_none());
        // Longer than a step holds.
        let mut long = vec![0u8; HOLD_MAX + 1];
        long[1] = 0x10;
        assert!(carried(&long, 1 << 30).is_none());
    }
}
