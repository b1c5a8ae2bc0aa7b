"""The error line of a failed container's log tail (`status.container_error`), and what a kubelet keeps
of the log for FallbackToLogsOnError."""

from __future__ import annotations

import pytest

from tandem.controller.reconcile import pod_problems
from tandem.status.container_error import FALLBACK_MAX_BYTES, MAX_LINE_CHARS, error_line, fallback_message

ARGPARSE_TAIL = """\
                     [--enable-log-requests | --no-enable-log-requests]
                     [model_tag]
api_server.py: error: unrecognized arguments: --bogus-flag"""

# vLLM's engine core fails in its own process; the front end then says where to look.
ENGINE_CORE_TAIL = "\n".join(
    [
        '(EngineCore pid=5705) ERROR 12-02 01:23:40 [core.py:1108]   File "/venv/vllm/v1/core/kv.py"',
        "(EngineCore pid=5705) ERROR 12-02 01:23:40 [core.py:1108]     raise ValueError(",
        "(EngineCore pid=5705) ERROR 12-02 01:23:40 [core.py:1108] ValueError: To serve at least one request"
        " with the models's max seq len (100000000), (195.31 GiB KV cache is needed, which is larger than the"
        " available KV cache memory (1.0 GiB).",
        "(APIServer pid=3390) Traceback (most recent call last):",
        '(APIServer pid=3390)   File "<frozen runpy>", line 198, in _run_module_as_main',
        "(APIServer pid=3390) RuntimeError: Engine core initialization failed. See root cause above."
        " Failed core proc(s): {}",
    ]
)

CASES = [
    ("argparse", ARGPARSE_TAIL, "api_server.py: error: unrecognized arguments: --bogus-flag"),
    (
        "root-cause-over-pointer",
        ENGINE_CORE_TAIL,
        "ValueError: To serve at least one request with the models's max seq len (100000000), (195.31 GiB KV "
        "cache is needed, which is larger than the available KV cache memory (1.0 GiB).",
    ),
    (
        "qualified-exception",
        "x\nhuggingface_hub.errors.HFValidationError: Repo id must be",
        "huggingface_hub.errors.HFValidationError: Repo id must be",
    ),
    (
        # vLLM's engine core failed ~60 lines above the end: the kubelet's 2,048 bytes hold the front
        # end's pointer and a warning printed after it; the pointer is still the error.
        "pointer-only",
        "(APIServer pid=9) RuntimeError: Engine core initialization failed. See root cause above.\n"
        "/usr/lib/python3.11/multiprocessing/resource_tracker.py:254: UserWarning: leaked semaphore\n"
        "  warnings.warn('resource_tracker: There appear to be %d '",
        "RuntimeError: Engine core initialization failed. See root cause above.",
    ),
    ("last-line", "starting\nKilled\n\n", "Killed"),
    ("blank", "\n  \n", None),
]


@pytest.mark.parametrize(("tail", "line"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_the_error_line_of_a_log_tail(tail: str, line: str | None) -> None:
    assert error_line(tail) == line


def test_a_long_error_line_is_clipped() -> None:
    line = error_line("ValueError: " + "x" * 1000)
    assert line is not None
    assert len(line) == MAX_LINE_CHARS
    assert line.endswith("...")


def test_fallback_keeps_the_last_80_lines_or_2048_bytes() -> None:
    lines = [f"line {i}" for i in range(200)]
    assert fallback_message(lines).splitlines() == lines[-80:]
    long = [f"{i:03d} " + "y" * 96 for i in range(50)]  # 100 bytes a line: 50 lines are 5 kB
    kept = fallback_message(long)
    assert len(kept.encode()) <= FALLBACK_MAX_BYTES
    assert kept.splitlines()[-1] == long[-1]
    assert all(line in long for line in kept.splitlines())  # cut at a line's start
    assert fallback_message([]) == ""


def pod(waiting: str, terminated: dict[str, object] | None) -> dict[str, object]:
    status: dict[str, object] = {
        "state": {"waiting": {"reason": waiting, "message": "back-off 10s restarting"}}
    }
    if terminated is not None:
        status["lastState"] = {"terminated": terminated}
    return {
        "metadata": {"name": "m-decode-0", "labels": {"tandem.dev/role": "decode"}},
        "status": {"containerStatuses": [status]},
    }


def test_crash_loop_quotes_the_last_exits_error_line() -> None:
    [problem] = pod_problems([pod("CrashLoopBackOff", {"exitCode": 2, "message": ARGPARSE_TAIL})])
    assert problem.reason == "CrashLoopBackOff"
    assert problem.message == (
        "CrashLoopBackOff: back-off 10s restarting; last exit 2: "
        "api_server.py: error: unrecognized arguments: --bogus-flag"
    )
    # No termination message (a container without FallbackToLogsOnError): the waiting state alone.
    [bare] = pod_problems([pod("CrashLoopBackOff", {"exitCode": 1})])
    assert bare.message == "CrashLoopBackOff: back-off 10s restarting"
    # Other waiting reasons never quote an earlier exit.
    [pull] = pod_problems([pod("ImagePullBackOff", {"exitCode": 1, "message": "ValueError: old"})])
    assert "ValueError" not in pull.message
