//! A parked connection's plumbing in compiled code (sluice/proxy/relay.py,
//! ``Relay.park``): the read step of each of its directions, and the
//! accept and the dial that start it.
//!
//! A Cursus consumer commits on a connection of its own every time: one
//! accept, one command, its reply, a dial and two closes. The relay thread
//! serves such a connection from its first byte (``Relay.park``), and its
//! Python read step (``Relay._carry`` and ``_carry_read``) was a fifth of
//! what one cost the proxy: a hundred-odd bytecodes around each read, with
//! the socket objects Python makes for an accept and a dial besides.
//! `Parked` does what ``_carry_read`` does for a parked connection (the
//! read, the core, the writes the sockets take whole) and calls the
//! relay's own Python methods for everything else: the core's actions other
//! than writes (``_act_parked``: the dial, the close), the end
//! (``_end_parked``), and any hand-back to trio (``_stopped``,
//! ``_write_lost``, ``_raised``, ``_read_lost``, ``_direction_ended``). A
//! read it should not take the parked way (the connection is ending, trio
//! adopted it, the core offers a compiled step) goes to the Python step, so
//! the two can only differ in who makes the system calls; the
//! short-connection tests run both.

#[cfg(feature = "python")]
pub mod python {
    use std::io::ErrorKind;
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

    use pyo3::exceptions::{PyException, PyOSError};
    use pyo3::intern;
    use pyo3::prelude::*;
    use pyo3::types::{PyBytes, PyList, PyType};

    use crate::carrier::python::monotonic_seconds;
    use crate::step::python::{read, write, BUFFER};
    use crate::step::READ_SIZE;

    /// Parked(relay, thread, fd, from_client, back, slow, send, now,
    /// offset=None): the read step of one direction of a parked relay
    /// (``relay`` a ``Relay``; ``thread``, ``fd``, ``from_client`` and
    /// ``back`` what its Python read step is given; ``slow`` that step, for
    /// any read not taken the parked way; ``send`` the ``Send`` action
    /// class; ``now()`` the relay thread's clock, or ``offset`` plus the
    /// monotonic clock, as ``Carrier.run`` reads it).
    #[pyclass(module = "sluice._frames", frozen)]
    pub struct Parked {
        relay: Py<PyAny>,
        thread: Py<PyAny>,
        fd: i32,
        from_client: bool,
        back: Py<PyAny>,
        slow: Py<PyAny>,
        send: Py<PyType>,
        now: Py<PyAny>,
        offset: Option<f64>,
    }

    /// Where a read's actions stopped short of the end.
    enum Stop {
        /// All done.
        Done,
        /// Trio finishes them from this action (``rest``: what is left to
        /// write of it, when it is a write).
        At(usize, Option<Py<PyBytes>>),
        /// The step handed the direction over itself (the end, a failed write).
        Over,
    }

    #[pymethods]
    impl Parked {
        #[new]
        #[allow(clippy::too_many_arguments)]
        #[pyo3(signature = (relay, thread, fd, from_client, back, slow, send, now, offset=None))]
        fn new(
            relay: Py<PyAny>,
            thread: Py<PyAny>,
            fd: i32,
            from_client: bool,
            back: Py<PyAny>,
            slow: Py<PyAny>,
            send: Py<PyType>,
            now: Py<PyAny>,
            offset: Option<f64>,
        ) -> Self {
            Parked {
                relay,
                thread,
                fd,
                from_client,
                back,
                slow,
                send,
                now,
                offset,
            }
        }

