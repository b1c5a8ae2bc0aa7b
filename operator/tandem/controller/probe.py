"""`tandem probe`: do the pods matching a selector answer an HTTP health check at their pod IPs?

The chart's `helm test` runs it against the operator. It finds pods through the API rather than
through a Service, so it checks every replica (not whichever one a Service picks) and works where
Services have no endpoints. Exit 0 when at least `--min-pods` Ready pods all answer 200 in time.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import urllib.request
from collections.abc import Sequence

from tandem.kube.rest import POD, KubeError, KubeRest, Obj, load_api_client


def ready_pod_ips(pods: list[Obj]) -> dict[str, str]:
    """Pod name -> IP of the pods that are Ready and have an IP."""
    ready = {}
    for pod in pods:
        status = pod.get("status") or {}
        conditions = {c.get("type"): c.get("status") for c in status.get("conditions") or []}
        if (
            conditions.get("Ready") == "True"
            and status.get("podIP")
            and not pod["metadata"].get("deletionTimestamp")
        ):
            ready[pod["metadata"]["name"]] = status["podIP"]
    return ready


def check(url: str, timeout: float) -> str | None:
    """None when the URL answers 200, else what went wrong."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return None if response.status == 200 else f"HTTP {response.status}"
    except OSError as exc:
        return str(exc)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="tandem probe", description=__doc__.splitlines()[0] if __doc__ else ""
    )
    parser.add_argument("--namespace", default=os.environ.get("POD_NAMESPACE", "default"))
    parser.add_argument(
        "--selector", required=True, help="label selector of the pods, e.g. app=x,component=y"
    )
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--path", default="/healthz")
    parser.add_argument("--min-pods", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds to keep trying")
    args = parser.parse_args(list(argv))
    if not 0 < args.port < 65536:
        parser.error("--port must be between 1 and 65535")
    if args.min_pods < 1:
        parser.error("--min-pods must be at least 1")
    return args


def main(argv: Sequence[str]) -> int:
    args = parse_args(argv)
    kube = KubeRest(load_api_client())
    deadline = time.monotonic() + args.timeout
    problems: dict[str, str] = {}
    while True:
        try:
            ips = ready_pod_ips(kube.list(POD, args.namespace, args.selector))
        except KubeError as exc:
            ips, problems = {}, {"apiserver": str(exc)}
        if len(ips) >= args.min_pods:
            problems = {}
            for name, ip in sorted(ips.items()):
                host = f"[{ip}]" if ":" in ip else ip
                failure = check(f"http://{host}:{args.port}{args.path}", timeout=5)
                if failure:
                    problems[name] = failure
            if not problems:
                for name, ip in sorted(ips.items()):
                    print(f"{name} ({ip}): {args.path} 200")
                return 0
        elif "apiserver" not in problems:
            found = f"{len(ips)} ready pods match {args.selector!r} in {args.namespace}"
            problems = {"pods": f"{found}, want {args.min_pods}"}
        if time.monotonic() >= deadline:
            for name, failure in problems.items():
                print(f"{name}: {failure}", file=sys.stderr)
            return 1
        time.sleep(2)
