"""``Pseudonyms``, the table ``sluice record anonymize`` replaces names
with: the shapes of the names it is given, without a broker or a file."""

from __future__ import annotations

from sluice.protocols.pseudonyms import Pseudonyms

KEY = b"k" * 32


def test_a_v1_topic_keeps_its_property_and_namespace() -> None:
    """A v1 topic (``property/cluster/namespace/topic``) took its cluster's
    pseudonym for its tenant and lost its property, so two properties'
    topics of one cluster, namespace and name became one topic; and a v1
    namespace (``property/cluster/namespace``) became ``cluster/namespace``."""
    names = Pseudonyms(KEY)
    one = names.topic("persistent://initech/uswest/labs/orders")
    other = names.topic("persistent://globex/uswest/labs/orders")
    assert one != other
    tenant, cluster, namespace, local = one.split("://")[1].split("/")
    assert tenant == names.name("tenant", "initech")
    assert cluster == names.name("cluster", "uswest")
    assert namespace == names.name("namespace", "labs")
    assert local == names.name("topic", "orders")
    assert names.namespace("initech/uswest/labs") == f"{tenant}/{cluster}/{namespace}"
    # The v2 shapes as they were.
    v2 = names.topic("persistent://initech/labs/orders-partition-3")
    assert v2 == f"persistent://{tenant}/{namespace}/{local}-partition-3"
    assert names.namespace("initech/labs") == f"{tenant}/{namespace}"
    assert names.namespace("labs") == namespace
