//! SENDs in flight and a read's accounting in bulk: what the proxy's relay
//! does for each hot frame of a read the scanner took whole (a SEND goes in
//! flight and its messages and bytes are tallied under its producer's topic,
//! a SEND_RECEIPT ends its SEND and is timed, a MESSAGE is tallied under its
//! consumer's topic), done in one call per read instead of one Python call
//! per frame. `SendTable` in `sluice/protocols/pulsar/correlation.py` is the
//! reference; the two are tested against each other on the same reads.

// aHash: fast, and seeded at random (keys come from clients).
use ahash::AHashMap as HashMap;

/// A SEND waiting for its receipt.
#[derive(Debug)]
pub struct Waiting<T> {
    /// When it was relayed (the proxy's clock, seconds).
    pub started: f64,
    /// Its producer's topic when it was relayed.
    pub topic: T,
    /// SENDs beyond the first with the same producer and sequence id (the
    /// chunks of a chunked message share one; each gets its own receipt).
    pub repeats: u32,
}

/// SENDs in flight by (producer_id, sequence_id).
#[derive(Debug, Default)]
pub struct Table<T> {
    pub waiting: HashMap<(u64, u64), Waiting<T>>,
    /// SENDs relayed and not answered yet, repeats included.
    pub in_flight: u64,
}

impl<T> Table<T> {
    pub fn new() -> Self {
        Table {
            waiting: HashMap::new(),
            in_flight: 0,
        }
    }

    /// A SEND, in flight from `now`.
    pub fn sending(&mut self, producer: u64, sequence: u64, now: f64, topic: impl FnOnce() -> T) {
        self.waiting
            .entry((producer, sequence))
            .and_modify(|w| w.repeats += 1)
            .or_insert_with(|| Waiting {
                started: now,
                topic: topic(),
                repeats: 0,
            });
        self.in_flight += 1;
    }

    /// The SEND a SEND_RECEIPT or SEND_ERROR answers, no longer in flight:
    /// (started, topic); None if it was never seen.
    pub fn sent(
        &mut self,
        producer: u64,
        sequence: u64,
        copy: impl FnOnce(&T) -> T,
    ) -> Option<(f64, T)> {
        let key = (producer, sequence);
        let waiting = self.waiting.get_mut(&key)?;
        self.in_flight -= 1;
        if waiting.repeats > 0 {
            waiting.repeats -= 1;
            return Some((waiting.started, copy(&waiting.topic)));
        }
        let w = self.waiting.remove(&key)?;
        Some((w.started, w.topic))
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
            self.table.waiting.len()
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
            let w = self.table.waiting.get(&(producer_id, sequence_id))?;
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
                .waiting
                .iter()
                .map(|(k, w)| {
                    let topic = w.topic.as_ref().map(|t| t.clone_ref(py));
                    (k.0, k.1, w.started, topic, w.repeats)
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
        assert_eq!(t.waiting.len(), 2);
        assert_eq!(t.sent(1, 7, |t| *t), Some((0.5, "a")));
        assert_eq!(t.sent(1, 7, |t| *t), None);
        assert_eq!(t.sent(3, 7, |t| *t), None);
        assert_eq!(t.in_flight, 1);
        assert_eq!(t.sent(2, 7, |t| *t), Some((1.0, "c")));
        assert_eq!(t.in_flight, 0);
        assert!(t.waiting.is_empty());
    }
}
