"""The ``python -m replication`` command line; each subcommand imports its layer lazily."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import __version__


def _start(args: argparse.Namespace, rest: list[str]) -> int:
    from .host.main import run_start

    return run_start(args)


def _peek(args: argparse.Namespace, rest: list[str]) -> int:
    from .host.main import run_peek

    return run_peek(args)


def _broker(args: argparse.Namespace, rest: list[str]) -> int:
    from .broker.main import run

    if not args.ui:
        if args.ui_token is not None:
            print("error: --ui-token needs --ui", file=sys.stderr)
            return 2
        return run(args)
    import functools

    from .compose import serve_dashboard  # the dashboard's imports only when it is asked for
    from .dashboard.ui_token import parse

    if args.ui_token is not None:
        try:
            parse(args.ui_token)
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    return run(args, services=[functools.partial(serve_dashboard, ui_token=args.ui_token)])


def _drill(args: argparse.Namespace, rest: list[str]) -> int:
    from .drill.main import run

    return run(args)


def _read_settings(args: argparse.Namespace) -> dict[str, str] | None:
    """``--settings FILE`` (local.settings.json's ``Values``, or a flat JSON mapping) and/or
    ``--env`` (the environment); None when neither was given (settings are not checked)."""
    import json
    import os

    if args.settings is None and not args.env:
        return None
    settings: dict[str, str] = dict(os.environ) if args.env else {}
    if args.settings is not None:
        document = json.loads(Path(args.settings).read_text(encoding="utf-8-sig"))
        values = document.get("Values", document) if isinstance(document, dict) else None
        if not isinstance(values, dict):
            raise ValueError(f"{args.settings}: expected a JSON object (with 'Values')")
        settings.update({str(k): str(v) for k, v in values.items() if v is not None})
    return settings


def _importable(path: Path) -> None:
    """Steps may name Python callables next to the pipeline file (as in function_app.py)."""
    folder = str(path.resolve().parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)


def _validate(args: argparse.Namespace, rest: list[str]) -> int:
    from .pipeline import PipelineConfigError, load_pipelines

    path = Path(args.file)
    _importable(path)
    try:
        settings = _read_settings(args)
        loaded = load_pipelines(path, settings=settings)
    except PipelineConfigError as exc:
        print(exc, file=sys.stderr)
        count = len(exc.problems)
        print(f"{path}: {count} problem{'s' if count != 1 else ''}", file=sys.stderr)
        return 1
    except (OSError, ValueError) as exc:
        print(f"cannot read the settings: {exc}", file=sys.stderr)
        return 1
    for pipeline in loaded.pipelines:
        functions = ", ".join(pipeline.function_names())
        print(f"{pipeline.describe()} [function {functions}]")
    from .host.checks import event_hub_warnings, settlement_warnings, transactional_warnings

    warnings = transactional_warnings(loaded) + event_hub_warnings(loaded)
    warnings += settlement_warnings(loaded, path.resolve().parent, settings or {})
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)
    count = len(loaded.pipelines)
    print(f"{path}: {count} pipeline{'s' if count != 1 else ''} OK")
    return 0


def _schema(args: argparse.Namespace, rest: list[str]) -> int:
    import json

    from .pipeline import json_schema

    if args.markdown:
        from .pipeline.reference import markdown_reference

        text = markdown_reference(json_schema())
    else:
        text = json.dumps(json_schema(), indent=2) + "\n"
    if args.output:
        Path(args.output).write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return 0


def _test(args: argparse.Namespace, rest: list[str]) -> int:
    from .pipeline import PipelineConfigError
    from .pipeline.testing import find_test_files, run_test_file

    files = [f for path in (args.paths or ["."]) for f in find_test_files(path)]
    if not files:
        where = ", ".join(args.paths or ["."])
        print(f"no test files (*_test.yaml, *_test.yml, *_test.json) in {where}", file=sys.stderr)
        return 1
    passed = failed = broken = 0
    for file in files:
        _importable(file)
        try:
            suite = run_test_file(file)
        except PipelineConfigError as exc:
            print(exc, file=sys.stderr)
            broken += 1
            continue
        print(f"{file} (pipelines: {suite.pipelines_file})")
        for case in suite.cases:
            where = f"{file}:{case.line}" if case.line else str(file)
            if case.passed:
                passed += 1
                if args.verbose:
                    print(f"  PASS  {case.name}")
                continue
            failed += 1
            print(f"  FAIL  {case.name} ({where}, pipeline {case.pipeline})")
            for line in case.diff.splitlines():
                print(f"        {line}")
            for note in case.notes:
                print(f"        note: {note}")
        if not args.verbose and suite.passed:
            print(f"  {len(suite.cases)} passed")
    summary = f"{passed} passed, {failed} failed"
    if broken:
        summary += f", {broken} file{'s' if broken != 1 else ''} with problems"
    print(summary)
    return 0 if failed == 0 and broken == 0 else 1


def _spark(args: argparse.Namespace, rest: list[str]) -> int:
    from .spark.runner import run

    return run(args)


def _package(args: argparse.Namespace, rest: list[str]) -> int:
    from .deploy.package import PackageError, build_package
    from .pipeline import PipelineConfigError

    try:
        target = build_package(args.dir, args.out, pipeline_file=args.pipelines)
    except (PackageError, PipelineConfigError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    import zipfile

    with zipfile.ZipFile(target) as archive:
        count = len(archive.namelist())
    print(
        f"{target}: {count} files, {target.stat().st_size / 1024:,.0f} KiB "
        "(deploy: az functionapp deployment source config-zip --src ...)"
    )
    return 0


def _infra_parameters(args: argparse.Namespace, rest: list[str]) -> int:
    from .deploy.__main__ import main as parameters_main

    return parameters_main(rest)


def _resolve(args: argparse.Namespace, rest: list[str]) -> int:
    import os

    from .failover import NAMESERVER_SETTING, FailoverError
    from .failover.dns import DnsResolver
    from .failover.file import FileResolver

    try:
        if args.file is not None:
            resolver: DnsResolver | FileResolver = FileResolver(args.file, timeout=args.timeout)
        else:
            nameserver = args.nameserver or os.environ.get(NAMESERVER_SETTING) or None
            resolver = DnsResolver(args.alias, nameserver, timeout=args.timeout)
        resolution = resolver.resolve()
    except (FailoverError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for line in resolution.chain:
        print(line)
    print(resolution.host)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m replication",
        description="Service Bus replication app with an embedded AMQP 1.0 core.",
    )
    parser.add_argument("--version", action="version", version=f"replication {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    from .host.main import add_peek_arguments, add_start_arguments

    start = commands.add_parser(
        "start",
        help="run function_app.py's functions locally (like `func start`)",
        description="The local Functions host: starts the embedded broker for local emulator "
        "connections, runs the Service Bus triggers of function_app.py, serves /metrics.",
    )
    add_start_arguments(start)
    start.set_defaults(handler=_start)
    peek = commands.add_parser(
        "peek",
        help="show the messages at an entity",
        description="Peeks at an entity.",
    )
    add_peek_arguments(peek)
    peek.set_defaults(handler=_peek)
    broker = commands.add_parser(
        "broker",
        help="run the embedded Service Bus broker",
        description="Runs the embedded Service Bus-compatible broker (emulator Config.json).",
    )
    from .broker.main import add_arguments

    add_arguments(broker)
    broker.set_defaults(handler=_broker)

    validate = commands.add_parser(
        "validate",
        help="check a pipeline file (pipelines.yaml)",
        description="Validates a pipeline file; prints one line per pipeline, or the problems "
        "(file:line: path: reason) and exits 1.",
    )
    validate.add_argument("file", nargs="?", default="pipelines.yaml", help="the pipeline file")
    validate.add_argument(
        "--settings",
        metavar="FILE",
        help="also check connection and key settings against this local.settings.json",
    )
    validate.add_argument(
        "--env", action="store_true", help="also check settings against the environment"
    )
    validate.set_defaults(handler=_validate)

    schema = commands.add_parser(
        "schema",
        help="print the JSON Schema of pipeline files",
        description="Prints the JSON Schema of pipeline files (step options included).",
    )
    schema.add_argument("-o", "--output", metavar="FILE", help="write it to FILE")
    schema.add_argument(
        "--markdown",
        action="store_true",
        help="the reference in Markdown instead (docs/pipeline-reference.md)",
    )
    schema.set_defaults(handler=_schema)

    test = commands.add_parser(
        "test",
        help="run pipeline config tests (*_test.yaml)",
        description="Runs config tests in-process: a directory's *_test.yaml files (default: "
        "the current directory), a test file, or a pipeline file's <name>_test.yaml.",
    )
    test.add_argument("paths", nargs="*", metavar="PATH", help="test files or directories")
    test.add_argument("-v", "--verbose", action="store_true", help="list passing cases too")
    test.set_defaults(handler=_test)

    spark = commands.add_parser(
        "spark",
        help="run a pipeline on Spark Structured Streaming (or replay Capture files)",
        description="Runs a configured pipeline's steps on Spark: a servicebus stream per "
        "source, the steps per partition, the pipeline's targets as the sink.",
    )
    from .spark.runner import add_arguments as add_spark_arguments

    add_spark_arguments(spark)
    spark.set_defaults(handler=_spark)

    resolve = commands.add_parser(
        "resolve",
        help="show where a failover alias or file points now",
        description="Resolves a failover endpoint as the app does: the CNAME of ALIAS, the SRV "
        "records at _azure_servicebus._amqp.<canonical name> (port 5671, lowest priority, "
        "then weight), or the first line of --file. Prints the chain, then the namespace host "
        "alone on the last line; exits 1 with the reason when it cannot.",
    )
    source = resolve.add_mutually_exclusive_group(required=True)  # exactly one
    source.add_argument("alias", nargs="?", help="the CNAME alias, e.g. servicebus.example.com")
    source.add_argument("--file", metavar="PATH|URL", help="a text file or http(s) URL instead")
    resolve.add_argument(
        "--nameserver",
        metavar="HOST[:PORT]",
        help="the DNS server to ask (default: the REPLICATION_DNS_NAMESERVER environment "
        "variable, else the system's resolver)",
    )
    resolve.add_argument("--timeout", type=float, default=2.0, help="seconds per attempt")
    resolve.set_defaults(handler=_resolve)

    drill = commands.add_parser(
        "drill",
        help="a failover drill: measure RTO, RPO, duplicates and lag end to end",
        description="Runs a failover drill: a producer at a steady rate into a pipeline's "
        "source through a failover-resolved target, the pipeline replicating primary -> "
        "secondary, the primary killed or the alias/file flipped at --flip-after; then "
        "reports the recovery time, the recovery point (by message-id), duplicates and "
        "replication lag. Embedded brokers by default; --primary/--secondary for your own.",
    )
    from .drill.main import add_arguments as add_drill_arguments

    add_drill_arguments(drill)
    drill.set_defaults(handler=_drill)

    package = commands.add_parser(
        "package",
        help="build the zip a Functions deployment sends",
        description="Zips the app folder as `func azure functionapp publish` would (what "
        ".funcignore keeps), after checking that the pipeline file loads and that every file "
        "it names is inside: OUT/functionapp.zip.",
    )
    package.add_argument(
        "--out",
        type=Path,
        default=Path("dist"),
        metavar="DIR",
        help="where functionapp.zip goes (default: dist)",
    )
    package.add_argument(
        "--dir",
        type=Path,
        default=Path.cwd(),
        help="the app folder (default: the current directory)",
    )
    package.add_argument(
        "--pipelines",
        metavar="FILE",
        help="the pipeline file the app loads, relative to --dir (default: "
        "REPLICATION_PIPELINES, else pipelines.yaml)",
    )
    package.set_defaults(handler=_package)

    infra = commands.add_parser(
        "infra-parameters",
        add_help=False,
        help="write infra/main.bicep's parameters for a pipeline file (--help for more)",
    )
    infra.set_defaults(handler=_infra_parameters)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, rest = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    if args.command is None:
        parser.print_help()
        return 2
    return int(args.handler(args, rest))
