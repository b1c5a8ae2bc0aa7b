"""RBAC audit: every (apiGroup, resource, verb) the chart grants the operator's ServiceAccount is one
the operator's code issues, and every one it issues is granted.

What the code issues is derived from the code, not written down here:
- `tandem.kube.rest.KubeRest`: each method's HTTP verb and whether it addresses an object or a
  collection, read from the method bodies (GET object: get, GET collection: list, PATCH: patch,
  DELETE: delete, POST: create, PUT: update; server-side `apply` of an object that does not exist
  creates it, so `apply` counts as patch and create);
- every call of those methods in `tandem.controller` (the operator; `probe.py` is `tandem probe`,
  the helm-test hook under its own ServiceAccount), with the Kind it passes: a module constant
  `X = Kind(...)`, or the reconciler's `kind` loop variable over `render.desired.CHILD_KINDS`;
- the operator's watch caches (`tandem.controller.main.CHILD_WATCHES` and PDDeployments: list and
  watch each) and kopf's watches, from the operator's handler registry (list and watch each);
- the router's Role the operator renders: RBAC lets the operator grant only what it holds itself.
kopf's own cluster scans (CRDs; namespaces when namespaced) are the only hand-written entries.

A grant without a use fails (remove it from charts/tandem/templates); a use without a grant fails
(the operator would be refused at run time). Values: the chart's defaults (cluster-wide) and
`watchNamespaces` (a Role per namespace plus the read-only discovery ClusterRole).
"""

from __future__ import annotations

import ast
import importlib
from collections import defaultdict
from typing import Any

import pytest

from tandem.api.models import PDDeployment
from tandem.controller.main import CHILD_WATCHES, build_registry
from tandem.kube.rest import PDDEPLOYMENT
from tandem.render import router
from tandem.render.desired import CHILD_KINDS, GROUP_KINDS

from .helm import REPO, template

Grant = tuple[str, str, str]  # (apiGroup, resource, verb)
PACKAGE = REPO / "operator" / "tandem"
OPERATOR_CODE = sorted(p for p in (PACKAGE / "controller").glob("*.py") if p.name != "probe.py")
HTTP_VERBS = {("GET", "path"): "get", ("GET", "collection"): "list", "PATCH": "patch", "DELETE": "delete",
              "POST": "create", "PUT": "update", "WATCH": "watch"}  # fmt: skip
# kopf (not tandem's code) lists and watches CRDs to notice a watched CRD reinstalled, and in
# namespaced mode lists and watches namespaces to match its namespace list. `get` on CRDs: kopf reads
# the CRD of each watched custom resource at startup.
KOPF_SCANS: set[Grant] = {
    ("apiextensions.k8s.io", "customresourcedefinitions", "get"),
    ("apiextensions.k8s.io", "customresourcedefinitions", "list"),
    ("apiextensions.k8s.io", "customresourcedefinitions", "watch"),
    ("", "namespaces", "list"),
    ("", "namespaces", "watch"),
}


def _group(api_version: str) -> str:
    return api_version.split("/")[0] if "/" in api_version else ""


def _kind_constants() -> dict[str, tuple[str, str]]:
    """`NAME = Kind(...)` at module level anywhere in the package: NAME -> (group, plural), read from
    the imported module's value."""
    found: dict[str, tuple[str, str]] = {}
    for path in PACKAGE.rglob("*.py"):
        for node in ast.parse(path.read_text()).body:
            if (
                isinstance(node, ast.Assign)
                and isinstance(node.value, ast.Call)
                and isinstance(node.value.func, ast.Name)
                and node.value.func.id == "Kind"
            ):
                module = importlib.import_module(
                    ".".join(("tandem", *path.relative_to(PACKAGE).with_suffix("").parts))
                )
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        kind = getattr(module, target.id)
                        found[target.id] = (_group(kind.api_version), kind.plural)
    return found


