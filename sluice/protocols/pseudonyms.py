"""Deterministic pseudonyms for what a capture must not carry out of the
company: tenants, namespaces, topics, producer, subscription and consumer
names, roles, message keys, hosts and addresses, and the properties chosen
by pattern (``sluice record anonymize``).

Protocol-neutral and sans-I/O: a protocol's anonymizer says what kind each
of its fields is and asks ``Pseudonyms`` for the stand-in; the recording's
own fields (addresses, URLs, free text) go through the same table.

A pseudonym is a keyed hash (HMAC-SHA256) of the original and its kind, so
the same original always gets the same pseudonym under the same key (two
captures anonymized with one key can be compared), and without the key a
pseudonym cannot be checked against a guess. The shape stays: a topic
stays ``domain://tenant/namespace/local[-partition-N]``, an IPv4 address an
IPv4 address, a host name a host name, a URL a URL with its scheme and port,
so every reader takes the result as it took the original.

Free text (error messages, schema names, HTTP paths) cannot be parsed for
names: every original the table holds is replaced wherever it occurs in it
(longest first). Which originals the table holds depends on what was seen,
so the caller runs every record through once before writing anything
(``sluice/recording/anonymize.py`` does).
"""

from __future__ import annotations

import fnmatch
import hashlib
import hmac
import ipaddress
import re
import urllib.parse
from collections.abc import Iterable

from sluice.addresses import is_ip

# What a pseudonym stands for, and the word its pseudonym starts with.
PREFIXES = {
    "tenant": "tenant",
    "namespace": "ns",
    "topic": "topic",
    "producer": "producer",
    "subscription": "sub",
    "consumer": "consumer",
    "role": "role",
    "key": "key",
    "cluster": "cluster",
    "name": "name",
    "property": "prop",
    "value": "value",
    "host": "host",
}
# Originals shorter than this are not looked for in free text, where they
# would take letters out of every other word.
SCRUB_MIN = 3
_PARTITION = re.compile(r"^(.*)(-partition-\d+)$")
# An IPv4 address in free text (not a piece of a longer dotted number).
_IPV4 = r"(?<![\d.])(?:\d{1,3}\.){3}\d{1,3}(?!\d|\.\d)"


