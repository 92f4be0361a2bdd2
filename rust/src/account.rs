//! SENDs in flight and a read's accounting in bulk: what the proxy's relay
//! does for each hot frame of a read the scanner took whole (a SEND goes in
//! flight and its messages and bytes are tallied under its producer's topic,
//! a SEND_RECEIPT ends its SEND and is timed, a MESSAGE is tallied under its
//! consumer's topic), done in one call per read instead of one Python call
//! per frame. `SendTable` in `sluice/protocols/pulsar/correlation.py` is the
//! reference; the two are tested against each other on the same reads.

// aHash: fast, and seeded at random (keys come from clients).
use ahash::AHashMap as HashMap;
use std::collections::VecDeque;

/// A SEND waiting for its receipt.
#[derive(Debug)]
pub struct Waiting<T> {
    /// Its sequence id.
    pub sequence: u64,
    /// When it was relayed (the proxy's clock, seconds).
    pub started: f64,
    /// Its producer's topic when it was relayed.
    pub topic: T,
    /// SENDs beyond the first with the same producer and sequence id (the
    /// chunks of a chunked message share one; each gets its own receipt).
    pub repeats: u32,
}

/// One producer's SENDs in flight, in the order they were relayed, one
/// entry per sequence id. Clients number a producer's SENDs upwards and
/// brokers answer them in that order, so a SEND joins the back and its
/// receipt finds it at the front: one contiguous buffer per producer, no
/// hashing per SEND. Out of order (a client that numbers otherwise, a
/// receipt that overtakes) it is still exact, by search.
#[derive(Debug)]
pub struct Producer<T> {
    pub sends: VecDeque<Waiting<T>>,
    /// Whether the sequence ids rise from front to back (then searched by
    /// halves; else one by one).
    rising: bool,
}

impl<T> Producer<T> {
    fn new() -> Self {
        Producer {
            sends: VecDeque::new(),
            rising: true,
        }
    }

    /// Where the SEND with this sequence id is, if in flight.
    fn find(&self, sequence: u64) -> Option<usize> {
        let sends = &self.sends;
        if sends.front()?.sequence == sequence {
            return Some(0);
        }
        if sends.back()?.sequence == sequence {
            return Some(sends.len() - 1);
        }
        if self.rising {
            return sends.binary_search_by_key(&sequence, |w| w.sequence).ok();
        }
        sends.iter().position(|w| w.sequence == sequence)
    }
}

/// SENDs in flight by producer, then sequence id.
#[derive(Debug, Default)]
pub struct Table<T> {
    pub producers: HashMap<u64, Producer<T>>,
    /// SENDs relayed and not answered yet, repeats included.
    pub in_flight: u64,
    /// Distinct (producer, sequence) in flight.
    pub len: usize,
}

impl<T> Table<T> {
    pub fn new() -> Self {
        Table {
            producers: HashMap::new(),
            in_flight: 0,
            len: 0,
        }
    }

    /// A SEND, in flight from `now`.
    pub fn sending(&mut self, producer: u64, sequence: u64, now: f64, topic: impl FnOnce() -> T) {
        self.in_flight += 1;
        let p = self.producers.entry(producer).or_insert_with(Producer::new);
        let above = match p.sends.back() {
            Some(last) if last.sequence == sequence => {
                if let Some(last) = p.sends.back_mut() {
                    last.repeats += 1;
                }
                return;
            }
            Some(last) => p.rising && sequence > last.sequence,
            None => true,
        };
        if !above {
            if let Some(at) = p.find(sequence) {
                p.sends[at].repeats += 1;
                return;
            }
            p.rising = false;
        }
        p.sends.push_back(Waiting {
            sequence,
            started: now,
            topic: topic(),
            repeats: 0,
        });
        self.len += 1;
    }

