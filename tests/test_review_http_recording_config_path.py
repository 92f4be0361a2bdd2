"""Review: a broker's client credential set by path is left out of the
recorded path however the client spells the path.

``redact_target`` (sluice/protocols/http/recorded.py) looks for
``/admin/v2/brokers/configuration/{name}/{value}`` in the target's bytes
as they came; the broker's web server decodes percent-escapes and removes
dot segments before it routes, so a path spelled otherwise sets the same
config while its value is recorded in the clear. No process is started.
"""

from __future__ import annotations

import pytest

from sluice.protocols.http.recorded import MARKER, redact_target

SECRET = "review-config-path-secret-0073"
NAME = "brokerClientAuthenticationParameters"
TARGETS = [
    f"/admin/v2/brokers/configur%61tion/{NAME}/token:{SECRET}",
    f"/admin/v2/brokers/./configuration/{NAME}/token:{SECRET}",
    f"/admin/v2/x/../brokers/configuration/{NAME}/token:{SECRET}",
]


@pytest.mark.parametrize("target", TARGETS)
def test_a_credential_set_by_an_odd_spelling_of_the_path_is_redacted(target: str) -> None:
    shown = redact_target(target.encode())
    assert SECRET not in shown
    assert MARKER in shown


def test_an_absolute_url_keeps_its_authority() -> None:
    shown = redact_target(
        f"http://u:p@broker:8080/admin/v2/brokers/./configuration/{NAME}/{SECRET}"
    )
    assert shown == f"http://{MARKER}@broker:8080/admin/v2/brokers/configuration/{NAME}/{MARKER}"


def test_another_config_value_is_kept() -> None:
    target = "/admin/v2/brokers/configur%61tion/loadBalancerEnabled/false"
    assert redact_target(target.encode()) == target
