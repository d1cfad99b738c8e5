"""The base models' tokenizers on the gateway, and ``/tokenize``, ``/detokenize`` as
``vllm serve`` 0.32 serves them (``vllm/entrypoints/serve/tokenize``), per tenant model: the
``model`` names the caller's policy, and the tokenizer is its base model's.

A tokenizer is loaded from the base model's local folder with transformers'
``PreTrainedTokenizerFast`` (the class vLLM's ``AutoTokenizer`` gives for these models; it does
not import torch: about 1.5 s and 60 MB the first time), off the event loop, once per base
model and kept. Where the folder is: the policy's ``base_model`` when it is a folder, else
``<models_dir>/<base_model>``, else the deployment's base model (``MINT_BASE_MODEL``: a MinT
deployment serves one base model).
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import structlog
from pydantic import Field

from gateway.bodies import Message, Tool, _Open
from gateway.errors import BadRequest

log = structlog.get_logger()
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
DEFAULT_MAX_MODEL_LEN = 2048  # vLLM's fallback when the model's config names no length


class NoTokenizer(Exception):
    """The base model's folder (with its tokenizer) is not on this gateway's machine."""


def has_tokenizer(folder: Path) -> bool:
    return folder.is_dir() and any((folder / f).is_file() for f in TOKENIZER_FILES)


def locate(base_model: str, models_dir: Path | None, default: str | None) -> Path:
    """The local folder of ``base_model`` (module docstring), or NoTokenizer naming where it
    looked."""
    tried = []
    for candidate in (
        Path(base_model) if base_model else None,
        models_dir / base_model if models_dir and base_model else None,
        Path(default) if default else None,
    ):
        if candidate is None:
            continue
        tried.append(str(candidate))
        if has_tokenizer(candidate):
            return candidate
    raise NoTokenizer(
        f"the tokenizer of base model {base_model!r} is not on this gateway (looked in "
        f"{', '.join(tried) or 'nothing'}); give the gateway the base model's folder "
        "(MINT_BASE_MODEL or MINT_MODELS_DIR)"
    )


def model_config(folder: Path) -> dict[str, Any]:
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    return config if isinstance(config, dict) else {}


def model_max_len(config: dict[str, Any]) -> int:
    """vLLM's ``max_model_len`` default for the model: its config's context length."""
    for key in ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length"):
        if isinstance(config.get(key), int):
            return config[key]
    return DEFAULT_MAX_MODEL_LEN


TOKENIZER_IDS = 2**32  # the tokenizers library takes 32-bit ids


class BaseTokenizer:
    """One base model's tokenizer and context length."""

    def __init__(self, folder: Path, max_model_len: int | None = None) -> None:
        from transformers import PreTrainedTokenizerFast  # no torch; only when first needed

        self.folder = folder
        self.hf = PreTrainedTokenizerFast.from_pretrained(str(folder))
        config = model_config(folder)
        self.max_model_len = max_model_len or model_max_len(config)

    @property
    def chat_template(self) -> str:
        return self.hf.chat_template or ""

    def encode(self, text: str, add_special_tokens: bool) -> list[int]:
        return list(self.hf.encode(text, add_special_tokens=add_special_tokens))

    def decode(self, ids: list[int]) -> str:
        return self.hf.decode(ids)

    def token_strs(self, ids: list[int]) -> list[str]:
        return list(self.hf.convert_ids_to_tokens(ids))

    def render(
        self,
        conversation: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        documents: list[dict[str, str]] | None = None,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        kwargs: dict[str, Any] | None = None,
    ) -> str:
        """The chat template over ``conversation`` (vLLM's ``apply_chat_template`` call); a
        template error is the caller's 400, as in vLLM."""
        try:
            return self.hf.apply_chat_template(
                conversation,
                tools=tools,
                documents=documents,
                add_generation_prompt=add_generation_prompt,
                continue_final_message=continue_final_message,
                tokenize=False,
                **(kwargs or {}),
            )
        except Exception as e:  # jinja2's TemplateError, transformers' ValueError
            raise BadRequest(f"{type(e).__name__}: {str(e)[:500]}") from e


class Tokenizers:
    """Tokenizers by base model, loaded once each (``locate`` maps a catalog base model name to
    its folder; ``max_model_len``: the engines' context, when set explicitly)."""

    def __init__(self, locate: Callable[[str], Path], *, max_model_len: int | None = None) -> None:
        self._locate, self.max_model_len = locate, max_model_len
        self._loaded: dict[str, BaseTokenizer] = {}
        self._lock = threading.Lock()

    def load(self, base_model: str) -> BaseTokenizer:
        """Blocking: the tokenizer of ``base_model`` (NoTokenizer when it is not here)."""
        with self._lock:
            found = self._loaded.get(base_model)
            if found is None:
                folder = self._locate(base_model)
                try:
                    found = BaseTokenizer(folder, self.max_model_len)
                except Exception as e:  # a folder transformers cannot read
                    raise NoTokenizer(
                        f"the tokenizer of base model {base_model!r} in {folder} could not be "
                        f"loaded ({type(e).__name__}: {str(e)[:200]})"
                    ) from e
                self._loaded[base_model] = found
                log.info("tokenizer loaded", base_model=base_model, folder=str(folder))
            return found

    def peek(self, base_model: str) -> BaseTokenizer | None:
        return self._loaded.get(base_model)

    async def get(self, base_model: str) -> BaseTokenizer:
        found = self.peek(base_model)
        return found if found is not None else await asyncio.to_thread(self.load, base_model)


# ---------------------------------------------------------------------- the routes' bodies


class TokenizeCompletion(_Open):
    model: str = Field(max_length=300)
    prompt: str
    add_special_tokens: bool = True
    return_token_strs: bool | None = False


class TokenizeChat(_Open):
    model: str = Field(max_length=300)
    messages: list[Message]
    add_generation_prompt: bool = True
    return_token_strs: bool | None = False
    continue_final_message: bool = False
    add_special_tokens: bool = False
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[Tool] | None = None


class Detokenize(_Open):
    model: str = Field(max_length=300)
    tokens: list[Annotated[int, Field(ge=0, le=2**63 - 1)]]


def tokenize_answer(tok: BaseTokenizer, ids: list[int], strs: bool) -> dict[str, Any]:
    """vLLM's ``TokenizeResponse``."""
    return {
        "count": len(ids),
        "max_model_len": tok.max_model_len,
        "tokens": ids,
        "token_strs": tok.token_strs(ids) if strs else None,
    }


def detokenize_answer(tok: BaseTokenizer, ids: list[int]) -> dict[str, Any]:
    """vLLM's ``DetokenizeResponse``. vllm serve 0.32 checks no id on /detokenize: one past the
    vocabulary decodes to nothing (seen in tests/e2e/gateway/test_vllm_serve_parity.py). One past
    32 bits, which the tokenizer cannot take, is a 400 here rather than an error of ours."""
    big = next((t for t in ids if t >= TOKENIZER_IDS), None)
    if big is not None:
        raise BadRequest(
            f"Token id {big} is out of vocabulary (the tokenizer's ids are below 2**32)",
            param="tokens",
        )
    return {"prompt": tok.decode(ids)}
