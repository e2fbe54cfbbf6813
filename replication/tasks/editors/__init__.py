"""The built-in editor steps; importing this package registers every one of them.

Each module holds one family of steps and registers them with ``@step(name, Options)``
from ``replication.tasks.steps``.
"""

from __future__ import annotations

import importlib
import pkgutil

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
