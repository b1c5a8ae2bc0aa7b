"""Where the weights come from: `spec.model.uri` -> the engine's MODEL argument and what the pod needs.

Pure. Schemes (validated by `tandem.api.rules.MODEL_URI_PATTERN`):
- `hf://org/repo[@rev]` -> MODEL `org/repo` (plus `--revision rev`); the engine downloads at start.
- `pvc://claim[/path]` -> the claim mounted read-only at `/models/<claim>`, MODEL `/models/<claim>/<path>`.
- `file:///path` -> MODEL `/path`, already inside the image.
"""

from __future__ import annotations

from dataclasses import dataclass

MODELS_ROOT = "/models"
MODEL_VOLUME = "model"


@dataclass(frozen=True)
class ModelSource:
    model: str  # the positional MODEL of `vllm serve`
    revision: str | None = None  # hf:// only
    claim: str | None = None  # pvc:// only: the PersistentVolumeClaim to mount
    mount_path: str | None = None  # pvc:// only: where the claim is mounted
    downloads: bool = False  # the engine fetches the weights at start (longer start-up)


def parse(uri: str) -> ModelSource:
    """Raises ValueError for a scheme the API would have refused."""
    if uri.startswith("hf://"):
        repo, _, revision = uri.removeprefix("hf://").partition("@")
        return ModelSource(model=repo, revision=revision or None, downloads=True)
    if uri.startswith("pvc://"):
        claim, _, path = uri.removeprefix("pvc://").partition("/")
        mount_path = f"{MODELS_ROOT}/{claim}"
        path = path.strip("/")
        model = f"{mount_path}/{path}" if path else mount_path
        return ModelSource(model=model, claim=claim, mount_path=mount_path)
    if uri.startswith("file://"):
        return ModelSource(model=uri.removeprefix("file://"))
    raise ValueError(f"spec.model.uri: unsupported scheme in {uri!r}")
