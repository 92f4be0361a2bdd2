"""Coverage-guided fuzzing (atheris) of the codecs and the proxy-mode core.

Each ``fuzz_<name>.py`` is a harness: importable, with ``TestOneInput(data)``
that raises only when it finds a bug. ``runner.py`` runs one under atheris;
``corpus/<name>/`` holds its seeds (made by ``make_corpus.py`` from real
traffic). ``test_fuzz_short.py`` is the short run in ``./dev test``,
``bench/fuzz.py`` the long one. An input that found a bug is kept in
``crashes/<name>/`` and, with a test of its own, in
``test_fuzz_regressions.py``.
"""
