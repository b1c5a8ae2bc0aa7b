"""`tandem dev ...`: the dev cluster's command line (cluster up|down|status, runner, testserver)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from tandem.devcluster import layout


def _cluster_dir(arg: str | None) -> layout.ClusterDir:
    return layout.ClusterDir(Path(arg).resolve() if arg else layout.default_cluster_dir())


def _print_status(report: dict[str, object]) -> None:
    if not report.get("running") and "components" not in report:
        print(f"no cluster in {report['dir']}")
        return
    print(f"cluster:     {'running' if report['running'] else 'NOT healthy'} ({report['dir']})")
    print(f"kubeconfig:  {report['kubeconfig']}")
    print(f"apiserver:   {report['apiserver']}")
    print(f"prometheus:  {report['prometheus']}")
    if report.get("lws_webhook"):
        print(f"lws webhook: {report['lws_webhook']} (LeaderWorkerSet controller)")
    print(f"pod IPs:     {report['pod_cidrs']} (loopback)")
    print(f"binaries:    {report['bin_dir']} (kubectl, helm)")
    print("components:")
    components = report.get("components")
    assert isinstance(components, dict)
    for name, info in components.items():
        print(f"  {name:<24} pid {info['pid']:<8} {'running' if info['alive'] else 'DEAD'}")
    nodes = report.get("nodes")
    if isinstance(nodes, list):
        print("nodes:")
        for n in nodes:
            print(
                f"  {n['name']:<14} {'Ready' if n['ready'] else 'NotReady':<9} gpu={n['gpus']:<2} "
                f"rdma={n['rdma']:<2} fabric={n['fabric'] or '-':<9} podCIDR={n['podCIDR']}"
            )
    print(f"\nexport KUBECONFIG={report['kubeconfig']} PATH={report['bin_dir']}:$PATH")


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="tandem dev", description="local control plane for tests and the demo"
    )
    sub = parser.add_subparsers(dest="command", required=True)

    cl = sub.add_parser("cluster", help="start, stop or inspect the local cluster")
    cl.add_argument("action", choices=["up", "down", "status"])
    cl.add_argument("--dir", help="cluster directory (default: $TANDEM_CLUSTER_DIR or .tandem/cluster)")
    cl.add_argument("--json", action="store_true", help="status as JSON")
    cl.add_argument(
        "--lws",
        action="store_true",
        help="up: also run the LeaderWorkerSet controller and its webhooks (also on a running cluster)",
    )

    rn = sub.add_parser("runner", help="run the pod runner in the foreground (`cluster up` starts it)")
    rn.add_argument("--dir", required=True, help="cluster directory")

    ts = sub.add_parser("testserver", help="a tiny HTTP server with /health and /metrics, for tests")
    ts.add_argument("--host", required=True)
    ts.add_argument("--port", type=int, required=True)
    ts.add_argument("--ready-after", type=float, default=0.0, help="seconds before /health answers 200")
    ts.add_argument("--unhealthy-after", type=float, default=0.0, help="/health answers 503 after N seconds")
    ts.add_argument("--exit-after", type=float, default=0.0, help="exit with --exit-code after N seconds")
    ts.add_argument("--exit-code", type=int, default=1)
    ts.add_argument(
        "--peer", default="", help="healthy only once a GET of this URL succeeded; /peer shows it"
    )

    args = parser.parse_args(list(argv))
    try:
        return _run(args)
    except BrokenPipeError:  # e.g. `tandem dev cluster status | head`
        return 0


def _run(args: argparse.Namespace) -> int:
    if args.command == "cluster":
        from tandem.devcluster import cluster

        cdir = _cluster_dir(args.dir)
        try:
            if args.action == "up":
                cluster.up(cdir, lws=args.lws)
                _print_status(cluster.status(cdir))
            elif args.action == "down":
                cluster.down(cdir)
            else:
                report = cluster.status(cdir)
                if args.json:
                    print(json.dumps(report, indent=2))
                else:
                    _print_status(report)
                return 0 if report.get("running") else 1
        except cluster.ClusterError as e:
            print(f"tandem dev cluster {args.action}: {e}", file=sys.stderr)
            return 1
        return 0
    if args.command == "runner":
        from tandem.devcluster import runner

        return runner.main(_cluster_dir(args.dir))
    from tandem.devcluster import testserver

    return testserver.serve(
        args.host,
        args.port,
        ready_after=args.ready_after,
        unhealthy_after=args.unhealthy_after,
        exit_after=args.exit_after,
        exit_code=args.exit_code,
        peer=args.peer,
    )
