"""``python -m replication infra-parameters PIPELINES``: infra/main.bicep's parameters file.

    python -m replication infra-parameters pipelines.yaml \\
        --base infra/main.parameters.example.json \\
        --map PrimaryServiceBus=primary --map SecondaryServiceBus=secondary > params.json
    az deployment group create -g RG -f infra/main.bicep -p @params.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..pipeline import PipelineConfigError
from .parameters import (
    DEFAULT_NAMESPACES,
    DeployConfigError,
    app_secret_names,
    bicep_parameters,
    parameters_file,
)


def build_parser() -> argparse.ArgumentParser:
    """The subcommand's own parser (``replication.cli`` hands it the rest of the line)."""
    parser = argparse.ArgumentParser(
        prog="python -m replication infra-parameters",
        description="Write infra/main.bicep's parameters for a pipeline file.",
    )
    parser.add_argument("pipelines", type=Path, help="the pipeline file (pipelines.yaml)")
    parser.add_argument(
        "--base",
        type=Path,
        metavar="FILE",
        help="a parameters file with the other parameters (appName, dnsZoneName, ...)",
    )
    parser.add_argument(
        "--map",
        action="append",
        default=[],
        metavar="CONNECTION=NAMESPACE",
        help="connection setting -> primary|secondary, added to the defaults: "
        + ", ".join(f"{k}={v}" for k, v in DEFAULT_NAMESPACES.items()),
    )
    parser.add_argument(
        "--app-root",
        type=Path,
        metavar="DIR",
        help="the folder deployed as the app (default: the pipeline file's folder)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    mapping = dict(DEFAULT_NAMESPACES)
    for item in args.map:
        name, sep, namespace = item.partition("=")
        if not sep or not name.strip():
            parser.error(f"--map {item!r}: expected CONNECTION=primary|secondary")
        mapping[name.strip()] = namespace.strip()
    try:
        derived = bicep_parameters(args.pipelines, mapping, app_root=args.app_root)
        secrets = app_secret_names(args.pipelines)
        base = json.loads(args.base.read_text(encoding="utf-8")) if args.base else None
    except (PipelineConfigError, DeployConfigError, OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    json.dump(parameters_file(derived, base), sys.stdout, indent=2)
    sys.stdout.write("\n")
    if secrets:
        print(
            "note: the pipelines also read " + ", ".join(secrets) + ": give them in the "
            "appSecrets parameter (a secure object; Key Vault references keep keys out of it)",
            file=sys.stderr,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
