"""Toy: a third protocol, known to Sluice only through its registry entry.

A frame is ``[u32 length][u32 CRC-32 of the body][body]``, the body a text
line: ``GET key`` or ``PUT key value``, answered ``OK [value]``, ``ERR code``
or ``MOVED host:port`` (a redirect). ``codec.py``, ``core.py`` and ``spec.py``
are sans-I/O; ``io.py`` is the I/O half (backend, recorder, replay, serve).
"""
