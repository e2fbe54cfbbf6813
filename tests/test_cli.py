import subprocess
import sys

from replication import __version__


def test_version_is_printed() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "replication", "--version"], capture_output=True, text=True
    )
    assert result.returncode == 0
    assert __version__ in result.stdout
