"""A web dashboard for the local host and the broker: pipelines, entities, messages, dead letters.

``python -m replication start`` serves it on its metrics port (``/``; ``--no-ui``: not),
``python -m replication broker --ui`` on the broker's HTTP port. See ``app.py`` for the paths.
"""

from .app import Dashboard
from .namespace import Namespace
from .pipelines import PipelineBoard

__all__ = ["Dashboard", "Namespace", "PipelineBoard"]