    /// The SEND a SEND_RECEIPT or SEND_ERROR answers, no longer in flight:
    /// (started, topic); None if it was never seen.
    pub fn sent(
        &mut self,
        producer: u64,
        sequence: u64,
        copy: impl FnOnce(&T) -> T,
    ) -> Option<(f64, T)> {
        let p = self.producers.get_mut(&producer)?;
        let at = p.find(sequence)?;
        self.in_flight -= 1;
        let waiting = &mut p.sends[at];
        if waiting.repeats > 0 {
            waiting.repeats -= 1;
            return Some((waiting.started, copy(&waiting.topic)));
        }
        let w = p.sends.remove(at)?;
        self.len -= 1;
        if p.sends.is_empty() {
            // Nothing kept for a producer with nothing in flight (ids of
            // closed producers are not reused, and they may be many).
            self.producers.remove(&producer);
        }
        Some((w.started, w.topic))
    }

    /// The SEND in flight with these ids, left in flight.
    pub fn peek(&self, producer: u64, sequence: u64) -> Option<&Waiting<T>> {
        let p = self.producers.get(&producer)?;
        p.find(sequence).map(|at| &p.sends[at])
    }

    /// Every SEND in flight: (producer, its entry).
    pub fn iter(&self) -> impl Iterator<Item = (u64, &Waiting<T>)> {
        self.producers
            .iter()
            .flat_map(|(id, p)| p.sends.iter().map(move |w| (*id, w)))
    }
}

#[cfg(feature = "python")]
pub mod python {
    use pyo3::exceptions::PyValueError;
    use pyo3::prelude::*;
    use pyo3::types::{PyDict, PyTuple};

    use super::Table;
    use crate::python::Batch;
    use crate::{ACK, MESSAGE, SEND, SEND_RECEIPT};

    type Topic = Option<Py<PyAny>>;
    /// A tally as a dict, or None when nothing was tallied.
    type Dict<'py> = Option<Bound<'py, PyDict>>;
    /// (producer_id, sequence_id, started, topic, repeats)
    type InFlight = (u64, u64, f64, Topic, u32);

    /// SendTable(): SENDs in flight by (producer_id, sequence_id), and the
    /// accounting of a scanned read in one call (``account_client``,
    /// ``account_broker``).
    #[pyclass(module = "sluice._frames")]
    pub struct SendTable {
        pub(crate) table: Table<Topic>,
    }

