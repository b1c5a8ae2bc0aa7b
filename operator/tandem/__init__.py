"""tandem: a Kubernetes operator and control plane for prefill/decode disaggregated vLLM serving."""

__version__ = "0.1.0"
