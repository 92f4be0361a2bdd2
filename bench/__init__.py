"""Benchmarks (see bench/README.md). A package, so that the scripts and the
tests that check their arithmetic name each module one way (bench.peers)."""