class Pseudonyms:
    """The table of originals and their pseudonyms, made under ``key``.

    ``property_values``: globs of the property keys whose values are
    replaced (default every one); ``property_keys``: globs of the keys that
    are replaced themselves too."""

    def __init__(
        self,
        key: bytes,
        property_values: Iterable[str] = ("*",),
        property_keys: Iterable[str] = (),
    ) -> None:
        self._key = key
        self.property_values = tuple(property_values)
        self.property_keys = tuple(property_keys)
        self.table: dict[str, dict[str, str]] = {}  # kind -> original -> pseudonym
        # While the caller only learns the originals (its first read), free
        # text is not scrubbed: the pattern would be built again for every
        # original added, the square of a capture's names in all.
        self.learning = False
        self._scrub: re.Pattern[str] | None = None
        self._scrubbed: dict[str, str] = {}
        self._scrub_size = -1

    # --- one original ------------------------------------------------------------

    def _hash(self, kind: str, original: str, size: int = 8) -> str:
        # (surrogateescape: a name read from bytes that are not UTF-8, a file's)
        text = f"{kind}\0{original}".encode(errors="surrogateescape")
        digest = hmac.new(self._key, text, hashlib.sha256)
        return digest.hexdigest()[:size]

    def _keep(self, kind: str, original: str, pseudonym: str) -> str:
        self.table.setdefault(kind, {})[original] = pseudonym
        return pseudonym

    def name(self, kind: str, original: str) -> str:
        """A name of ``kind`` (a key of ``PREFIXES``): ``prefix-<hash>``."""
        if not original:
            return original
        found = self.table.get(kind, {}).get(original)
        if found is not None:
            return found
        return self._keep(kind, original, f"{PREFIXES[kind]}-{self._hash(kind, original)}")

    def topic(self, original: str) -> str:
        """``domain://tenant/namespace/local[-partition-N]`` with each part
        replaced (a name without a domain: its parts as they come)."""
        if not original:
            return original
        found = self.table.get("topic", {}).get(original)
        if found is not None:
            return found
        domain, sep, rest = original.partition("://")
        if not sep:
            domain, rest = "", original
        parts = rest.split("/")
        local = parts[-1]
        partition = ""
        matched = _PARTITION.match(local)
        if matched:
            local, partition = matched.group(1), matched.group(2)
        new = [self.name("topic", local) + partition]
        if len(parts) >= 2:
            new.insert(0, self.name("namespace", parts[-2]))
        if len(parts) >= 3:
            new.insert(0, self.name("tenant", parts[0]))
            if len(parts) > 3:  # an old topic name with its cluster
                new[1:1] = [self.name("cluster", p) for p in parts[1:-2]]
        text = "/".join(new)
        if domain:
            text = f"{domain}://{text}"
        return self._keep("topic", original, text)

    def namespace(self, original: str) -> str:
        """``tenant/namespace`` (or a bare namespace, or the v1 API's
        ``property/cluster/namespace``) with each part replaced, as in a
        topic's name."""
        if not original:
            return original
        *tenants, namespace = original.split("/")
        parts = [self.name("tenant", t) for t in tenants[:1]]
        parts += [self.name("cluster", c) for c in tenants[1:]]
        return "/".join([*parts, self.name("namespace", namespace)])

    def host(self, original: str) -> str:
        """An IP address as another of its family (IPv4 in 10.0.0.0/8,
        IPv6 in fd00::/8), a host name as ``host-<hash>.invalid``."""
        if not original:
            return original
        found = self.table.get("host", {}).get(original)
        if found is not None:
            return found
        bare = original.strip("[]")
        try:
            ip = ipaddress.ip_address(bare)
        except ValueError:
            new = f"host-{self._hash('host', original.lower())}.invalid"
        else:
            digest = bytes.fromhex(self._hash("host", str(ip), 32))
            if ip.version == 4:
                new = str(ipaddress.IPv4Address(bytes((10,)) + digest[:3]))
            else:
                new = str(ipaddress.IPv6Address(bytes((0xFD,)) + digest[:15]))
            if original.startswith("["):
                new = f"[{new}]"
        return self._keep("host", original, new)

    def address(self, original: str) -> str:
        """``host:port`` (or a bare host) with the host replaced."""
        if not original:
            return original
        host, sep, port = original.rpartition(":")
        if not sep or not port.isdigit() or (host.count(":") and not host.startswith("[")):
            return self.host(original)  # no port (or a bare IPv6 address)
        return f"{self.host(host)}:{port}"

    def url(self, original: str) -> str:
        """A URL (or ``host:port``) with its host replaced; a list of them,
        comma-separated, each."""
        if not original:
            return original
        if "," in original:
            return ",".join(self.url(u.strip()) for u in original.split(","))
        if "://" not in original:
            return self.address(original)
        try:
            parts = urllib.parse.urlsplit(original)
        except ValueError:  # not a URL (a bracketed host that is no IPv6 address): all of it
            return self.name("host", original)
        netloc = parts.netloc.rpartition("@")[2]  # no user information is kept
        path = self.scrub(parts.path) if parts.path else ""
        return urllib.parse.urlunsplit((parts.scheme, self.address(netloc), path, "", ""))

    def prop(self, key: str, value: str) -> tuple[str, str]:
        """A property: its value replaced when its key matches one of
        ``property_values``, its key when it matches ``property_keys``."""
        new_value = value
        if any(fnmatch.fnmatchcase(key, p) for p in self.property_values):
            new_value = self.name("value", value)
        if any(fnmatch.fnmatchcase(key, p) for p in self.property_keys):
            key = self.name("property", key)
        return key, new_value

    # --- free text ---------------------------------------------------------------

    def scrub(self, text: str) -> str:
        """``text`` with every original the table holds (of at least
        ``SCRUB_MIN`` characters) replaced by its pseudonym, longest first:
        for text no field says the kind of."""
        if not text:
            return text
        if self.learning:  # only the addresses it holds, to be in the table
            for found in re.finditer(_IPV4, text):
                if is_ip(found.group(0)):
                    self.host(found.group(0))
            return text
        return self._pattern().sub(self._replacement, text)

    def _replacement(self, found: re.Match[str]) -> str:
        text = found.group(0)
        known = self._scrubbed.get(text)
        if known is not None:
            return known
        # An IPv4 address no field named (a header's, an error message's).
        return self.host(text) if is_ip(text) else text

    def scrub_bytes(self, data: bytes) -> bytes:
        """Text in bytes scrubbed; bytes that are not UTF-8 stay as they are."""
        try:
            text = data.decode()
        except UnicodeDecodeError:
            return data
        return self.scrub(text).encode()

    def _pattern(self) -> re.Pattern[str]:
        size = sum(len(t) for t in self.table.values())
        if size != self._scrub_size:
            self._scrub_size = size
            pairs: dict[str, str] = {}
            for entries in self.table.values():
                for original, pseudonym in entries.items():
                    if len(original) >= SCRUB_MIN:
                        pairs.setdefault(original, pseudonym)
            # A pseudonym already in the text stays as it is: matched as
            # itself (the longest alternative first), it is never searched
            # for originals (a tenant "tenant" in "tenant-84b4aa79", or a
            # value "973" in "ns-d7b973a2", made it another name).
            for entries in self.table.values():
                for pseudonym in entries.values():
                    pairs.setdefault(pseudonym, pseudonym)
            self._scrubbed = pairs
            ordered = sorted(pairs, key=len, reverse=True)
            # Any IPv4 address first (one in the table takes its pseudonym,
            # a pseudonym stays), so that an original address is never
            # taken out of a longer one.
            self._scrub = re.compile("|".join([_IPV4, *map(re.escape, ordered)]))
        assert self._scrub is not None
        return self._scrub

    def originals(self) -> list[str]:
        """Every original the table holds."""
        return [o for entries in self.table.values() for o in entries]

    def report(self, reveal: bool = False) -> dict[str, object]:
        """How many originals of each kind were replaced, and the pseudonyms;
        with ``reveal`` the originals too (original -> pseudonym)."""
        out: dict[str, object] = {
            "replaced": {kind: len(entries) for kind, entries in sorted(self.table.items())},
            "pseudonyms": {
                kind: sorted(set(entries.values())) for kind, entries in sorted(self.table.items())
            },
        }
        if reveal:
            out["originals"] = {kind: dict(entries) for kind, entries in sorted(self.table.items())}
        return out
