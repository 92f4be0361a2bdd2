"""The --config file watch (``server._watch_files``) on a clock the test
moves: a file written in place is read once it has stopped changing, and
a refused reload is tried again for a while (a Kubernetes Secret the new
ConfigMap names is mounted up to a minute after it). No process."""

from __future__ import annotations

from pathlib import Path

import trio
from trio.testing import MockClock

from sluice.proxy import server
from sluice.proxy.reload import Generation, Outcome


class Watched:
    """A proxy as the watch sees it: each reload reads the config file, and
    is refused while ``needs`` (a key file the config names) is missing."""

    def __init__(self, config: Path, needs: Path | None = None) -> None:
        self.config = config
        self.needs = needs
        self.read: list[str] = []
        self.outcomes: list[str] = []

    async def reload_from_source(self, source: str) -> Outcome:
        self.read.append(self.config.read_text())
        generation = Generation(1, 0.0, source)
        if self.needs is not None and not self.needs.exists():
            outcome = Outcome.refused(generation, source, [f"{self.needs}: no such file"])
        else:
            outcome = Outcome("applied", generation)
        self.outcomes.append(outcome.outcome)
        return outcome

    def watched(self) -> list[Path]:
        return []


def test_a_file_written_in_place_is_read_once_it_stops_changing(tmp_path: Path) -> None:
    config = tmp_path / "sluice.toml"
    config.write_text("# the first\n")
    proxy = Watched(config)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(server._watch_files, proxy, config)
            await trio.sleep(1.9)
            config.write_text("")  # truncated: an editor writing in place
            await trio.sleep(0.3)  # the watch looked in between (at 2 s)
            config.write_text("[proxy]\nmax-connections = 5\n")
            await trio.sleep(10)
            nursery.cancel_scope.cancel()

    trio.run(main, clock=MockClock(autojump_threshold=0))
    # Before: the empty file was reloaded (every setting back to its default).
    assert proxy.read == ["[proxy]\nmax-connections = 5\n"]


def test_a_refused_reload_is_tried_again_until_the_file_it_needs_is_there(
    tmp_path: Path,
) -> None:
    config = tmp_path / "sluice.toml"
    config.write_text("# the first\n")
    key = tmp_path / "secret.key"
    proxy = Watched(config, needs=key)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(server._watch_files, proxy, config)
            await trio.sleep(1)
            config.write_text("[proxy]\nauth-token-secret-key = 'secret.key'\n")
            await trio.sleep(20)  # the Secret comes after the ConfigMap
            key.write_bytes(b"k" * 32)
            await trio.sleep(300)
            nursery.cancel_scope.cancel()

    trio.run(main, clock=MockClock(autojump_threshold=0))
    assert proxy.outcomes[0] == "refused" and proxy.outcomes[-1] == "applied", proxy.outcomes
    assert proxy.outcomes.count("applied") == 1  # then no more tries


def test_a_reload_refused_for_good_is_tried_a_few_times_then_left(tmp_path: Path) -> None:
    config = tmp_path / "sluice.toml"
    config.write_text("# the first\n")
    proxy = Watched(config, needs=tmp_path / "never")

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(server._watch_files, proxy, config)
            await trio.sleep(1)
            config.write_text("[proxy]\nbroken = true\n")
            await trio.sleep(3600)
            nursery.cancel_scope.cancel()

    trio.run(main, clock=MockClock(autojump_threshold=0))
    assert proxy.outcomes == ["refused"] * (1 + len(server.RETRY_REFUSED))
