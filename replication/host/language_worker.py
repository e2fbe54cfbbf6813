"""``python -m replication.host.language_worker``: the worker process of the local host.

What the Python language worker does for the Functions host, over ``channel.py``: imports
``function_app.py`` (``--app``) and indexes its functions, says ``ready`` with their names,
then runs each invocation the host sends on its ``worker.Worker`` (binding data decoded
there) and answers with the function's error, if any, and the metrics it counted
(``relay.py``). The settlement client is the extension's, pointed at the host by the
command line (``--host``, ``--port``, ``--functions-grpc-max-message-length``). The app
settings are in the environment, as the host put them. It ends when the host closes the
channel (or dies).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import socket
import sys
from pathlib import Path
from typing import Any

from ..gc_tuning import collect_garbage_for_throughput
from .channel import read_frame, write_frame
from .invocation import Invocation
from .relay import Relay
from .settings import function_log_level
from .worker import Worker

log = logging.getLogger("replication.worker")


def functions(app_path: Path) -> dict[str, Any]:
    """The app's Service Bus, Event Hubs and timer triggers by function name, found as the
    host finds them (transactional pipelines are the host's: ``pumped_by_host``)."""
    from ..functions import pumped_by_host
    from .discovery import load_app, service_bus_triggers
    from .eventhubs import event_hub_triggers
    from .timer import timer_triggers

    with pumped_by_host():
        app = load_app(app_path)
    settings = dict(os.environ)
    found: list[Any] = [
        *service_bus_triggers(app, settings),
        *event_hub_triggers(app, settings),
        *timer_triggers(app, settings),
    ]
    return {trigger.name: trigger for trigger in found}


async def serve(app_path: Path, channel: socket.socket, settlement: list[str]) -> None:
    triggers = functions(app_path)
    collect_garbage_for_throughput()  # the app is imported: what moves messages is young
    worker = Worker(settlement=settlement)
    relay = Relay({name: trigger.function for name, trigger in triggers.items()})
    reader, writer = await asyncio.open_connection(sock=channel)
    write_frame(writer, ("ready", sorted(triggers)))
    running: set[asyncio.Task[None]] = set()

    async def run(number: int, invocation: Invocation) -> None:
        error = None
        try:
            await worker.invoke(triggers[invocation.function], invocation)
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            # the stack, as Functions logs it; the host logs the outcome of the batch
            log.error("%s failed", invocation.function, exc_info=exc)
        write_frame(writer, ("done", number, error, relay.take()))

    try:
        while True:
            try:
                _, number, invocation = await read_frame(reader)
            except EOFError:
                return
            task = asyncio.create_task(run(number, invocation))
            running.add(task)
            task.add_done_callback(running.discard)
    finally:
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)
        # the senders' connections end with this process: closing them politely would wait
        # for brokers the host embeds, whose loop waits for this process to end
        worker.stop(close_senders=False)
        writer.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="replication.host.language_worker")
    parser.add_argument("--app", type=Path, required=True, help="the function_app.py")
    parser.add_argument("--channel", type=int, required=True, help="the channel's descriptor")
    parser.add_argument("--host", required=True, help="the settlement service's address")
    parser.add_argument("--port", required=True)
    parser.add_argument("--functions-grpc-max-message-length", required=True)
    args = parser.parse_args(argv)
    level = function_log_level(args.app.parent)
    logging.basicConfig(level=level, format="worker %(process)d: %(message)s")
    # the extension's decoder (uamqp) says several lines a message at INFO
    logging.getLogger("uamqp").setLevel(max(level, logging.WARNING))
    settlement = [
        "--host",
        args.host,
        "--port",
        args.port,
        "--functions-grpc-max-message-length",
        args.functions_grpc_max_message_length,
    ]
    channel = socket.socket(fileno=args.channel)
    asyncio.run(serve(args.app, channel, settlement))


if __name__ == "__main__":
    main(sys.argv[1:])