        /// One read of the direction (what the relay thread's loop calls).
        fn __call__(&self, py: Python<'_>) -> PyResult<()> {
            let relay = self.relay.bind(py);
            // ``_carry``'s own checks first: a read any of them concerns
            // goes its way.
            if relay.getattr(intern!(py, "_closing"))?.is_truthy()?
                || (self.from_client && relay.getattr(intern!(py, "_draining"))?.is_truthy()?)
            {
                return self.slow.bind(py).call0().map(|_| ());
            }
            let quick = relay.getattr(intern!(py, "_quick"))?;
            if !quick.is_none() && !quick.call1((self.from_client,))?.is_none() {
                return self.slow.bind(py).call0().map(|_| ());
            }
            let read = BUFFER.with(|buffer| {
                let mut buffer = buffer.borrow_mut();
                let buf = &mut buffer[..READ_SIZE];
                read(self.fd, buf).map(|n| PyBytes::new(py, &buf[..n]))
            });
            let data = match read {
                Ok(data) => data,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(()),
                Err(e) => {
                    let error = os_error(e).into_value(py);
                    let args = (&self.thread, self.fd, self.from_client, &self.back, error);
                    return relay
                        .call_method1(intern!(py, "_read_lost"), args)
                        .map(|_| ());
                }
            };
            if relay.getattr(intern!(py, "_parked"))?.is_none() {
                // Trio adopted it: the usual way, from these bytes.
                let args = (&self.thread, self.fd, self.from_client, &self.back, &data);
                return relay
                    .call_method1(intern!(py, "_carry_read"), args)
                    .map(|_| ());
            }
            relay.call_method0(intern!(py, "_disarm"))?;
            let n = data.as_bytes().len();
            if self.from_client && n > 0 {
                let bytes_in = relay.getattr(intern!(py, "bytes_in"))?;
                relay.setattr(intern!(py, "bytes_in"), bytes_in.add(n)?)?;
            }
            let started = monotonic_seconds();
            match self.actions(py, relay, &data, started) {
                Ok(Stop::Done) => {
                    if n == 0 {
                        // This direction ended, the connection goes on: trio's.
                        let args = (&self.thread, self.fd, self.from_client, &self.back);
                        relay.call_method1(intern!(py, "_direction_ended"), args)?;
                    }
                    Ok(())
                }
                Ok(Stop::Over) => Ok(()),
                Ok(Stop::At(..)) => unreachable!("handed to trio in actions()"),
                Err(error) if error.is_instance_of::<PyException>(py) => {
                    // Raised in trio, where it ends the connection as usual.
                    let args = (
                        &self.thread,
                        self.fd,
                        self.from_client,
                        &self.back,
                        error.into_value(py),
                    );
                    relay.call_method1(intern!(py, "_raised"), args).map(|_| ())
                }
                Err(error) => Err(error),
            }
        }
    }

