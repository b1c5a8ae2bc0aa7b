"""`tandem render -f FILE [--replicas ROLE=N ...]`: print the objects the operator would apply.

The only module of `tandem.render` that does I/O (reads the file, writes stdout/stderr). A file
that is not a valid PDDeployment gives one line per problem, naming the field as it is spelled in
YAML (`spec.prefill.tensorParallelSize`), and exit status 1. The objects go to stdout (ready for
`kubectl apply -f -`); each pool's shape goes to stderr as a comment line (`shape_lines`).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

import yaml
from pydantic import ValidationError

from tandem.api import meta
from tandem.api.models import PDDeployment
from tandem.render.desired import Manifest, desired_pools, render


def dump_yaml(objects: Sequence[Manifest]) -> str:
    """A YAML stream of `objects`, keys in render order, long command-line strings unwrapped."""
    return yaml.safe_dump_all(list(objects), sort_keys=False, width=1 << 16, explicit_start=True)


def _count(number: int | None, noun: str) -> str:
    shown = "external" if number is None else str(number)
    return f"{shown} {noun}" + ("" if number == 1 else "s")


def shape_lines(pdd: PDDeployment, replicas: dict[str, int] | None = None) -> list[str]:
    """One comment line per rendered pool: its workload, replicas, pods and GPUs, and the shape, e.g.
    `# ds prefill: LeaderWorkerSet, 1 replica x 2 pods x 8 GPUs = 16 GPUs (2x8 TP1 DP16 EP Hybrid)`."""
    lines = []
    for role, count in desired_pools(pdd, replicas).items():
        pool = pdd.spec.pool(role)
        shape = pool.shape
        kind = meta.LWS_KIND if shape.multi_node else "StatefulSet"
        total = "" if count is None else f" = {_count(count * shape.gpus_per_instance, 'GPU')}"
        lines.append(
            f"# {pdd.metadata.name} {role}: {kind}, {_count(count, 'replica')} x {_count(shape.nodes, 'pod')}"
            f" x {_count(shape.gpus_per_pod, 'GPU')}{total} ({shape.summary(pool.gpu_type)})"
        )
    return lines


def _replica_override(text: str) -> tuple[str, int]:
    role, eq, count = text.partition("=")
    if not eq or role not in meta.POOL_ROLES or not count.isdigit():
        raise argparse.ArgumentTypeError(f"expected ROLE=N with ROLE one of {', '.join(meta.POOL_ROLES)}")
    return role, int(count)


def _field_path(loc: Sequence[int | str]) -> str:
    path = ""
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path


def validation_messages(exc: ValidationError) -> list[str]:
    """One line per problem: `field.path: message` (cross-field rules already name their fields)."""
    lines = []
    for error in exc.errors():
        path = _field_path(error["loc"])
        message = str(error["msg"]).removeprefix("Value error, ")
        for part in message.split("; "):
            named = part.startswith(("spec.", "metadata."))
            lines.append(part if named or not path else f"{path}: {part}")
    return lines


def _documents(path: str) -> list[Any]:
    if path == "-":
        return list(yaml.safe_load_all(sys.stdin))
    with open(path, encoding="utf-8") as handle:
        return list(yaml.safe_load_all(handle))


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="tandem render", description=__doc__.splitlines()[0])
    parser.add_argument("-f", "--filename", required=True, help="PDDeployment YAML file ('-' for stdin)")
    parser.add_argument(
        "--replicas",
        type=_replica_override,
        action="append",
        default=[],
        metavar="ROLE=N",
        help="desired replicas of a pool instead of spec.<pool>.replicas (repeatable)",
    )
    args = parser.parse_args(list(argv))
    try:
        documents = _documents(args.filename)
    except (OSError, yaml.YAMLError) as exc:
        print(f"error: {args.filename}: {exc}", file=sys.stderr)
        return 1
    found = [d for d in documents if isinstance(d, dict) and d.get("kind", meta.KIND) == meta.KIND]
    if not found:
        print(f"error: {args.filename}: no {meta.KIND} in the file", file=sys.stderr)
        return 1
    objects: list[Manifest] = []
    for document in found:
        try:
            pdd = PDDeployment.model_validate(document)
        except ValidationError as exc:
            for line in validation_messages(exc):
                print(f"error: {args.filename}: {line}", file=sys.stderr)
            return 1
        objects += render(pdd, dict(args.replicas) or None)
        for line in shape_lines(pdd, dict(args.replicas) or None):
            print(line, file=sys.stderr)
    sys.stdout.write(dump_yaml(objects))
    return 0
