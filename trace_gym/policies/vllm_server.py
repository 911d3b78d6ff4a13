"""VLLMServerPolicy: a `vllm serve` server that samples the trees and takes the trainer's new weights.

This is the trainer's server mode (TRL's `vllm_mode="server"`). Generation is
`OpenAIPolicy` with vLLM's token ids (`return_token_ids`), so the rows train on the ids
the server sampled. The weights travel through a folder both processes can read:
`load_weights` writes the model's state dict there as one safetensors file, then asks every worker to reload
from it (`POST /collective_rpc` with vLLM's `reload_weights(weights_path=...)`) and
drops the prefix cache, whose entries came from the old weights (`POST
/reset_prefix_cache`). Both endpoints are vLLM's development endpoints, so the server
must run with ``VLLM_SERVER_DEV_MODE=1``:

    VLLM_SERVER_DEV_MODE=1 vllm serve MODEL_DIR --served-model-name policy

Unlike TRL's NCCL weight broadcast, the folder works on any device (a CPU-only server
too) and across machines that share a file system; it costs one safetensors write and
read per step.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trace_gym.errors import ConfigError, MissingDependencyError, TraceGymError
from trace_gym.policies.openai_compat import OpenAIPolicy

__all__ = ["VLLMServerPolicy"]


class VLLMServerPolicy(OpenAIPolicy):
    """`OpenAIPolicy` on a vLLM server, plus `load_weights` through a shared folder.

    Args:
        base_url: The server's API root, e.g. ``http://127.0.0.1:8000/v1``.
        model: The served model name.
        weights_dir: The folder the new weights are written to; the server must be able
            to read it under the same path.
        rpc_timeout: Seconds the reload may take.
        **kwargs: Passed to `OpenAIPolicy` (concurrency, timeouts, retries, ...);
            ``return_token_ids`` is always on.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        weights_dir: str | Path,
        rpc_timeout: float = 600.0,
        **kwargs: Any,
    ) -> None:
        if kwargs.pop("return_token_ids", True) is not True:
            raise ConfigError("VLLMServerPolicy always asks for token ids (return_token_ids=True).")
        super().__init__(base_url, model, return_token_ids=True, **kwargs)
        self.weights_dir = Path(weights_dir)
        self.rpc_timeout = rpc_timeout
        root = base_url.rstrip("/")
        self.server_root = root[: -len("/v1")] if root.endswith("/v1") else root
        self.weight_version = 0
        """How many times `load_weights` has sent weights."""

    def load_weights(self, weights: Any) -> None:
        """Send new weights: a torch model (its `state_dict()`) or a state dict of tensors."""
        state = weights.state_dict() if hasattr(weights, "state_dict") else weights
        if not isinstance(state, Mapping) or not state:
            raise ConfigError(
                f"load_weights takes a torch model or a non-empty state dict, got {type(weights).__name__}."
            )
        try:
            from safetensors.torch import save_file
        except ImportError:
            raise MissingDependencyError("safetensors", "hf", "VLLMServerPolicy.load_weights") from None

        # Every name, tied ones too: vLLM's in-place reload leaves a tied lm_head stale when
        # its tensor is missing (as in save_pretrained's output). Copies, since safetensors
        # refuses tensors that share storage.
        tensors = {name: t.detach().to("cpu", copy=True).contiguous() for name, t in state.items()}
        self.weights_dir.mkdir(parents=True, exist_ok=True)
        save_file(tensors, str(self.weights_dir / "model.safetensors"))
        self._post(
            "/collective_rpc",
            {
                "method": "reload_weights",
                "kwargs": {"weights_path": str(self.weights_dir.resolve())},
                "timeout": self.rpc_timeout,
            },
        )
        self._post("/reset_prefix_cache", None)
        self.weight_version += 1

    def _post(self, path: str, body: Mapping[str, Any] | None) -> None:
        url = self.server_root + path
        data = json.dumps(body).encode() if body is not None else b""
        request = urllib.request.Request(
            url, data=data, method="POST", headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=self.rpc_timeout) as response:
                response.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[:500]
            if exc.code == 404:
                raise TraceGymError(
                    f"VLLMServerPolicy: {url} does not exist (HTTP 404). Start the server with "
                    "VLLM_SERVER_DEV_MODE=1 so it offers /collective_rpc and /reset_prefix_cache."
                ) from None
            raise TraceGymError(
                f"VLLMServerPolicy: {url} failed (HTTP {exc.code}): {detail}. The server could not "
                f"reload the weights from {self.weights_dir}; it must read that folder under the same path."
            ) from None
        except OSError as exc:
            raise TraceGymError(
                f"VLLMServerPolicy: cannot reach {url} ({exc}). Is the vLLM server running?"
            ) from None
