"""`spec.model`: what is served and where its weights come from."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from tandem.api.models.common import ApiModel, DataKey, ObjectName


class SecretKeyRef(ApiModel):
    """A key of a Secret in the PDDeployment's namespace."""

    name: ObjectName
    key: DataKey


class ModelSpec(ApiModel):
    """What model is served, from where, and under which name."""

    name: Annotated[
        str,
        Field(
            min_length=1,
            max_length=128,
            pattern=r"^[A-Za-z0-9]([A-Za-z0-9._/-]*[A-Za-z0-9])?$",
            description="Name clients put in `model` (vLLM --served-model-name).",
        ),
    ]
    uri: Annotated[
        str,
        Field(
            min_length=1,
            max_length=512,
            description=(
                "Where the weights come from: hf://org/repo[@revision], pvc://claim/path (mounted "
                "read-only), or file:///absolute/path inside the image."
            ),
        ),
    ]
    max_model_len: Annotated[
        int | None,
        Field(ge=128, le=10_485_760, description="Context limit (vLLM --max-model-len)."),
    ] = None
    token_secret_ref: Annotated[
        SecretKeyRef | None,
        Field(description="Secret key holding a Hugging Face token (hf:// only), exported as HF_TOKEN."),
    ] = None
    kv_bytes_per_token: Annotated[
        int | None,
        Field(
            ge=1,
            description=(
                "KV-cache bytes per token, for status and transfer estimates. Derived from known "
                "architectures when unset."
            ),
        ),
    ] = None
