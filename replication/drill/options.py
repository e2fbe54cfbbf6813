"""What a drill is asked to do, checked before anything starts.

Two places to run it: the embedded brokers (no connection strings: the drill starts them,
flips an alias it serves or a file it writes, and may kill the primary's process), or two
namespaces given by connection string (the drill flips the file, or runs the operator's
command for a real alias; it cannot kill a namespace it does not run).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ..failover.runtime import DEFAULT_FAILURES

Mode = Literal["kill", "flip"]
Via = Literal["dns", "file"]

DEFAULT_PIPELINE = "orders-to-secondary"
DEFAULT_RECHECK_INTERVAL = 5.0
"""The producer's re-check interval in the drill (the pipelines' default is 30 s)."""


class DrillError(ValueError):
    """The drill cannot run as asked; the message says what to change."""


@dataclass(frozen=True, slots=True)
class DrillOptions:
    mode: Mode = "kill"
    rate: float = 20.0
    """Messages a second the producer sends."""
    duration: float = 30.0
    """Seconds of producing."""
    flip_after: float = 12.0
    """Seconds from the start to the flip (or the kill). A flip is seen at the producer's
    next re-check (every ``recheck_interval`` s from its first resolution, just before the
    start): 12 s falls 3 s before one with the default 5 s, not right after it."""
    pipelines_file: Path = Path("pipelines.yaml")
    pipeline: str = DEFAULT_PIPELINE
    via: Via = "dns"
    """Embedded: where the producer resolves the namespace (an alias the drill serves, or a
    file it writes)."""
    primary: str | None = None
    """A connection string: run against namespaces that exist (with ``secondary``)."""
    secondary: str | None = None
    alias: str | None = None
    """Given namespaces: the CNAME alias the producer resolves."""
    nameserver: str | None = None
    file: str | None = None
    """Given namespaces: the failover file (the drill writes it unless ``flip_command``)."""
    flip_command: str | None = None
    """Given namespaces: a shell command that flips the alias or file to the secondary."""
    recheck_interval: float = DEFAULT_RECHECK_INTERVAL
    failures: int = DEFAULT_FAILURES
    dns_ttl: int = 1
    """Embedded DNS: the TTL of the records the drill serves."""
    settle: float = 15.0
    """Seconds at most to wait, after producing, for the secondary to catch up."""
    replicate: bool = True
    """Run the pipeline's replication in the drill (False: something else runs it)."""
    data_dir: Path | None = None
    """Embedded: where the brokers keep their data (kept); None: a temporary folder."""

    @property
    def embedded(self) -> bool:
        return self.primary is None

    def check(self) -> DrillOptions:
        """Itself when it can run; ``DrillError`` naming the option to change otherwise."""
        if self.rate <= 0:
            raise DrillError("--rate must be more than 0 messages a second")
        if self.duration <= 0:
            raise DrillError("--duration must be more than 0 seconds")
        if not 0 < self.flip_after < self.duration:
            raise DrillError(
                f"--flip-after ({self.flip_after:g}) must be between 0 and --duration "
                f"({self.duration:g}): the producer runs before and after the flip"
            )
        if self.recheck_interval <= 0 or self.failures < 1 or self.settle < 0:
            raise DrillError("--recheck-interval, --failures and --settle must be positive")
        if (self.primary is None) != (self.secondary is None):
            raise DrillError("give both --primary and --secondary (or neither: embedded brokers)")
        if self.embedded:
            given = [f"--{n}" for n in ("alias", "file", "flip-command") if self._given(n)]
            if given:
                raise DrillError(
                    f"{', '.join(given)}: only with --primary/--secondary (the embedded drill "
                    "serves its own alias or file: --via dns|file)"
                )
            return self
        if self.mode == "kill":
            raise DrillError(
                "--mode kill needs the embedded brokers (it kills the primary's process); "
                "against namespaces of your own use --mode flip"
            )
        if (self.alias is None) == (self.file is None):
            raise DrillError("give --alias or --file: where the producer finds the namespace")
        if self.alias is not None and self.flip_command is None:
            raise DrillError(
                "--alias needs --flip-command: the drill cannot change your DNS zone, give the "
                "command that points the alias at the secondary (e.g. az network dns ...)"
            )
        url = (self.file or "").lower().startswith(("http://", "https://"))
        if url and self.flip_command is None:
            raise DrillError(
                "--file is a URL: give --flip-command, the command that changes what it serves"
            )
        if self.data_dir is not None:
            raise DrillError("--data-dir is for the embedded brokers")
        return self

    def _given(self, name: str) -> bool:
        return getattr(self, name.replace("-", "_")) is not None
