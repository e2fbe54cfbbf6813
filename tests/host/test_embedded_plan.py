"""What the local host's embedded brokers are given: every entity a pipeline can reach."""

from __future__ import annotations

from replication.broker.config import parse_config
from replication.host.embedded import plan_brokers
from replication.pipeline import parse_pipelines

LOCAL = (
    "Endpoint=sb://localhost:{};SharedAccessKeyName=RootManageSharedAccessKey;"
    "SharedAccessKey=SAS_KEY_VALUE;UseDevelopmentEmulator=true;"
)


def test_a_steps_own_error_target_gets_its_queue() -> None:
    settings = {"Near": LOCAL.format(5711), "Far": LOCAL.format(5712)}
    pipelines = parse_pipelines("""\
pipelines:
  - name: checked
    source: {connection: Near, queue: incoming}
    steps:
      - transcode:
          from: json
          to: json
          on_error: route
          error_target: {connection: Far, queue: bad-json}
    target: {connection: Far, queue: outgoing}
    error_target: {connection: Far, queue: errors}
""")  # fmt: skip
    plan = plan_brokers(pipelines.pipelines, settings)
    far = parse_config(plan[5712].config())
    assert sorted(q.name for q in far.namespace.queues) == ["bad-json", "errors", "outgoing"]
