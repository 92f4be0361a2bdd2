"""Coverage-guided fuzzing (atheris) of the codecs and the proxy-mode core.

Each ``fuzz_<name>.py`` is a harness: importable, with ``TestOneInput(data)``
that raises only when it finds a bug. ``runner.py`` runs one under atheris;
``corpus/<name>/`` holds its seeds (made by ``make_corpus.py`` from real
recordings). ``bench/fuzz.py`` is the long run, ``test_fuzz_short.py`` the
short one in ``./dev test``.
"""
