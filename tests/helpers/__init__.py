"""Helpers the tests share: brokers scripted here, processes the tests start,
Hypothesis strategies and the wire contract. No tests live here."""