def _method_verbs() -> dict[str, set[tuple[str, str]]]:
    """KubeRest method -> {(verb, subresource)} from its `self.request(METHOD, kind.path|collection...)`."""
    tree = ast.parse((PACKAGE / "kube" / "rest.py").read_text())
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "KubeRest"]
    verbs: dict[str, set[tuple[str, str]]] = {}
    for method in cls.body:
        if not isinstance(method, ast.FunctionDef) or method.name.startswith("_") or method.name == "request":
            continue
        found: set[tuple[str, str]] = set()
        for call in ast.walk(method):
            if not (
                isinstance(call, ast.Call)
                and isinstance(call.func, ast.Attribute)
                and call.func.attr in ("request", "_stream")
                and call.args
                and isinstance(call.args[0], ast.Constant)
            ):
                continue
            http = "WATCH" if call.func.attr == "_stream" else str(call.args[0].value)
            target = ast.unparse(call.args[1])
            shape = "collection" if ".collection(" in target else "path"
            sub = "status" if "/status" in target else ""
            verb = HTTP_VERBS.get((http, shape)) or HTTP_VERBS[http]
            found.add((verb, sub))
            if method.name == "apply":  # server-side apply creates a missing object
                found.add(("create", sub))
        assert found, f"KubeRest.{method.name} issues no request the audit understands"
        verbs[method.name] = found
    return verbs


