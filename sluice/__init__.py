"""Sluice: a protocol-aware proxy and traffic recorder for Apache Pulsar."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("sluice")
except PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"
