"""The ``encrypt`` filter without a broker: the format checked with the
primitives themselves, data keys rotated on time and on a changed key file,
one line per mistake in its settings, and the Pulsar core sealing SENDs
and opening deliveries (tests/test_encryption_e2e.py has the clients)."""

from __future__ import annotations

import json
import tracemalloc
from collections.abc import Mapping
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import hashes, hmac, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, padding, rsa
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.x963kdf import X963KDF

from sluice.errors import ConfigError
from sluice.filters.chain import make_filters
from sluice.filters.config import FilterSpec, parse_flag
from sluice.filters.encryption import CHECK_EVERY, Encryption, EncryptionSettings
from sluice.protocols import registry
from sluice.protocols.core import Filtered, Peer
from sluice.protocols.filtering import DELIVER, PRODUCE, WrappedKey
from sluice.protocols.pulsar import pb
from sluice.protocols.pulsar.decoder import decode_frame
from sluice.protocols.pulsar.encoder import command, encode_payload
from sluice.protocols.pulsar.payload import messages
from tests.test_filters import TOPIC, WORDS, _core, _message_frame, _send
from tests.test_pulsar_core import names, sent

T = pb.BaseCommand
OAEP = padding.OAEP(mgf=padding.MGF1(hashes.SHA1()), algorithm=hashes.SHA1(), label=None)


def key_pair(directory: Path, name: str) -> tuple[Path, Path, rsa.RSAPrivateKey]:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private = directory / f"{name}.pem"
    private.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                          serialization.PrivateFormat.TraditionalOpenSSL,
                                          serialization.NoEncryption()))  # fmt: skip
    public = directory / f"{name}.pub.pem"
    public.write_bytes(key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))  # fmt: skip
    return public, private, key


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_format_is_pulsars_read_with_the_primitives_alone(tmp_path: Path) -> None:
    public, _, key = key_pair(tmp_path, "k")
    f = Encryption(EncryptionSettings(public_keys={"k": str(public)},
                                      key_metadata={"version": "7"}))  # fmt: skip
    sealed = f.seal(TOPIC, b"hello, broker")
    ((wrapped),) = sealed.keys
    assert (wrapped.name, dict(wrapped.metadata)) == ("k", {"version": "7"})
    data_key = key.decrypt(wrapped.value, OAEP)  # RSA-OAEP, SHA-1 and MGF1-SHA-1
    assert len(data_key) == 32 and len(sealed.param) == 12  # AES-256, a 12-byte IV
    assert len(sealed.data) == len(b"hello, broker") + 16  # the GCM tag after the ciphertext
    assert AESGCM(data_key).decrypt(sealed.param, sealed.data, None) == b"hello, broker"
    again = f.seal(TOPIC, b"hello, broker")
    assert again.param != sealed.param and again.keys == sealed.keys  # a new IV, the same data key


@pytest.mark.parametrize("curve", [ec.SECP256R1(), ec.SECP384R1(), ec.SECP521R1(), ec.SECP256K1()])
def test_an_ec_key_wraps_as_bouncy_castles_ecies(tmp_path: Path, curve: ec.EllipticCurve) -> None:
    """V || C || T: the ephemeral point, the data key XOR the KDF2-SHA-1 stream
    after a 16-byte MAC key, HMAC-SHA-1 over C and 8 zero bytes (checked
    here with the primitives alone; the Java client reads it in
    tests/test_encryption_e2e.py)."""
    key = ec.generate_private_key(curve)
    public = tmp_path / "ec.pub.pem"
    public.write_bytes(key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))  # fmt: skip
    private = tmp_path / "ec.pem"
    private.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                          serialization.PrivateFormat.TraditionalOpenSSL,
                                          serialization.NoEncryption()))  # fmt: skip
    sealed = Encryption(EncryptionSettings(public_keys={"ec": str(public)})).seal(TOPIC, b"m")
    wrapped = sealed.keys[0].value
    size = (curve.key_size + 7) // 8
    v, c, t = wrapped[: 1 + 2 * size], wrapped[1 + 2 * size : -20], wrapped[-20:]
    assert v[0] == 4 and len(c) == 32  # an uncompressed point; the data key's length
    shared = key.exchange(ec.ECDH(), ec.EllipticCurvePublicKey.from_encoded_point(curve, v))
    stream = X963KDF(hashes.SHA1(), 16 + 32, None).derive(v + shared)
    mac = hmac.HMAC(stream[:16], hashes.SHA1())
    mac.update(c + bytes(8))
    assert mac.finalize() == t
    data_key = bytes(a ^ b for a, b in zip(c, stream[16:], strict=True))
    assert AESGCM(data_key).decrypt(sealed.param, sealed.data, None) == b"m"
    opener = Encryption(EncryptionSettings(private_keys={"ec": str(private)}))
    assert opener.open(TOPIC, sealed.keys, sealed.param, sealed.data) == b"m"
    tampered = [WrappedKey("ec", wrapped[:-1] + bytes([wrapped[-1] ^ 1]))]
    assert (
        Encryption(EncryptionSettings(private_keys={"ec": str(private)})).open(
            TOPIC, tampered, sealed.param, sealed.data
        )
        is None
    )