def code_uses() -> dict[Grant, list[str]]:
    """Every grant the operator's code needs, with where each comes from."""
    kinds = _kind_constants()
    methods = _method_verbs()
    children = [(_group(api_version), plural) for api_version, _, plural in (*CHILD_KINDS, *GROUP_KINDS)]
    uses: dict[Grant, list[str]] = defaultdict(list)

    def kinds_of(expr: ast.expr, where: str) -> list[tuple[str, str]]:
        name = ast.unparse(expr).split(".")[0]
        if name in kinds:
            return [kinds[name]]
        # The reconciler's generic children: `kind` of `KINDS.values()`, or `KINDS[...]`.
        generic = name == "kind" or name.startswith("KINDS[")
        assert generic, f"{where}: cannot resolve the kind {name!r}"
        assert "reconcile.py" in where, f"{where}: a generic kind outside the reconciler"
        return children

    for path in OPERATOR_CODE:
        for call in ast.walk(ast.parse(path.read_text())):
            if not isinstance(call, ast.Call):
                continue
            func, args = call.func, list(call.args)
            if isinstance(func, ast.Attribute) and func.attr == "to_thread" and args:
                func, args = args[0], args[1:]  # asyncio.to_thread(self.kube.get, KIND, ...)
            if not (isinstance(func, ast.Attribute) and ast.unparse(func.value).endswith("kube") and args):
                continue
            where = f"{path.name}:{call.lineno}"
            if func.attr == "request":
                http = str(args[0].value) if isinstance(args[0], ast.Constant) else "?"
                shape = "collection" if ".collection(" in ast.unparse(args[1]) else "path"
                pairs = {(HTTP_VERBS.get((http, shape)) or HTTP_VERBS[http], "")}
                targets = kinds_of(args[1], where)
            elif func.attr in methods:
                pairs = methods[func.attr]
                targets = kinds_of(args[0], where) if func.attr != "create_event" else [kinds["EVENT"]]
            else:
                continue
            for group, plural in targets:
                for verb, sub in pairs:
                    resource = f"{plural}/{sub}" if sub else plural
                    uses[(group, resource, verb)].append(f"{where} {func.attr}")
    for kind in (PDDEPLOYMENT, *CHILD_WATCHES):  # the informers: `KubeRest.list_with_version`, `watch`
        for verb in ("list", "watch"):
            uses[(_group(kind.api_version), kind.plural, verb)].append("informer (main.build_cache)")
    for handler in build_registry(None)._watching.get_all_handlers():  # type: ignore[arg-type]
        selector = handler.selector
        assert selector is not None
        for verb in ("list", "watch"):
            uses[(selector.group or "", str(selector.any_name), verb)].append("kopf.on.event")
    sample = PDDeployment.model_validate(
        {
            "metadata": {"name": "x"},
            "spec": {
                "model": {"name": "m", "uri": "hf://a/b"},
                "engine": {"image": "i"},
                "colocated": {"replicas": 1},
                "serving": {"mode": "Colocated"},
                "router": {"auth": {"apiKeysSecret": "keys"}},  # the Role's widest form
            },
        }
    )
    for rule in router.role(sample)["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    uses[(group, resource, verb)].append("router Role (granted by the operator)")
    for grant in KOPF_SCANS:
        uses[grant].append("kopf's cluster scans")
    return dict(uses)


def operator_grants(values: dict[str, Any]) -> set[Grant]:
    """What the chart grants the operator's ServiceAccount (roles bound to it)."""
    rendered = template(values, release="audit", namespace="ops")
    sa = "audit-tandem"
    bound: set[tuple[str, str]] = set()
    for binding in rendered.objects:
        if binding["kind"] in ("RoleBinding", "ClusterRoleBinding") and any(
            s["kind"] == "ServiceAccount" and s["name"] == sa for s in binding["subjects"]
        ):
            bound.add((binding["roleRef"]["kind"], binding["roleRef"]["name"]))
    assert bound, "no binding to the operator's ServiceAccount"
    grants: set[Grant] = set()
    for role in rendered.objects:
        if (role["kind"], role["metadata"]["name"]) not in bound:
            continue
        for rule in role["rules"]:
            assert "*" not in rule["verbs"], rule
            assert "*" not in rule["resources"], rule
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    grants |= {(group, resource, verb) for verb in rule["verbs"]}
    return grants


VALUES: dict[str, dict[str, Any]] = {
    "cluster-wide": {},
    "namespaced": {"watchNamespaces": ["team-a"], "rbac": {"clusterReadOnly": True}},
}


@pytest.mark.parametrize("case", sorted(VALUES))
def test_chart_grants_exactly_what_the_operator_code_uses(case: str) -> None:
    grants = operator_grants(VALUES[case])
    uses = code_uses()
    print(f"\n{case}: the chart grants the operator {len(grants)} (group, resource, verb):")
    for group, resource, verb in sorted(grants):
        why = ", ".join(sorted(set(uses.get((group, resource, verb), ["UNUSED"]))))
        print(f"  {group or 'core'}/{resource} {verb}: {why}")
    unused = sorted(grants - set(uses))
    assert not unused, f"granted but not used by the operator's code: {unused}"
    missing = sorted(set(uses) - grants)
    if case == "cluster-wide":  # kopf's namespace scan is only needed with watchNamespaces
        missing = [g for g in missing if g[1] != "namespaces"]
    assert not missing, f"used by the operator's code but not granted: {[(g, uses[g]) for g in missing]}"


def test_the_audit_sees_every_kind_of_call() -> None:
    """The scan is not vacuous: it finds the calls the operator is known to make."""
    uses = code_uses()
    for grant in [
        ("tandem.dev", "pddeployments", "get"),  # the worker reads the object it reconciles
        ("tandem.dev", "pddeployments/status", "patch"),
        ("apps", "statefulsets", "patch"),  # server-side apply of a child
        ("apps", "statefulsets", "delete"),  # pruning
        ("", "pods", "patch"),  # the draining annotation
        ("coordination.k8s.io", "leases", "update"),
        ("", "events", "create"),
        ("", "secrets", "get"),
        ("networking.k8s.io", "networkpolicies", "list"),
        ("leaderworkerset.x-k8s.io", "leaderworkersets", "patch"),  # a multi-node pool's workload
        ("leaderworkerset.x-k8s.io", "leaderworkersets", "watch"),
    ]:
        assert grant in uses, grant
    assert ("", "secrets", "list") not in uses  # secrets are read one by name, never listed
