import subprocess
import sys

from replication import __version__


def test_version_is_printed() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "replication", "--version"], capture_output=True, text=True
    )
    assert result.returncode == 0
    assert __version__ in result.stdout


def test_start_runs_the_demo_moving_real_messages() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "replication", "start", "--count", "50"],
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "received 50/50" in result.stdout
    assert "50 messages sent, accepted, received and settled" in result.stdout