    impl Parked {
        /// The core's actions for ``data``, carried out as ``_carry_read``
        /// does: writes the sockets take whole here, other actions by
        /// ``_act_parked``; from the first that needs trio on, by trio.
        fn actions(
            &self,
            py: Python<'_>,
            relay: &Bound<'_, PyAny>,
            data: &Bound<'_, PyBytes>,
            started: f64,
        ) -> PyResult<Stop> {
            let core = relay.getattr(intern!(py, "core"))?;
            let now = match self.offset {
                Some(offset) => offset + monotonic_seconds(),
                None => self.now.bind(py).call0()?.extract()?,
            };
            let receive = if self.from_client {
                intern!(py, "receive_client")
            } else {
                intern!(py, "receive_broker")
            };
            let got = core.call_method1(receive, (data, now))?;
            let actions = got.cast::<PyList>()?;
            let send = self.send.bind(py);
            let is_send = |action: &Bound<'_, PyAny>| action.get_type().is(send);
            // (As in trio: a read whose actions end in a write counts as
            // relayed; one that dialled first does not.)
            let relayed = match actions.len() {
                0 => false,
                n => is_send(&actions.get_item(n - 1)?),
            };
            let descriptors = relay.getattr(intern!(py, "_descriptors"))?;
            let waiting = relay.getattr(intern!(py, "_waiting"))?;
            let mut done = 0;
            let stop = loop {
                if done >= actions.len() {
                    break Stop::Done;
                }
                let action = actions.get_item(done)?;
                if is_send(&action) {
                    let to = action.getattr(intern!(py, "to"))?;
                    let out = action.getattr(intern!(py, "data"))?;
                    let rest = match self.write_now(py, relay, &descriptors, &waiting, &to, &out)? {
                        Ok(rest) => rest,
                        Err(error) => {
                            let args = (
                                &self.thread,
                                self.fd,
                                self.from_client,
                                &self.back,
                                to,
                                error,
                            );
                            relay.call_method1(intern!(py, "_write_lost"), args)?;
                            break Stop::Over;
                        }
                    };
                    if let Some(rest) = rest {
                        break Stop::At(done, Some(rest));
                    }
                } else if relay.getattr(intern!(py, "_parked"))?.is_none() {
                    break Stop::At(done, None);
                } else {
                    let more =
                        relay.call_method1(intern!(py, "_act_parked"), (&self.thread, &action))?;
                    if more.is_none() {
                        break Stop::At(done, None);
                    }
                    if relay.getattr(intern!(py, "_closing"))?.is_truthy()? {
                        relay.call_method1(intern!(py, "_end_parked"), (&self.thread,))?;
                        break Stop::Over;
                    }
                    for (k, next) in more.cast::<PyList>()?.iter().enumerate() {
                        actions.insert(done + 1 + k, next)?;
                    }
                }
                done += 1;
            };
            match stop {
                Stop::Done => {
                    if !data.as_bytes().is_empty()
                        && relayed
                        && core.getattr(intern!(py, "established"))?.is_truthy()?
                    {
                        relay.call_method1(intern!(py, "_relayed"), (self.from_client, started))?;
                    }
                    Ok(Stop::Done)
                }
                Stop::At(done, rest) => {
                    let rest = match rest {
                        Some(rest) => rest.into_bound(py),
                        None => PyBytes::new(py, b""),
                    };
                    let args = (
                        &self.thread,
                        self.fd,
                        self.from_client,
                        &self.back,
                        data,
                        actions,
                        done,
                        rest,
                        started,
                    );
                    relay.call_method1(intern!(py, "_stopped"), args)?;
                    Ok(Stop::Over)
                }
                Stop::Over => Ok(Stop::Over),
            }
        }

        /// ``Relay._write_now``: what is left to write (None: nothing), or
        /// the socket's error.
        fn write_now(
            &self,
            py: Python<'_>,
            relay: &Bound<'_, PyAny>,
            descriptors: &Bound<'_, PyAny>,
            waiting: &Bound<'_, PyAny>,
            to: &Bound<'_, PyAny>,
            out: &Bound<'_, PyAny>,
        ) -> PyResult<Result<Option<Py<PyBytes>>, Py<PyAny>>> {
            let fd = descriptors.get_item(to)?;
            if fd.is_none() || waiting.get_item(to)?.is_truthy()? {
                // Nowhere to send yet, or a write that had to wait goes
                // first: as ``_write_now`` says.
                let rest = relay.call_method1(intern!(py, "_write_now"), (to, out))?;
                let rest = rest.cast_into::<PyBytes>()?;
                return Ok(Ok((!rest.as_bytes().is_empty()).then(|| rest.unbind())));
            }
            let fd: i32 = fd.extract()?;
            let bytes = out.cast::<PyBytes>()?;
            let whole = bytes.as_bytes();
            let (written, failed) = write(fd, whole);
            if let Some(error) = failed {
                return Ok(Err(os_error(error).into_value(py).into_any()));
            }
            if written == whole.len() {
                return Ok(Ok(None));
            }
            Ok(Ok(Some(PyBytes::new(py, &whole[written..]).unbind())))
        }
    }

