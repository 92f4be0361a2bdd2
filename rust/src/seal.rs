//! Pulsar's end-to-end encryption of SENDs on the compiled path: what the
//! `encrypt` filter does for a producer whose topic has nothing else to
//! run, without the read going through Python.
//!
//! The reference is the Python path (`FilterGate.send` with a `Sealer`,
//! sluice/protocols/pulsar/filtering.py, and sluice/filters/crypto.py for
//! the format); tests/test_compiled_seal.py holds the two to the same
//! bytes. A sealed SEND is the frame with:
//!
//! - its metadata's own bytes, then the wrapped keys (field 13, serialized
//!   once per data key by Python) and the IV (field 15): protobuf reads
//!   fields in any order, so nothing is parsed or rewritten;
//! - its payload encrypted with AES-256-GCM under the data key, the 16-byte
//!   tag after it;
//! - the CRC32-C made anew over the new section.
//!
//! A SEND the client encrypted itself (its metadata has field 13) goes on
//! as it is, as in Python.

use ring::aead::{Aad, LessSafeKey, Nonce};

use crate::Scanned;

pub const IV_BYTES: usize = 12;
pub const TAG_BYTES: usize = 16;
/// Field 15 (encryption_param), length-delimited, 12 bytes.
const IV_FIELD: [u8; 2] = [(15 << 3) | 2, IV_BYTES as u8];
const MAGIC_CHECKSUM: [u8; 2] = [0x0e, 0x01];

/// What `seal_frame` did with one frame.
#[derive(Debug, PartialEq, Eq)]
pub enum Sealed {
    /// Appended to the output, sealed.
    Done,
    /// Not to be sealed (the client encrypted it): the caller writes it as it is.
    AsIs,
    /// Sealed, it would be over `max_total`: for the Python path to refuse.
    TooLarge,
}

/// The size of `frame` (its length prefix's value) once sealed with
/// `keys_field`.
fn sealed_total(frame_len: usize, s: &Scanned, keys_field: usize) -> Option<usize> {
    let checksum = if s.checksum >= 0 { 0 } else { 6 };
    Some(frame_len - 4 + checksum + keys_field + IV_FIELD.len() + IV_BYTES + TAG_BYTES)
}

/// `frame`, a SEND the scanner checked (`s`), sealed into `out` (see the
/// module's comment); `out` is as it was unless `Done`.
pub fn seal_frame(
    frame: &[u8],
    s: &Scanned,
    cipher: &LessSafeKey,
    keys_field: &[u8],
    iv: &[u8; IV_BYTES],
    max_total: u32,
    out: &mut Vec<u8>,
) -> Option<Sealed> {
    let mo = usize::try_from(s.metadata_offset).ok()?;
    let po = usize::try_from(s.payload_offset).ok()?;
    let head_end = if s.checksum >= 0 {
        mo.checked_sub(6)?
    } else {
        mo
    };
    let head = frame.get(4..head_end)?;
    let meta = frame.get(mo.checked_add(4)?..po)?;
    if crate::summary::has_field(meta, 13)? {
        return Some(Sealed::AsIs);
    }
    let payload = frame.get(po..)?;
    let total = sealed_total(frame.len(), s, keys_field.len())?;
    if total > max_total as usize {
        return Some(Sealed::TooLarge);
    }
    let meta_len = u32::try_from(meta.len() + keys_field.len() + IV_FIELD.len() + IV_BYTES).ok()?;
    let start = out.len();
    out.reserve(total + 4);
    out.extend_from_slice(&u32::try_from(total).ok()?.to_be_bytes());
    out.extend_from_slice(head);
    out.extend_from_slice(&MAGIC_CHECKSUM);
    let crc_at = out.len();
    out.extend_from_slice(&[0; 4]);
    let section_at = out.len();
    out.extend_from_slice(&meta_len.to_be_bytes());
    out.extend_from_slice(meta);
    out.extend_from_slice(keys_field);
    out.extend_from_slice(&IV_FIELD);
    out.extend_from_slice(iv);
    let body_at = out.len();
    out.extend_from_slice(payload);
    let nonce = Nonce::assume_unique_for_key(*iv);
    let Ok(tag) = cipher.seal_in_place_separate_tag(nonce, Aad::empty(), &mut out[body_at..])
    else {
        out.truncate(start);
        return None;
    };
    out.extend_from_slice(tag.as_ref());
    let crc = crate::crc32c(&out[section_at..]);
    out[crc_at..crc_at + 4].copy_from_slice(&crc.to_be_bytes());
    debug_assert_eq!(out.len() - start, total + 4);
    Some(Sealed::Done)
}

#[cfg(feature = "python")]
pub mod python {
    use std::collections::HashSet;
    use std::sync::Mutex;

    use pyo3::exceptions::PyValueError;
    use pyo3::prelude::*;
    use pyo3::types::PyBytes;
    use ring::aead::{LessSafeKey, UnboundKey, AES_256_GCM};

    use super::{seal_frame, Sealed, IV_BYTES};

    /// The data key and its wrapped keys, good until a time, and the IVs
    /// made under it: a random prefix drawn once per data key, then a
    /// counter (NIST SP 800-38D's deterministic construction: an IV is never
    /// used twice under one key, and no system call per SEND).
    struct Armed {
        key: Vec<u8>,
        cipher: LessSafeKey,
        keys_field: Vec<u8>,
        until: f64,
        prefix: [u8; 4],
        counter: u64,
    }