def test_what_is_sealed_opens_with_the_private_key_only(tmp_path: Path) -> None:
    public, private, _ = key_pair(tmp_path, "k")
    _, other, _ = key_pair(tmp_path, "other")
    sealer = Encryption(EncryptionSettings(public_keys={"k": str(public)}))
    opener = Encryption(EncryptionSettings(private_keys={"k": str(private)}))
    stranger = Encryption(EncryptionSettings(private_keys={"k": str(other)}))
    sealed = sealer.seal(TOPIC, b"x" * 5000)
    assert opener.open(TOPIC, sealed.keys, sealed.param, sealed.data) == b"x" * 5000
    assert stranger.open(TOPIC, sealed.keys, sealed.param, sealed.data) is None
    altered = bytes([sealed.data[0] ^ 1]) + sealed.data[1:]
    assert opener.open(TOPIC, sealed.keys, sealed.param, altered) is None
    renamed = [WrappedKey("unknown", k.value) for k in sealed.keys]
    fresh = Encryption(EncryptionSettings(private_keys={"k": str(private)}))
    assert fresh.open(TOPIC, renamed, sealed.param, sealed.data) is None  # keys go by name
    assert sealer.sealer(PRODUCE) is sealer and sealer.sealer(DELIVER) is None
    assert opener.sealer(DELIVER) is opener and opener.sealer(PRODUCE) is None


def test_data_keys_rotate_on_time_and_at_once_for_a_changed_key_file(tmp_path: Path) -> None:
    public, _, _ = key_pair(tmp_path, "first")
    current = tmp_path / "current.pub.pem"
    current.write_bytes(public.read_bytes())
    clock = Clock()
    settings = EncryptionSettings(public_keys={"k": str(current)}, rotate_every=60)
    f = Encryption(settings, clock=clock)
    first = f.seal(TOPIC, b"a").keys
    clock.now += 59
    assert f.seal(TOPIC, b"a").keys is first
    clock.now += 1
    second = f.seal(TOPIC, b"a").keys
    assert second != first
    # A new key in the file: used from the next look at the files on.
    new_public, _, new_key = key_pair(tmp_path, "second")
    current.write_bytes(new_public.read_bytes())
    assert f.seal(TOPIC, b"a").keys is second  # not looked at yet
    clock.now += CHECK_EVERY
    third = f.seal(TOPIC, b"b")
    assert third.keys != second
    data_key = new_key.decrypt(third.keys[0].value, OAEP)
    assert AESGCM(data_key).decrypt(third.param, third.data, None) == b"b"
    # A file that turns unreadable keeps the key read before it.
    current.write_text("not a key")
    clock.now += CHECK_EVERY
    kept = f.seal(TOPIC, b"c")
    assert kept.keys == third.keys


def _flag(settings: Mapping[str, object], direction: str = "produce") -> FilterSpec:
    return parse_flag("encrypt:" + json.dumps({"direction": direction, "settings": settings}))


def _refusal(*specs: FilterSpec) -> str:
    with pytest.raises(ConfigError) as caught:
        make_filters(specs, registry.get("pulsar"))
    return str(caught.value)