    /// accept_now(fd) -> (fd, host, port) | None: a connection waiting on
    /// the listening socket ``fd``, accepted non-blocking and
    /// close-on-exec in one call (Python's ``accept()`` makes a socket
    /// object and then a second call to make it non-blocking); None when
    /// none is waiting. Raises the OSError ``accept()`` would (a client
    /// gone before its accept is a ConnectionError).
    #[pyfunction]
    pub fn accept_now(fd: i32) -> PyResult<Option<(i32, String, u16)>> {
        // SAFETY: zeroed storage is a valid sockaddr_storage.
        let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        let accepted = loop {
            // SAFETY: storage and len describe a writable sockaddr_storage.
            let got = unsafe {
                libc::accept4(
                    fd,
                    (&mut storage as *mut libc::sockaddr_storage).cast(),
                    &mut len,
                    libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                )
            };
            if got >= 0 {
                break got;
            }
            let error = std::io::Error::last_os_error();
            match error.kind() {
                ErrorKind::Interrupted => continue,
                ErrorKind::WouldBlock => return Ok(None),
                _ => return Err(os_error(error)),
            }
        };
        match peer(&storage) {
            Some(address) => Ok(Some((accepted, host_of(&address), address.port()))),
            None => {
                // SAFETY: the descriptor accept4 just gave us, closed once.
                unsafe { libc::close(accepted) };
                Err(PyOSError::new_err(
                    "accepted a connection that is not TCP/IP",
                ))
            }
        }
    }

    /// The address a sockaddr_storage holds, if it is IPv4 or IPv6.
    fn peer(storage: &libc::sockaddr_storage) -> Option<SocketAddr> {
        match i32::from(storage.ss_family) {
            libc::AF_INET => {
                // SAFETY: the family says the storage holds a sockaddr_in.
                let sin: &libc::sockaddr_in = unsafe { &*(storage as *const _ as *const _) };
                let ip = Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
                Some(SocketAddr::new(IpAddr::V4(ip), u16::from_be(sin.sin_port)))
            }
            libc::AF_INET6 => {
                // SAFETY: the family says the storage holds a sockaddr_in6.
                let sin6: &libc::sockaddr_in6 = unsafe { &*(storage as *const _ as *const _) };
                let ip = Ipv6Addr::from(sin6.sin6_addr.s6_addr);
                let mut address =
                    std::net::SocketAddrV6::new(ip, u16::from_be(sin6.sin6_port), 0, 0);
                address.set_scope_id(sin6.sin6_scope_id);
                Some(SocketAddr::V6(address))
            }
            _ => None,
        }
    }

    /// The host as Python's ``accept()`` writes it (a link-local IPv6
    /// address with its interface: ``fe80::1%eth0``).
    fn host_of(address: &SocketAddr) -> String {
        match address {
            SocketAddr::V4(v4) => v4.ip().to_string(),
            SocketAddr::V6(v6) if v6.scope_id() == 0 => v6.ip().to_string(),
            SocketAddr::V6(v6) => {
                let mut name = [0 as libc::c_char; libc::IF_NAMESIZE];
                // SAFETY: name has room for IF_NAMESIZE bytes, as required.
                let found = unsafe { libc::if_indextoname(v6.scope_id(), name.as_mut_ptr()) };
                let scope = if found.is_null() {
                    v6.scope_id().to_string()
                } else {
                    // SAFETY: if_indextoname wrote a NUL-terminated name.
                    unsafe { std::ffi::CStr::from_ptr(name.as_ptr()) }
                        .to_string_lossy()
                        .into_owned()
                };
                format!("{}%{scope}", v6.ip())
            }
        }
    }