    /// One read's tallies by topic, in the order topics first came.
    type Tally<'py, V> = Vec<(Option<Bound<'py, PyAny>>, V)>;

    /// The entry for `topic` in `seen` (the same object nearly every time,
    /// else an equal one), added with `new()` when there is none.
    fn slot<'a, 'py, V>(
        seen: &'a mut Tally<'py, V>,
        topic: Option<Bound<'py, PyAny>>,
        new: impl FnOnce() -> V,
    ) -> PyResult<&'a mut V> {
        let mut found = seen.iter().position(|(t, _)| match (t, &topic) {
            (None, None) => true,
            (Some(t), Some(topic)) => t.is(topic),
            _ => false,
        });
        if found.is_none() {
            if let Some(topic) = &topic {
                for (i, (t, _)) in seen.iter().enumerate() {
                    if let Some(t) = t {
                        if t.eq(topic)? {
                            found = Some(i);
                            break;
                        }
                    }
                }
            }
        }
        let i = match found {
            Some(i) => i,
            None => {
                seen.push((topic, new()));
                seen.len() - 1
            }
        };
        Ok(&mut seen[i].1)
    }

    /// A tally as the dict the relay reports from, or None when empty.
    fn as_dict<'py, V, L>(
        py: Python<'py>,
        seen: &Tally<'py, V>,
        value: impl Fn(&V) -> L,
    ) -> PyResult<Dict<'py>>
    where
        L: IntoPyObject<'py>,
    {
        if seen.is_empty() {
            return Ok(None);
        }
        let out = PyDict::new(py);
        for (topic, v) in seen {
            out.set_item(topic, value(v))?;
        }
        Ok(Some(out))
    }

    /// (stop, kind, a, b, c) of a scanned frame.
    type Fields = (usize, u32, u64, u64, i64);

    /// The fields accounting reads of each frame: from a ``Batch`` as it
    /// is, or from a sequence of ``scan`` tuples.
    fn fields(found: &Bound<'_, PyAny>) -> PyResult<Vec<Fields>> {
        if let Ok(batch) = found.cast::<Batch>() {
            let batch = batch.get();
            return Ok(batch
                .found
                .iter()
                .map(|s| (s.stop, s.kind, s.a, s.b, s.c))
                .collect());
        }
        let mut out = Vec::new();
        for item in found.try_iter()? {
            let item = item?;
            let item = item.cast::<PyTuple>()?;
            if item.len() != 9 {
                return Err(PyValueError::new_err("not a scan result"));
            }
            out.push((
                item.get_item(0)?.extract()?,
                item.get_item(1)?.extract()?,
                item.get_item(5)?.extract()?,
                item.get_item(6)?.extract()?,
                item.get_item(7)?.extract()?,
            ));
        }
        Ok(out)
    }

    #[pymethods]
    impl SendTable {
        #[new]
        fn new() -> Self {
            SendTable {
                table: Table::new(),
            }
        }

        /// SENDs relayed and not answered yet.
        #[getter]
        fn in_flight(&self) -> u64 {
            self.table.in_flight
        }

        fn __len__(&self) -> usize {
            self.table.len
        }

        /// sending(producer_id, sequence_id, now, topic): a SEND in flight.
        fn sending(&mut self, producer_id: u64, sequence_id: u64, now: f64, topic: Topic) {
            self.table.sending(producer_id, sequence_id, now, || topic);
        }

        /// sent(producer_id, sequence_id) -> (started, topic) of the SEND an
        /// answer ends, or None.
        fn sent(
            &mut self,
            py: Python<'_>,
            producer_id: u64,
            sequence_id: u64,
        ) -> Option<(f64, Option<Py<PyAny>>)> {
            self.table.sent(producer_id, sequence_id, |topic| {
                topic.as_ref().map(|t| t.clone_ref(py))
            })
        }

        /// peek(producer_id, sequence_id) -> (started, topic, repeats), or
        /// None: a SEND in flight, left in flight.
        fn peek(
            &self,
            py: Python<'_>,
            producer_id: u64,
            sequence_id: u64,
        ) -> Option<(f64, Option<Py<PyAny>>, u32)> {
            let w = self.table.peek(producer_id, sequence_id)?;
            Some((
                w.started,
                w.topic.as_ref().map(|t| t.clone_ref(py)),
                w.repeats,
            ))
        }

        /// waiting() -> sorted [(producer_id, sequence_id, started, topic,
        /// repeats), ...]: what is in flight, for comparing tables.
        fn waiting(&self, py: Python<'_>) -> Vec<InFlight> {
            let mut out: Vec<_> = self
                .table
                .iter()
                .map(|(producer, w)| {
                    let topic = w.topic.as_ref().map(|t| t.clone_ref(py));
                    (producer, w.sequence, w.started, topic, w.repeats)
                })
                .collect();
            out.sort_by_key(|a| (a.0, a.1));
            out
        }

        /// account_client(found, start, now, producers) -> (traffic, acks):
        /// a client's scanned read. Each SEND goes in flight under its
        /// producer's topic and is tallied there ({topic: [messages,
        /// bytes]}, None if nothing was); the indices of ACKs come back for
        /// the correlator to look at (one asking for a receipt is a request).
        fn account_client<'py>(
            &mut self,
            py: Python<'py>,
            found: &Bound<'py, PyAny>,
            start: usize,
            now: f64,
            producers: &Bound<'py, PyDict>,
        ) -> PyResult<(Dict<'py>, Vec<usize>)> {
            let mut traffic: Tally<'py, [i64; 2]> = Vec::new();
            let mut acks = Vec::new();
            let mut before = start;
            for (i, (stop, kind, a, b, c)) in fields(found)?.into_iter().enumerate() {
                let size = stop.saturating_sub(before) as i64;
                before = stop;
                if kind == SEND {
                    let topic = producers.get_item(a)?;
                    self.table
                        .sending(a, b, now, || topic.as_ref().map(|t| t.clone().unbind()));
                    if topic.is_some() {
                        let tally = slot(&mut traffic, topic, || [0, 0])?;
                        tally[0] += c;
                        tally[1] += size;
                    }
                } else if kind == ACK {
                    acks.push(i);
                }
            }
            Ok((as_dict(py, &traffic, |t| t.to_vec())?, acks))
        }

        /// account_broker(found, start, now, consumers) -> (times, traffic):
        /// a broker's scanned read. Each SEND_RECEIPT ends its SEND and is
        /// timed under the SEND's topic ({topic: [seconds, ...]}); each
        /// MESSAGE is tallied under its consumer's topic.
        fn account_broker<'py>(
            &mut self,
            py: Python<'py>,
            found: &Bound<'py, PyAny>,
            start: usize,
            now: f64,
            consumers: &Bound<'py, PyDict>,
        ) -> PyResult<(Dict<'py>, Dict<'py>)> {
            let mut traffic: Tally<'py, [i64; 2]> = Vec::new();
            let mut times: Tally<'py, Vec<f64>> = Vec::new();
            let mut before = start;
            for (stop, kind, a, b, c) in fields(found)? {
                let size = stop.saturating_sub(before) as i64;
                before = stop;
                if kind == MESSAGE {
                    let topic = consumers.get_item(a)?;
                    if topic.is_some() {
                        let tally = slot(&mut traffic, topic, || [0, 0])?;
                        tally[0] += c;
                        tally[1] += size;
                    }
                } else if kind == SEND_RECEIPT {
                    if let Some((started, topic)) = self.sent(py, a, b) {
                        let topic = topic.map(|t| t.into_bound(py));
                        slot(&mut times, topic, Vec::new)?.push(now - started);
                    }
                }
            }
            let times = as_dict(py, &times, |t| t.clone())?;
            Ok((times, as_dict(py, &traffic, |t| t.to_vec())?))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Table;

    #[test]
    fn a_receipt_ends_its_send_and_repeats_need_one_each() {
        let mut t: Table<&str> = Table::new();
        t.sending(1, 7, 0.5, || "a");
        t.sending(1, 7, 0.9, || "b"); // a chunk: same ids, the first's time and topic
        t.sending(2, 7, 1.0, || "c");
        assert_eq!(t.in_flight, 3);
        assert_eq!(t.sent(1, 7, |t| *t), Some((0.5, "a")));
        assert_eq!(t.len, 2);
        assert_eq!(t.sent(1, 7, |t| *t), Some((0.5, "a")));
        assert_eq!(t.sent(1, 7, |t| *t), None);
        assert_eq!(t.sent(3, 7, |t| *t), None);
        assert_eq!(t.in_flight, 1);
        assert_eq!(t.sent(2, 7, |t| *t), Some((1.0, "c")));
        assert_eq!(t.in_flight, 0);
        assert_eq!(t.len, 0);
    }

    #[test]
    fn receipts_out_of_order_and_sequences_out_of_order_are_exact() {
        let mut t: Table<u64> = Table::new();
        for s in [1, 2, 3, 4, 5] {
            t.sending(9, s, s as f64, || s * 10);
        }
        assert_eq!(t.sent(9, 3, |t| *t), Some((3.0, 30))); // from the middle
        assert_eq!(t.sent(9, 5, |t| *t), Some((5.0, 50))); // from the back
        assert_eq!(t.sent(9, 3, |t| *t), None);
        // Numbered downwards, and again a repeat of one in the middle.
        t.sending(9, 0, 6.0, || 0);
        t.sending(9, 2, 7.0, || 99);
        assert_eq!(t.peek(9, 2).map(|w| (w.started, w.repeats)), Some((2.0, 1)));
        assert_eq!(t.len, 4);
        assert_eq!(t.in_flight, 5);
        for (s, started) in [(0, 6.0), (2, 2.0), (2, 2.0), (1, 1.0), (4, 4.0)] {
            assert_eq!(t.sent(9, s, |t| *t).map(|w| w.0), Some(started), "{s}");
        }
        assert_eq!((t.len, t.in_flight), (0, 0));
        assert_eq!(t.sent(8, 1, |t| *t), None); // a producer never seen
    }
}