def test_every_mistake_in_its_settings_is_one_line(tmp_path: Path) -> None:
    public, private, _ = key_pair(tmp_path, "k")
    ed_key = tmp_path / "ed25519.pub.pem"
    ed_key.write_bytes(ed25519.Ed25519PrivateKey.generate().public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))  # fmt: skip
    locked = tmp_path / "locked.pem"
    locked.write_bytes(rsa.generate_private_key(public_exponent=65537, key_size=2048)
                       .private_bytes(serialization.Encoding.PEM,
                                      serialization.PrivateFormat.PKCS8,
                                      serialization.BestAvailableEncryption(b"pw")))  # fmt: skip
    assert _refusal(_flag({})) == (
        "filter 'encrypt': give public_keys (to encrypt what producers send), private_keys "
        "(to decrypt deliveries), or both"
    )
    assert _refusal(_flag({"public_keys": {"k": str(tmp_path / "nope.pem")}})) == (
        f"filter 'encrypt': key 'k' ({tmp_path / 'nope.pem'}): cannot read it: "
        "No such file or directory"
    )
    assert _refusal(_flag({"public_keys": {"k": str(ed_key)}})) == (
        f"filter 'encrypt': key 'k' ({ed_key}) holds a Ed25519 key; "
        "Pulsar's clients read RSA and EC keys"
    )
    assert _refusal(_flag({"private_keys": {"k": str(locked)}}, "deliver")) == (
        f"filter 'encrypt': key 'k' ({locked}) holds a password-protected key; give it unencrypted"
    )
    for never in (0, float("nan"), float("inf")):  # (nan and inf: never rotated, but taken)
        assert _refusal(_flag({"public_keys": {"k": str(private)}, "rotate_every": never})) == (
            "filter 'encrypt': setting 'rotate_every' must be a number of seconds, at least 1"
        )
    assert _refusal(_flag({"public_keys": {"k": str(public)}, "undecryptable": "x"})) == (
        "filter 'encrypt': setting 'undecryptable' must be pass or skip"
    )
    assert _refusal(_flag({"public_keys": {"k": str(public)}}, "deliver")) == (
        "filter 'encrypt': does nothing with direction 'deliver' (it has no hook, or no keys, "
        "for it)"
    )


# --- the Pulsar core ----------------------------------------------------------------


def test_a_send_goes_on_sealed_its_metadata_kept_and_a_client_encrypted_one_as_it_is(
    tmp_path: Path,
) -> None:
    public, private, _ = key_pair(tmp_path, "k")
    spec = _flag({"public_keys": {"k": str(public)}})
    core, rec = _core(FilterSpec(WORDS, direction="produce"), spec)
    out = core.receive_client(_send(0, [b"one", b"shout two", b"three"]), 1.0)
    (frame,) = sent(out, Peer.BROKER)
    assert frame.error is None  # the checksum made anew over the sealed section
    meta = frame.metadata
    assert meta is not None
    assert [k.key for k in meta.encryption_keys] == ["k"] and len(meta.encryption_param) == 12
    assert (meta.compression, meta.num_messages_in_batch, meta.producer_name) == (pb.LZ4, 3, "p")
    assert not meta.HasField("encryption_algo")
    # Encrypted after the message filter: its change is inside the ciphertext.
    opener = Encryption(EncryptionSettings(private_keys={"k": str(private)}))
    keys = [WrappedKey(k.key, k.value) for k in meta.encryption_keys]
    plaintext = opener.open(TOPIC, keys, meta.encryption_param, bytes(frame.payload))
    assert plaintext is not None
    clear = pb.MessageMetadata()
    clear.CopyFrom(meta)
    clear.ClearField("encryption_keys")
    clear.ClearField("encryption_param")
    body = pb.CommandSend(producer_id=1, sequence_id=0, num_messages=3)
    opened = encode_payload(command(T.SEND, body), clear, plaintext)
    assert [m.payload for m in messages(decode_frame(opened))] == [b"one", b"SHOUT TWO", b"three"]
    events = [(e.action, e.filter) for e in rec.of(Filtered)]
    assert events == [("replaced", WORDS), ("encrypted", "encrypt")]
    assert rec.of(Filtered)[-1].sent == frame.raw
    # What the client encrypted itself goes on byte for byte.
    meta_c = pb.MessageMetadata(producer_name="p", sequence_id=1, publish_time=1,
                                encryption_param=b"\0" * 12)  # fmt: skip
    meta_c.encryption_keys.add(key="theirs", value=b"wrapped")
    raw = encode_payload(command(T.SEND, pb.CommandSend(producer_id=1, sequence_id=1)), meta_c,
                         b"ciphertext")  # fmt: skip
    out = core.receive_client(raw, 1.1)
    assert b"".join(a.data for a in out if a.to is Peer.BROKER) == raw  # type: ignore[union-attr]


