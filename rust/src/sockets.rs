//! A parked connection's accept and dial in compiled code (sluice/proxy/
//! server.py ``_accept_parked``, sluice/proxy/dial.py ``start_tcp``).
//!
//! A Cursus consumer commits on a connection of its own every time: one
//! accept, one command, its reply, a dial and two closes, served by the
//! relay thread from its first byte (``Relay.park``). Python's ``accept()``
//! and ``socket()`` make a socket object each, that the relay thread only
//! takes the descriptor of, and the accepted one takes a second system
//! call to be made non-blocking; here each is the system calls alone, with
//! the same results and the same errors (tests/test_short_connections.py
//! holds the two to each other).

#[cfg(feature = "python")]
pub mod python {
    use std::io::ErrorKind;
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

    use pyo3::exceptions::PyOSError;
    use pyo3::prelude::*;

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
