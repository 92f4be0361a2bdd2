//! The relay thread's loop (sluice/proxy/relay_thread.py) in compiled code.
//!
//! The Python loop waits on epoll, takes the turn, and calls each readable
//! socket's read step (`Relay._carry`), which asks the core whether the
//! compiled step may carry the read, checks the relay's own state, and
//! calls it: some hundred Python bytecodes around each read, and at low
//! rates (every frame alone) a third of the proxy's CPU. Here the loop
//! calls the compiled step itself for a direction whose `Lane` is armed:
//! the Python read step armed it, having found everything that lets the
//! step run, and nothing that could change that has happened since. What
//! could change it runs as Python code in the trio thread (a fault rule
//! added, a write waiting, a drain, the end), which bumps `Carrier.epoch`
//! before it runs and so disarms every lane; or as a Python read step of
//! the same connection on this thread (a read the step gave back, a
//! hand-back), which disarms that connection's lanes only (`disarm`): a
//! connection's Python read step touches no other connection's state, so
//! one read the Python way (a Cursus connection, a read too large for the
//! step) costs the other connections nothing. A lane's first read after
//! such code ran goes through the Python read step, which looks again and
//! arms it again.

use std::sync::{Condvar, Mutex, MutexGuard};

/// A lock that one thread takes and another may give back: a binary
/// semaphore (std's Mutex is released by the guard of the thread that
/// took it, and the turn is held across calls from Python).
#[derive(Default)]
pub struct Semaphore {
    state: Mutex<Held>,
    freed: Condvar,
}

#[derive(Default)]
struct Held {
    held: bool,
    /// Threads asleep in `acquire`: a release wakes one only if there
    /// is one (std's Condvar makes a futex call for every notify).
    waiting: u32,
}

impl Semaphore {
    fn state(&self) -> MutexGuard<'_, Held> {
        // Nothing panics while holding it; a poisoned one is still right.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn acquire(&self) {
        let mut state = self.state();
        while state.held {
            state.waiting += 1;
            state = self.freed.wait(state).unwrap_or_else(|e| e.into_inner());
            state.waiting -= 1;
        }
        state.held = true;
    }

    pub fn try_acquire(&self) -> bool {
        let mut state = self.state();
        if state.held {
            return false;
        }
        state.held = true;
        true
    }

    pub fn release(&self) {
        let mut state = self.state();
        state.held = false;
        let wake = state.waiting > 0;
        drop(state);
        if wake {
            self.freed.notify_one();
        }
    }
}

/// `steps()` run with `turn` held (the caller took it), and the turn given
/// back after, however they end: a panic unwinding through them included.
/// Given back only after them, a panic left it held, and trio's thread,
/// waiting for it without the GIL, hung the whole proxy.
pub fn holding<T>(turn: &Semaphore, steps: impl FnOnce() -> T) -> T {
    struct Given<'a>(&'a Semaphore);
    impl Drop for Given<'_> {
        fn drop(&mut self) {
            self.0.release();
        }
    }
    let _given = Given(turn);
    steps()
}

#[cfg(feature = "python")]
pub mod python {
    use std::io;
    use std::sync::atomic::{AtomicU64, Ordering};

    use pyo3::prelude::*;
    use pyo3::types::PyDict;

    use super::{holding, Semaphore};
    use crate::step::python::Step;

    /// How many events one wait takes at most.
    const EVENTS: usize = 64;

    /// Lane(step, source, sink, from_client, slow, after): one carried
    /// direction. ``slow()`` is its Python read step (also what calling the
    /// lane does); ``after(got)`` is given what the compiled step returned
    /// when it did not carry a read whole (bytes, a tuple, None, or the
    /// exception it raised).
    #[pyclass(module = "sluice._frames", frozen)]
    pub struct Lane {
        step: Py<Step>,
        source: i32,
        sink: i32,
        from_client: bool,
        slow: Py<PyAny>,
        after: Py<PyAny>,
        /// The carrier's epoch when the Python read step last armed it
        /// (0: disarmed; epochs start at 1).
        armed: AtomicU64,
        /// Reads the compiled loop carried for it by the compiled step alone.
        runs: AtomicU64,
    }

    #[pymethods]
    impl Lane {
        #[new]
        fn new(
            step: Py<Step>,
            source: i32,
            sink: i32,
            from_client: bool,
            slow: Py<PyAny>,
            after: Py<PyAny>,
        ) -> Self {
            Lane {
                step,
                source,
                sink,
                from_client,
                slow,
                after,
                armed: AtomicU64::new(0),
                runs: AtomicU64::new(0),
            }
        }

        /// arm(epoch): the compiled loop may carry this direction's reads
        /// itself until the carrier's epoch moves on.
        fn arm(&self, epoch: u64) {
            self.armed.store(epoch, Ordering::Relaxed);
        }

