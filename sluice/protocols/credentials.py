"""Names whose values are credentials, protocol-neutral.

A JSON key, a query parameter or a form field named like this holds a
secret: its value is kept out of recordings (``protocols/http/recorded.py``)
and out of the messages Sluice writes itself (a schema filter's refusal
names the field, not its value). Narrower than for headers: Pulsar's own
names (``authoritative``, a message's ``key``, ``keySharedMode``) are no
secrets.
"""

from __future__ import annotations

import re

_CREDENTIAL_NAME = re.compile(
    r"token|passw|passphrase|pwd|secret|credential|cookie|session|jwt|signature|bearer|"
    r"api[-_]?key|private[-_]?key|access[-_]?key|^auth(?!oritative)|authdata|authorization|"
    # Pulsar's client credentials in a broker's config (dynamic config:
    # brokerClientAuthenticationParameters, bookkeeperClientAuthParams …)
    r"authenticationparam|authparam",
    re.IGNORECASE,
)


def names_a_credential(name: str) -> bool:
    """Whether a key, parameter or field called ``name`` holds a credential."""
    return bool(_CREDENTIAL_NAME.search(name))