def test_a_delivery_is_opened_for_the_consumer_or_skipped_as_configured(tmp_path: Path) -> None:
    public, private, _ = key_pair(tmp_path, "k")
    sealer = Encryption(EncryptionSettings(public_keys={"k": str(public)}))
    plain = _message_frame([b"a", b"b"])
    frame = decode_frame(plain)
    assert frame.metadata is not None
    sealed = sealer.seal(TOPIC, bytes(frame.payload))
    meta = pb.MessageMetadata()
    meta.CopyFrom(frame.metadata)
    meta.encryption_keys.add(key="k", value=sealed.keys[0].value)
    meta.encryption_param = sealed.param
    assert frame.command is not None
    delivered = encode_payload(frame.command, meta, sealed.data)

    core, rec = _core(_flag({"private_keys": {"k": str(private)}}, "deliver"))
    (got,) = sent(core.receive_broker(delivered, 1.0), Peer.CLIENT)
    assert got.error is None and got.metadata is not None
    assert not got.metadata.encryption_keys and not got.metadata.HasField("encryption_param")
    assert [m.payload for m in messages(got)] == [b"a", b"b"]
    assert [e.action for e in rec.of(Filtered)] == ["decrypted"]

    _, wrong, _ = key_pair(tmp_path, "wrong")
    for undecryptable, to_client, to_broker in (("pass", [delivered], []),
                                                ("skip", [], ["ACK", "FLOW"])):  # fmt: skip
        settings = {"private_keys": {"k": str(wrong)}, "undecryptable": undecryptable}
        core, rec = _core(_flag(settings, "deliver"))
        out = core.receive_broker(delivered, 1.0)
        assert [f.raw for f in sent(out, Peer.CLIENT)] == to_client
        assert names(out, Peer.BROKER) == to_broker