    impl Armed {
        fn next_iv(&mut self) -> Option<[u8; IV_BYTES]> {
            self.counter = self.counter.checked_add(1)?;
            let mut iv = [0; IV_BYTES];
            iv[..4].copy_from_slice(&self.prefix);
            iv[4..].copy_from_slice(&self.counter.to_be_bytes());
            Some(iv)
        }
    }

    /// Seal(name, fixed_iv=None): one `encrypt` filter's key, as the
    /// compiled path uses it. Python arms it (``arm``) with the current
    /// data key, its wrapped keys' field and the monotonic time it is good
    /// until; past that, reads go the Python way, which makes the next.
    /// ``fixed_iv`` is for tests only (the same bytes as Python's path).
    #[pyclass(module = "sluice._frames", frozen)]
    pub struct Seal {
        pub(crate) name: String,
        armed: Mutex<Option<Armed>>,
        fixed_iv: Option<[u8; IV_BYTES]>,
    }

    #[pymethods]
    impl Seal {
        #[new]
        #[pyo3(signature = (name, fixed_iv=None))]
        fn new(name: String, fixed_iv: Option<Vec<u8>>) -> PyResult<Self> {
            let fixed_iv = match fixed_iv {
                Some(iv) => Some(
                    <[u8; IV_BYTES]>::try_from(iv.as_slice())
                        .map_err(|_| PyValueError::new_err("an IV is 12 bytes"))?,
                ),
                None => None,
            };
            Ok(Seal {
                name,
                armed: Mutex::new(None),
                fixed_iv,
            })
        }

        /// arm(data_key, keys_field, until): seal with this key from now on,
        /// until the time ``until`` (the relay's clock). The same key again
        /// keeps its IV counter.
        fn arm(&self, data_key: &[u8], keys_field: &[u8], until: f64) -> PyResult<()> {
            let mut armed = self.armed.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(current) = armed.as_mut().filter(|a| a.key == data_key) {
                current.keys_field = keys_field.to_vec();
                current.until = until;
                return Ok(());
            }
            let cipher = UnboundKey::new(&AES_256_GCM, data_key)
                .map(LessSafeKey::new)
                .map_err(|_| PyValueError::new_err("a data key is 32 bytes"))?;
            let mut prefix = [0; 4];
            getrandom::fill(&mut prefix)
                .map_err(|e| PyValueError::new_err(format!("no random bytes: {e}")))?;
            *armed = Some(Armed {
                key: data_key.to_vec(),
                cipher,
                keys_field: keys_field.to_vec(),
                until,
                prefix,
                counter: 0,
            });
            Ok(())
        }

        /// The monotonic time the key is good until (0.0: not armed).
        #[getter]
        fn until(&self) -> f64 {
            let armed = self.armed.lock().unwrap_or_else(|e| e.into_inner());
            armed.as_ref().map_or(0.0, |a| a.until)
        }

        /// seal(frame, now) -> the SEND frame sealed, or None when it goes
        /// on as it is (the client encrypted it), the key is not good at
        /// ``now``, or it would be over 2**31 bytes: what the step does,
        /// for the tests that hold it to the Python path.
        fn seal<'py>(
            &self,
            py: Python<'py>,
            frame: &[u8],
            now: f64,
        ) -> PyResult<Option<Bound<'py, PyBytes>>> {
            let Some(s) = crate::check_frame(frame).filter(|s| s.kind == crate::SEND) else {
                return Err(PyValueError::new_err("not a SEND the scanner takes"));
            };
            let mut out = Vec::new();
            Ok(
                match self.seal_into(frame, &s, now, u32::MAX >> 1, &mut out) {
                    Some(Sealed::Done) => Some(PyBytes::new(py, &out)),
                    _ => None,
                },
            )
        }
    }

    impl Seal {
        /// One frame sealed into `out`; None: the key is not good at `now`.
        pub(crate) fn seal_into(
            &self,
            frame: &[u8],
            s: &crate::Scanned,
            now: f64,
            max_total: u32,
            out: &mut Vec<u8>,
        ) -> Option<Sealed> {
            let mut armed = self.armed.lock().unwrap_or_else(|e| e.into_inner());
            let armed = armed.as_mut().filter(|a| now < a.until)?;
            let iv = match self.fixed_iv {
                Some(iv) => iv,
                None => armed.next_iv()?,
            };
            seal_frame(
                frame,
                s,
                &armed.cipher,
                &armed.keys_field,
                &iv,
                max_total,
                out,
            )
        }
    }

    /// Sealing() -> one connection's producers whose SENDs the compiled
    /// step seals, and with which ``Seal``.
    #[pyclass(module = "sluice._frames", frozen)]
    pub struct Sealing {
        pub(crate) state: Mutex<(HashSet<u64>, Option<Py<Seal>>)>,
    }

    #[pymethods]
    impl Sealing {
        #[new]
        fn new() -> Self {
            Sealing {
                state: Mutex::new((HashSet::new(), None)),
            }
        }

        /// add(producer_id, seal): that producer's SENDs sealed with ``seal``
        /// (a connection has one Seal; False when another is in use).
        fn add(&self, producer_id: u64, seal: Py<Seal>) -> bool {
            let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(current) = &state.1 {
                if !current.is(&seal) {
                    return false;
                }
            } else {
                state.1 = Some(seal);
            }
            state.0.insert(producer_id);
            true
        }

        /// discard(producer_id): that producer's SENDs no longer sealed here
        /// (closed: a client may give its id to a producer on another topic).
        fn discard(&self, producer_id: u64) {
            let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
            state.0.remove(&producer_id);
        }

        fn __contains__(&self, producer_id: u64) -> bool {
            let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
            state.0.contains(&producer_id)
        }
    }
}