        /// disarm(): its next read goes through its Python read step, which
        /// looks again (Python code of its connection ran).
        fn disarm(&self) {
            self.armed.store(0, Ordering::Relaxed);
        }

        /// The compiled step it carries reads with (the relay makes a new
        /// lane when the core's step is another: the taps changed).
        #[getter]
        fn step(&self, py: Python<'_>) -> Py<Step> {
            self.step.clone_ref(py)
        }

        /// Reads the compiled loop carried for it without Python.
        #[getter]
        fn runs(&self) -> u64 {
            self.runs.load(Ordering::Relaxed)
        }

        fn __call__(&self, py: Python<'_>) -> PyResult<()> {
            self.slow.bind(py).call0().map(|_| ())
        }
    }

    /// Turn(): which of the relay thread and trio's thread runs the proxy's
    /// Python code (relay_thread.py). ``take()`` waits for it, the GIL let
    /// go meanwhile; ``give()`` lets it go. Whoever waits gets it next: a
    /// taker passes a gate first, held while it waits, so a thread that
    /// gives the turn and at once wants it again queues behind the waiter.
    /// (Before, two ``threading.Lock``s, four Python calls per wake of the
    /// relay thread: argument parsing and all, a sixth of what a message
    /// crossing alone cost.)
    #[pyclass(module = "sluice._frames", frozen)]
    pub struct Turn {
        turn: Semaphore,
        gate: Semaphore,
    }

    impl Turn {
        /// Take the turn without the GIL (the caller has let it go).
        fn take_detached(&self) {
            self.gate.acquire();
            self.turn.acquire();
            self.gate.release();
        }
    }

    #[pymethods]
    impl Turn {
        #[new]
        fn new() -> Self {
            Turn {
                turn: Semaphore::default(),
                gate: Semaphore::default(),
            }
        }

        /// take(): wait for the turn (at once when nobody holds or waits for it).
        fn take(&self, py: Python<'_>) {
            if self.gate.try_acquire() {
                let taken = self.turn.try_acquire();
                self.gate.release();
                if taken {
                    return;
                }
            }
            py.detach(|| self.take_detached());
        }

        /// give(): let the turn go.
        fn give(&self) {
            self.turn.release();
        }
    }

    /// Carrier(): the compiled loop's state: its epoch (bumped whenever
    /// Python code may have changed what lanes depend on; starts at 1, so
    /// that a new lane is not armed) and the read steps it ran.
    #[pyclass(module = "sluice._frames", frozen)]
    pub struct Carrier {
        epoch: AtomicU64,
        steps_run: AtomicU64,
        /// Reads of armed lanes, by the compiled step alone.
        compiled_runs: AtomicU64,
    }

    impl Carrier {
        fn bump_epoch(&self) {
            self.epoch.fetch_add(1, Ordering::Relaxed);
        }
    }

    #[pymethods]
    impl Carrier {
        #[new]
        fn new() -> Self {
            Carrier {
                epoch: AtomicU64::new(1),
                steps_run: AtomicU64::new(0),
                compiled_runs: AtomicU64::new(0),
            }
        }

        #[getter]
        fn epoch(&self) -> u64 {
            self.epoch.load(Ordering::Relaxed)
        }

        #[getter]
        fn steps_run(&self) -> u64 {
            self.steps_run.load(Ordering::Relaxed)
        }

        #[getter]
        fn compiled_runs(&self) -> u64 {
            self.compiled_runs.load(Ordering::Relaxed)
        }

        /// Disarm every lane: Python code is about to run (trio's turn).
        fn bump(&self) {
            self.bump_epoch();
        }

        /// monotonic(offset) -> ``offset`` plus the monotonic clock in
        /// seconds (what time.perf_counter() reads on Linux): trio's own
        /// clock, read as ``run`` reads it when given trio's offset.
        #[staticmethod]
        fn monotonic(offset: f64) -> f64 {
            offset + monotonic_seconds()
        }