def test_a_seal_that_fails_refuses_the_send_never_sends_plaintext(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    public, _, _ = key_pair(tmp_path, "k")
    spec = parse_flag(
        "encrypt:" + json.dumps({"direction": "produce", "on-error": "open",
                                 "settings": {"public_keys": {"k": str(public)}}})
    )  # fmt: skip
    core, rec = _core(spec)

    def broken(self: Encryption, topic: str, data: bytes) -> None:
        raise RuntimeError("no entropy")

    monkeypatch.setattr(Encryption, "seal", broken)
    out = core.receive_client(_send(0, [b"secret"]), 1.0)
    assert not sent(out, Peer.BROKER)
    (error,) = sent(out, Peer.CLIENT)
    assert error.name == "SEND_ERROR" and "filter encrypt failed" in error.body.message
    assert [(e.action, e.reason) for e in rec.of(Filtered)] == [
        ("error", "closed"),
        ("rejected", "filter_error"),
    ]


def _tiny_rsa_public_key(path: Path) -> None:
    """A 512-bit RSA public key: too small for OAEP to wrap a 32-byte data
    key (SHA-1 OAEP takes 42 bytes of the modulus for itself)."""
    tiny = rsa.RSAPublicNumbers(65537, (1 << 511) | 0x1234567).public_key()
    pem = tiny.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    path.write_bytes(pem)


def test_a_key_file_replaced_by_a_key_too_small_to_wrap_keeps_every_entry_decryptable(
    tmp_path: Path,
) -> None:
    public, _, key = key_pair(tmp_path, "k")
    current = tmp_path / "current.pub.pem"
    current.write_bytes(public.read_bytes())
    clock = Clock()
    f = Encryption(EncryptionSettings(public_keys={"k": str(current)}), clock=clock)
    before = f.seal(TOPIC, b"a").keys
    _tiny_rsa_public_key(current)
    clock.now += CHECK_EVERY
    for n in range(3):  # each entry opens with the key its metadata carries
        sealed = f.seal(TOPIC, b"entry %d" % n)
        assert sealed.keys == before  # the key read before stays in use
        data_key = key.decrypt(sealed.keys[0].value, OAEP)
        assert AESGCM(data_key).decrypt(sealed.param, sealed.data, None) == b"entry %d" % n
    raw, keys, _ = f.lease()  # and so does the compiled path's lease
    assert key.decrypt(keys[0].value, OAEP) == raw
    # At start, it is refused in one line.
    assert _refusal(_flag({"public_keys": {"k": str(current)}})) == (
        f"filter 'encrypt': key 'k' ({current}) holds a 512-bit RSA key, too small to wrap "
        "a data key (Pulsar's clients wrap with OAEP: at least 592 bits)"
    )


def test_bogus_wrapped_keys_in_deliveries_are_not_kept_whole(tmp_path: Path) -> None:
    """What did not unwrap is remembered (one private-key operation per
    bogus key), but not the bytes themselves: a producer writing large
    junk under a key name Sluice holds cannot fill its memory."""
    public, private, _ = key_pair(tmp_path, "k")
    sealed = Encryption(EncryptionSettings(public_keys={"k": str(public)})).seal(TOPIC, b"m")
    opener = Encryption(EncryptionSettings(private_keys={"k": str(private)}))
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        for n in range(40):
            junk = [WrappedKey("k", bytes([n]) * 1_000_000)]
            assert opener.open(TOPIC, junk, sealed.param, sealed.data) is None
        del junk
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert kept < 1_000_000  # 40 MB of junk came through
    assert opener.open(TOPIC, sealed.keys, sealed.param, sealed.data) == b"m"


# An EC public key on secp112r1, a curve the cryptography library does not take.
UNSUPPORTED_CURVE_KEY = b"""-----BEGIN PUBLIC KEY-----
MDIwEAYHKoZIzj0CAQYFK4EEAAYDHgAErOLeJcxOoVtZZHrYiT9guLoKck7KD6ia
ha3+3Q==
-----END PUBLIC KEY-----
"""


def test_a_key_file_replaced_by_a_key_on_an_unsupported_curve_keeps_the_key_before(
    tmp_path: Path,
) -> None:
    first, _, first_key = key_pair(tmp_path, "first")
    second, _, _ = key_pair(tmp_path, "second")
    third, _, third_key = key_pair(tmp_path, "third")
    one, two = tmp_path / "one.pub.pem", tmp_path / "two.pub.pem"
    one.write_bytes(first.read_bytes())
    two.write_bytes(second.read_bytes())
    clock = Clock()
    settings = EncryptionSettings(public_keys={"one": str(one), "two": str(two)})
    f = Encryption(settings, clock=clock)
    f.seal(TOPIC, b"a")
    one.write_bytes(UNSUPPORTED_CURVE_KEY)  # unusable: the key before stays in use
    two.write_bytes(third.read_bytes())  # changed in the same look: taken
    clock.now += CHECK_EVERY
    sealed = f.seal(TOPIC, b"b")
    for wrapped, key in zip(sealed.keys, (first_key, third_key), strict=True):
        data_key = key.decrypt(wrapped.value, OAEP)
        assert AESGCM(data_key).decrypt(sealed.param, sealed.data, None) == b"b"
    assert _refusal(_flag({"public_keys": {"k": str(one)}})) == (
        f"filter 'encrypt': key 'k' ({one}) holds a key that cannot be used: "
        "Curve 1.3.132.0.6 is not supported"
    )


def test_two_encrypt_filters_on_one_topic_are_said(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Only the first of two encrypt filters naming a topic acts on it (an
    entry is encrypted once): the second's recipients could not decrypt, so
    the proxy says so, once, naming both; disjoint topics say nothing."""
    one, _, _ = key_pair(tmp_path, "one")
    two, _, _ = key_pair(tmp_path, "two")

    def spec(topics: list[str], public: Path, name: str) -> FilterSpec:
        return parse_flag("encrypt:" + json.dumps(
            {"label": name, "topics": topics, "settings": {"public_keys": {name: str(public)}}}
        ))  # fmt: skip

    filters = make_filters(
        [spec(["persistent://acme/pay/*"], one, "all-pay"),
         spec(["persistent://acme/pay/cards"], two, "cards"),
         spec(["persistent://acme/other/*"], two, "other")],
        registry.get("pulsar"),
    )  # fmt: skip
    with caplog.at_level("WARNING", logger="sluice.filters"):
        chain = filters.chain("persistent://acme/pay/cards", PRODUCE, None)
        assert chain is not None and chain.sealer is not None and chain.sealer[0] == "all-pay"
        filters.chain("persistent://acme/pay/cards", PRODUCE, None)  # made once
        filters.chain("persistent://acme/pay/loans", PRODUCE, None)
        filters.chain("persistent://acme/other/x", PRODUCE, None)
    said = [r.getMessage() for r in caplog.records]
    assert said == [
        "filters 'all-pay', 'cards' all encrypt what is produced to "
        "persistent://acme/pay/cards; only 'all-pay' acts on it: put every key in one filter"
    ], said
