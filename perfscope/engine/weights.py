"""Load a local Hugging Face checkpoint folder (Llama, Qwen2) into the reference engine.

The folder holds ``config.json`` and ``model.safetensors`` (or shards listed in
``model.safetensors.index.json``). The model is built on the ``meta`` device, allocated once, and
filled tensor by tensor through ``safetensors.safe_open``, fusing q/k/v into ``wqkv`` and
gate/up into ``w13`` by copying each checkpoint tensor into its rows: peak memory stays near the
model size. Everything is checked before any tensor is read; problems raise one
:class:`~perfscope.errors.CheckpointError` that lists them. Nothing is ever downloaded.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from perfscope.errors import CheckpointError

from .model import ModelArgs, Transformer

ARCHITECTURES = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2"}
INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
_SAVE_HINT = "save it with save_pretrained(..., safe_serialization=True); .bin checkpoints are not read"
_MAX_LISTED = 8


@dataclass(frozen=True)
class Source:
    """Where the rows [row, row + shape[0]) of one engine parameter come from."""

    hf_name: str
    row: int
    shape: tuple[int, ...]


def read_config(folder: Path) -> dict[str, Any]:
    """Parse ``config.json``; a missing or invalid file is a CheckpointError."""
    path = folder / "config.json"
    if not folder.is_dir():
        raise CheckpointError(folder, "no such checkpoint folder", hint="give a local folder with config.json")
    if not path.is_file():
        raise CheckpointError(folder, "config.json is missing", hint=_SAVE_HINT)
    try:
        return dict(json.loads(path.read_text()))
    except (ValueError, OSError) as exc:
        raise CheckpointError(path, f"not valid JSON ({exc})") from exc


def _family(config: dict[str, Any], folder: Path) -> str:
    archs = config.get("architectures") or []
    for arch in archs:
        if arch in ARCHITECTURES:
            return ARCHITECTURES[arch]
    if not archs and config.get("model_type") in ARCHITECTURES.values():
        return str(config["model_type"])
    found = ", ".join(archs) or f"model_type {config.get('model_type')!r}"
    raise CheckpointError(folder, f"architecture {found} is not supported",
                          hint=f"supported: {', '.join(ARCHITECTURES)}")


def _rope(config: dict[str, Any]) -> tuple[float, dict[str, Any] | None]:
    params = dict(config.get("rope_parameters") or config.get("rope_scaling") or {})
    theta = float(params.pop("rope_theta", config.get("rope_theta", 10000.0)))
    kind = params.get("rope_type", params.get("type", "default"))
    return theta, (None if kind == "default" else params)


def args_from_config(config: dict[str, Any], folder: Path, name: str) -> ModelArgs:
    """Map a Hugging Face config dict to :class:`ModelArgs` (unsupported features are errors)."""
    family = _family(config, folder)
    unsupported = [k for k in ("mlp_bias", "use_sliding_window") if config.get(k)]
    if config.get("hidden_act", "silu") != "silu":
        unsupported.append(f"hidden_act={config['hidden_act']}")
    if unsupported:
        raise CheckpointError(folder, f"unsupported config: {', '.join(unsupported)}")
    theta, scaling = _rope(config)
    try:
        n_head = int(config["num_attention_heads"])
        return ModelArgs(
            name=name, vocab_size=int(config["vocab_size"]), n_layer=int(config["num_hidden_layers"]),
            n_head=n_head, n_kv_head=int(config.get("num_key_value_heads") or n_head),
            dim=int(config["hidden_size"]), intermediate_size=int(config["intermediate_size"]),
            head_dim=int(config.get("head_dim") or 0),
            max_seq_len=int(config.get("max_position_embeddings", 2048)),
            rope_theta=theta, rope_scaling=scaling, norm_eps=float(config.get("rms_norm_eps", 1e-6)),
            qkv_bias=family == "qwen2" or bool(config.get("attention_bias")),
            tie_embeddings=bool(config.get("tie_word_embeddings", False)),
            extra={"architecture": family},
        )
    except KeyError as exc:
        raise CheckpointError(folder / "config.json", f"missing key {exc}") from exc


def tensor_plan(args: ModelArgs) -> dict[str, list[Source]]:
    """Engine parameter name -> the Hugging Face tensors that fill it, in row order."""
    h, kv, d, f = args.n_head * args.head_dim, args.n_kv_head * args.head_dim, args.dim, args.intermediate_size
    plan: dict[str, list[Source]] = {"tok_embeddings.weight": [Source("model.embed_tokens.weight", 0, (args.vocab_size, d))],
                                     "norm.weight": [Source("model.norm.weight", 0, (d,))]}
    if not args.tie_embeddings:
        plan["output.weight"] = [Source("lm_head.weight", 0, (args.vocab_size, d))]
    for i in range(args.n_layer):
        hf, me = f"model.layers.{i}.", f"layers.{i}."
        attn = hf + "self_attn."
        plan[me + "attention.wqkv.weight"] = [Source(attn + "q_proj.weight", 0, (h, d)),
                                              Source(attn + "k_proj.weight", h, (kv, d)),
                                              Source(attn + "v_proj.weight", h + kv, (kv, d))]
        if args.qkv_bias:
            plan[me + "attention.wqkv.bias"] = [Source(attn + "q_proj.bias", 0, (h,)),
                                                Source(attn + "k_proj.bias", h, (kv,)),
                                                Source(attn + "v_proj.bias", h + kv, (kv,))]
        plan[me + "attention.wo.weight"] = [Source(attn + "o_proj.weight", 0, (d, h))]
        plan[me + "feed_forward.w13.weight"] = [Source(hf + "mlp.gate_proj.weight", 0, (f, d)),
                                                Source(hf + "mlp.up_proj.weight", f, (f, d))]
        plan[me + "feed_forward.w2.weight"] = [Source(hf + "mlp.down_proj.weight", 0, (d, f))]
        plan[me + "attention_norm.weight"] = [Source(hf + "input_layernorm.weight", 0, (d,))]
        plan[me + "ffn_norm.weight"] = [Source(hf + "post_attention_layernorm.weight", 0, (d,))]
    return plan


def tensor_files(folder: Path) -> dict[str, Path]:
    """Hugging Face tensor name -> the safetensors file that holds it."""
    index = folder / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (ValueError, KeyError, OSError) as exc:
            raise CheckpointError(index, f"not a safetensors index ({exc})") from exc
        files = {name: folder / shard for name, shard in weight_map.items()}
        missing = sorted({p.name for p in files.values() if not p.is_file()})
        if missing:
            raise CheckpointError(folder, f"shard files listed in {INDEX_FILE} are missing: {_listed(missing)}")
        return files
    single = folder / SINGLE_FILE
    if not single.is_file():
        raise CheckpointError(folder, f"neither {SINGLE_FILE} nor {INDEX_FILE} found", hint=_SAVE_HINT)
    return {name: single for name in _open(single).keys()}  # noqa: SIM118 - safe_open is not iterable


def _open(path: Path) -> Any:
    from safetensors import safe_open

    try:
        return safe_open(str(path), framework="pt", device="cpu")
    except Exception as exc:  # safetensors raises its own SafetensorError / OSError
        raise CheckpointError(path, f"cannot read safetensors file ({exc})") from exc


def _listed(names: list[str]) -> str:
    more = f" and {len(names) - _MAX_LISTED} more" if len(names) > _MAX_LISTED else ""
    return ", ".join(names[:_MAX_LISTED]) + more


def check_tensors(plan: dict[str, list[Source]], files: dict[str, Path], args: ModelArgs, folder: Path) -> None:
    """Raise one CheckpointError listing missing, unexpected and mis-shaped tensors."""
    wanted = {s.hf_name: s.shape for sources in plan.values() for s in sources}
    optional = {"lm_head.weight"} if args.tie_embeddings else set()
    present = set(files)
    missing = sorted(set(wanted) - present)
    unexpected = sorted(n for n in present - set(wanted) - optional if not n.endswith("rotary_emb.inv_freq"))
    handles = {path: _open(path) for path in set(files.values())}
    wrong = []
    for name in sorted(set(wanted) & present):
        shape = tuple(handles[files[name]].get_slice(name).get_shape())
        if shape != wanted[name]:
            wrong.append(f"{name} {list(shape)} (expected {list(wanted[name])})")
    problems = [f"{label}: {_listed(names)}" for label, names in
                (("missing tensors", missing), ("unexpected tensors", unexpected), ("wrong shapes", wrong)) if names]
    if problems:
        raise CheckpointError(folder, "; ".join(problems),
                              hint=f"is it a {args.extra.get('architecture', 'Llama')} checkpoint matching config.json?")


def load_checkpoint(path: str | Path, *, device: torch.device | str = "cpu",
                    dtype: torch.dtype = torch.float32, attention: str = "sdpa") -> Transformer:
    """Build a :class:`Transformer` from a local Hugging Face checkpoint folder."""
    folder = Path(path).expanduser()
    config = read_config(folder)
    args = args_from_config(config, folder, name=folder.name).with_(attention=attention)
    plan = tensor_plan(args)
    files = tensor_files(folder)
    check_tensors(plan, files, args, folder)
    with torch.device("meta"):
        model = Transformer(args).to(dtype)
    model = model.to_empty(device=device)
    if args.tie_embeddings:
        model.output.weight = model.tok_embeddings.weight
    _fill(model, plan, files)
    return model.eval()


def _fill(model: Transformer, plan: dict[str, list[Source]], files: dict[str, Path]) -> None:
    params = dict(model.named_parameters())
    handles = {path: _open(path) for path in set(files.values())}
    with torch.no_grad():
        for target, sources in plan.items():
            param = params[target]
            for src in sources:
                tensor = handles[files[src.hf_name]].get_tensor(src.hf_name)
                param[src.row:src.row + src.shape[0]].copy_(tensor)