        /// run(epoll_fd, stop_fd, steps, turn, now, failed, offset=None):
        /// the relay thread's loop, until ``stop_fd`` is readable. ``steps``
        /// maps each carried descriptor to its read step (a Lane, or any
        /// callable); ``turn`` is the Turn RelayThread describes, taken
        /// here (without the GIL) for each wait's steps; ``now()`` reads
        /// trio's clock, unless ``offset`` says it is the monotonic clock
        /// plus that (trio's SystemClock), read here without a Python call;
        /// ``failed(fd, exc)`` is told of a read step that raised.
        #[allow(clippy::too_many_arguments)]
        #[pyo3(signature = (epoll_fd, stop_fd, steps, turn, now, failed, offset=None))]
        fn run(
            &self,
            py: Python<'_>,
            epoll_fd: i32,
            stop_fd: i32,
            steps: &Bound<'_, PyDict>,
            turn: &Bound<'_, Turn>,
            now: &Bound<'_, PyAny>,
            failed: &Bound<'_, PyAny>,
            offset: Option<f64>,
        ) -> PyResult<()> {
            let clock = Clock { now, offset };
            let turn = turn.get();
            let mut events = vec![libc::epoll_event { events: 0, u64: 0 }; EVENTS];
            loop {
                let waited = py.detach(|| {
                    // SAFETY: the buffer holds EVENTS events and outlives the call.
                    let n = unsafe {
                        libc::epoll_wait(epoll_fd, events.as_mut_ptr(), EVENTS as i32, -1)
                    };
                    if n < 0 {
                        return Err(io::Error::last_os_error());
                    }
                    // The turn is waited for before the GIL is taken back:
                    // trio's thread, holding the turn, may need the GIL to
                    // get to where it gives the turn back.
                    turn.take_detached();
                    Ok(n as usize)
                });
                let n = match waited {
                    Ok(n) => n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => return Err(e.into()),
                };
                let done = holding(&turn.turn, || {
                    self.serve(py, &events[..n], stop_fd, steps, &clock, failed)
                });
                if done? {
                    return Ok(());
                }
            }
        }
    }

    /// trio's clock, as the loop reads it.
    struct Clock<'a, 'py> {
        now: &'a Bound<'py, PyAny>,
        /// Set: the clock is the monotonic clock plus this.
        offset: Option<f64>,
    }

    impl Clock<'_, '_> {
        fn read(&self) -> PyResult<f64> {
            match self.offset {
                Some(offset) => Ok(offset + monotonic_seconds()),
                None => self.now.call0()?.extract(),
            }
        }
    }

    fn monotonic_seconds() -> f64 {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: a valid timespec to write to; CLOCK_MONOTONIC always exists on Linux.
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
        ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
    }

    impl Carrier {
        /// One wait's events, holding the turn; true: stop.
        fn serve(
            &self,
            py: Python<'_>,
            events: &[libc::epoll_event],
            stop_fd: i32,
            steps: &Bound<'_, PyDict>,
            now: &Clock<'_, '_>,
            failed: &Bound<'_, PyAny>,
        ) -> PyResult<bool> {
            // select.epoll registers a descriptor as data.fd: the low 32 bits.
            let fds = events.iter().map(|e| (e.u64 & 0xffff_ffff) as u32 as i32);
            if fds.clone().any(|fd| fd == stop_fd) {
                return Ok(true); // stopping: no more steps
            }
            let mut clock: Option<f64> = None;
            for fd in fds {
                // Looked up now: an earlier step may have dropped it.
                let Some(entry) = steps.get_item(fd)? else {
                    continue;
                };
                self.steps_run.fetch_add(1, Ordering::Relaxed);
                let ran = match entry.cast::<Lane>() {
                    Ok(lane) => self.lane(py, lane.get(), &mut clock, now),
                    // A Python read step: it disarms its own connection's lanes.
                    Err(_) => entry.call0().map(|_| ()),
                };
                if let Err(error) = ran {
                    self.bump_epoch();
                    failed.call1((fd, error.into_value(py)))?;
                }
            }
            Ok(false)
        }

        /// One read of a lane: by the compiled step while armed, else by
        /// its Python read step.
        fn lane(
            &self,
            py: Python<'_>,
            lane: &Lane,
            clock: &mut Option<f64>,
            now: &Clock<'_, '_>,
        ) -> PyResult<()> {
            let epoch = self.epoch.load(Ordering::Relaxed);
            if lane.armed.load(Ordering::Relaxed) != epoch {
                // Its Python read step looks again (and disarms its
                // connection's lanes before running anything but the
                // compiled step).
                return lane.slow.bind(py).call0().map(|_| ());
            }
            let t = match *clock {
                Some(t) => t,
                None => {
                    let t = now.read()?;
                    *clock = Some(t);
                    t
                }
            };
            self.compiled_runs.fetch_add(1, Ordering::Relaxed);
            lane.runs.fetch_add(1, Ordering::Relaxed);
            let step = lane.step.get();
            let got = match step.carry_fds(py, lane.source, lane.sink, lane.from_client, t) {
                Ok(got) => {
                    let bound = got.bind(py);
                    if bound.is_none() || bound.is_instance_of::<pyo3::types::PyInt>() {
                        return Ok(()); // nothing to read, or carried whole
                    }
                    got
                }
                Err(error) => error.into_value(py).into_any(),
            };
            // Python code of this connection runs now (``after`` disarms
            // the connection's other lane too).
            lane.armed.store(0, Ordering::Relaxed);
            lane.after.bind(py).call1((got,)).map(|_| ())
        }
    }
}
