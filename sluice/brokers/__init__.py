"""Test brokers Sluice can start: Apache Pulsar itself (pulsar-lite lives in sluice.embedded)."""