    /// connect_now(host, port) -> (fd, connected) | None: begin a TCP
    /// connection to an IP address without waiting, as ``dial.start_tcp``
    /// does (a non-blocking socket with TCP_NODELAY, its connect(), and,
    /// where that says "in progress", whether it is connected already: over
    /// loopback it nearly always is); None for a host that is not an IP
    /// address. Raises OSError where the connection fails at once.
    #[pyfunction]
    pub fn connect_now(host: &str, port: u16) -> PyResult<Option<(i32, bool)>> {
        let Ok(ip) = host.parse::<IpAddr>() else {
            return Ok(None);
        };
        let family = if ip.is_ipv4() {
            libc::AF_INET
        } else {
            libc::AF_INET6
        };
        // SAFETY: plain system calls on a descriptor owned here until returned.
        let fd = unsafe {
            libc::socket(
                family,
                libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                0,
            )
        };
        if fd < 0 {
            return Err(os_error(std::io::Error::last_os_error()));
        }
        let close_with = |error: PyErr| {
            // SAFETY: the descriptor made above, closed once.
            unsafe { libc::close(fd) };
            Err(error)
        };
        let on: libc::c_int = 1;
        // SAFETY: a valid option value of its size.
        let set = unsafe {
            libc::setsockopt(
                fd,
                libc::IPPROTO_TCP,
                libc::TCP_NODELAY,
                (&on as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if set < 0 {
            return close_with(os_error(std::io::Error::last_os_error()));
        }
        let (storage, len) = sockaddr(&SocketAddr::new(ip, port));
        // SAFETY: storage holds a sockaddr of len bytes.
        let got =
            unsafe { libc::connect(fd, (&storage as *const libc::sockaddr_storage).cast(), len) };
        if got == 0 {
            return Ok(Some((fd, true)));
        }
        let error = std::io::Error::last_os_error();
        let code = error.raw_os_error().unwrap_or(0);
        if code != libc::EINPROGRESS {
            let target = format!("('{host}', {port})");
            let message = format!("Error connecting to {target}: {}", strerror(code));
            return close_with(PyOSError::new_err((code, message)));
        }
        // SAFETY: zeroed storage is a valid sockaddr_storage to write to.
        let mut peer: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        let mut peer_len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        // SAFETY: peer and peer_len describe a writable sockaddr_storage.
        let connected = unsafe {
            libc::getpeername(
                fd,
                (&mut peer as *mut libc::sockaddr_storage).cast(),
                &mut peer_len,
            )
        } == 0;
        Ok(Some((fd, connected)))
    }

    /// A socket address as the C library takes it.
    fn sockaddr(address: &SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
        // SAFETY: zeroed storage is a valid sockaddr_storage.
        let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        let len = match address {
            SocketAddr::V4(v4) => {
                // SAFETY: sockaddr_storage is large enough and aligned for a sockaddr_in.
                let sin: &mut libc::sockaddr_in =
                    unsafe { &mut *(&mut storage as *mut _ as *mut _) };
                sin.sin_family = libc::AF_INET as libc::sa_family_t;
                sin.sin_port = v4.port().to_be();
                sin.sin_addr.s_addr = u32::from(*v4.ip()).to_be();
                std::mem::size_of::<libc::sockaddr_in>()
            }
            SocketAddr::V6(v6) => {
                // SAFETY: sockaddr_storage is large enough and aligned for a sockaddr_in6.
                let sin6: &mut libc::sockaddr_in6 =
                    unsafe { &mut *(&mut storage as *mut _ as *mut _) };
                sin6.sin6_family = libc::AF_INET6 as libc::sa_family_t;
                sin6.sin6_port = v6.port().to_be();
                sin6.sin6_addr.s6_addr = v6.ip().octets();
                sin6.sin6_scope_id = v6.scope_id();
                std::mem::size_of::<libc::sockaddr_in6>()
            }
        };
        (storage, len as libc::socklen_t)
    }

    /// A system call's error as Python raises it: ``OSError(errno,
    /// strerror)``, which Python makes the matching subclass
    /// (ConnectionResetError, BlockingIOError...), with the errno callers
    /// look at and the words ``os.read`` would give.
    pub(crate) fn os_error(error: std::io::Error) -> PyErr {
        match error.raw_os_error() {
            Some(code) => PyOSError::new_err((code, strerror(code))),
            None => error.into(),
        }
    }

    /// The C library's words for an error number (what os.strerror says).
    fn strerror(code: i32) -> String {
        // SAFETY: strerror returns a NUL-terminated string for any number.
        unsafe { std::ffi::CStr::from_ptr(libc::strerror(code)) }
            .to_string_lossy()
            .into_owned()
    }
}
