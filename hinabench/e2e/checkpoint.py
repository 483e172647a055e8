"""Synthetic-weight Hugging Face checkpoints of the registry's MoE models, cut to a few layers.

A checkpoint is config.json (the model's public config with num_hidden_layers = N), safetensors
shards in the Hub's own tensor names (one shard per layer, one for the embedding, norm and LM head:
transformers, vLLM and llama.cpp's converter all read that layout) and a tokenizer whose vocabulary
is the model's (`<0> ... <V-1>`, one word per id, so any id sequence round-trips). The weights come from
the project's seeded fill (problems.base.fill_bf16 over seed_for(seed, tensor name)), so the same
(config, seed) gives the same bytes in any process. Written once, under a folder named by a hash of
the config, the seed and this writer's version; a finished checkpoint has a `.complete` marker.

What fits in 24 GiB (bf16 on disk and in memory, embedding + LM head included):
  qwen3-30b-a3b   1.24 GB per layer + 1.25 GB   (4 layers ~6.2 GB)
  mixtral-8x7b    2.82 GB per layer + 0.26 GB   (2 layers ~5.9 GB)
  qwen2-57b-a14b  3.97 GB per layer + 2.18 GB   (1 layer ~6.2 GB)
The fp32 reference (validation) doubles that: it runs at the smallest depth asked for.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import UserError
from ..models import Model, get_model

WRITER_VERSION = 2

# The config.json fields the registry does not carry, from the same public configs (models.py `source`).
HF_CONFIGS: dict[str, dict] = {
    "qwen3-30b-a3b": {
        "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
        "intermediate_size": 6144, "max_position_embeddings": 40960, "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-6, "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": [],
        "attention_bias": False, "tie_word_embeddings": False, "hidden_act": "silu",
        "bos_token_id": 151643, "eos_token_id": 151645, "sliding_window": None, "use_sliding_window": False,
    },
    "mixtral-8x7b": {
        "architectures": ["MixtralForCausalLM"], "model_type": "mixtral",
        "max_position_embeddings": 32768, "rope_theta": 1000000.0, "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False, "hidden_act": "silu", "sliding_window": None,
        "bos_token_id": 1, "eos_token_id": 2, "router_aux_loss_coef": 0.02,
    },
    "qwen2-57b-a14b": {
        "architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe",
        "intermediate_size": 18944, "shared_expert_intermediate_size": 20480,
        "max_position_embeddings": 32768, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6,
        "norm_topk_prob": False, "decoder_sparse_step": 1, "mlp_only_layers": [], "qkv_bias": True,
        "tie_word_embeddings": False, "hidden_act": "silu", "sliding_window": None,
        "use_sliding_window": False, "bos_token_id": 151643, "eos_token_id": 151643,
    },
}
E2E_MODELS = tuple(HF_CONFIGS)
# Other registry entries that take one of the configurations above (a small test model: its family)
FAMILIES: dict[str, str] = {}


def hf_config(model: str | Model, layers: int) -> dict:
    """The model's config.json with `layers` decoder layers (every one of them an MoE layer)."""
    m = model if isinstance(model, Model) else get_model(model)
    family = FAMILIES.get(m.name, m.name)
    if family not in HF_CONFIGS:
        raise UserError(f"no end-to-end configuration for {m.name}; these have one: {', '.join(E2E_MODELS)}")
    if not (1 <= int(layers) <= m.layers):
        raise UserError(f"--layers must be between 1 and {m.layers} for {m.name} (got {layers})")
    cfg = {"hidden_size": m.hidden_size, "num_hidden_layers": int(layers),
           "num_attention_heads": m.attention_heads, "num_key_value_heads": m.kv_heads, "head_dim": m.head_dim,
           "vocab_size": m.vocab_size, "num_experts_per_tok": m.top_k, "torch_dtype": "bfloat16",
           "initializer_range": 0.02, "use_cache": True, "attention_dropout": 0.0}
    if family == "mixtral-8x7b":
        cfg.update(intermediate_size=m.intermediate_size, num_local_experts=m.routed_experts)
    else:
        cfg.update(moe_intermediate_size=m.intermediate_size, num_experts=m.routed_experts)
    cfg.update(HF_CONFIGS[family])
    if family != m.name:   # a small model of this family: its own sizes where the family has some
        cfg.update(intermediate_size=4 * m.hidden_size, bos_token_id=1, eos_token_id=2)
        if "shared_expert_intermediate_size" in cfg:
            cfg["shared_expert_intermediate_size"] = 2 * m.intermediate_size
        if family == "mixtral-8x7b":
            cfg["intermediate_size"] = m.intermediate_size
    return cfg


def tensor_shapes(cfg: dict) -> dict[str, list[tuple[str, tuple[int, ...], float]]]:
    """Shard name -> [(tensor name, shape, fill scale)] in the Hub's naming (scale 0: ones, a norm)."""
    H, V, L = cfg["hidden_size"], cfg["vocab_size"], cfg["num_hidden_layers"]
    hq, hkv, d = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    mt = cfg["model_type"]
    s = 1.0 / math.sqrt(H)
    shards: dict[str, list] = {"model-embed.safetensors": [
        ("model.embed_tokens.weight", (V, H), 1.0), ("model.norm.weight", (H,), 0.0),
        ("lm_head.weight", (V, H), s)]}
    for i in range(L):
        p = f"model.layers.{i}"
        t = [(f"{p}.input_layernorm.weight", (H,), 0.0), (f"{p}.post_attention_layernorm.weight", (H,), 0.0),
             (f"{p}.self_attn.q_proj.weight", (hq * d, H), s), (f"{p}.self_attn.k_proj.weight", (hkv * d, H), s),
             (f"{p}.self_attn.v_proj.weight", (hkv * d, H), s),
             (f"{p}.self_attn.o_proj.weight", (H, hq * d), 1.0 / math.sqrt(hq * d))]
        if mt == "qwen3_moe":
            t += [(f"{p}.self_attn.q_norm.weight", (d,), 0.0), (f"{p}.self_attn.k_norm.weight", (d,), 0.0)]
        if mt == "qwen2_moe":
            t += [(f"{p}.self_attn.{x}_proj.bias", (n,), 0.02) for x, n in (("q", hq * d), ("k", hkv * d), ("v", hkv * d))]
        if mt == "mixtral":
            E, inter = cfg["num_local_experts"], cfg["intermediate_size"]
            q = f"{p}.block_sparse_moe"
            t.append((f"{q}.gate.weight", (E, H), s))
            for e in range(E):
                t += [(f"{q}.experts.{e}.w1.weight", (inter, H), s), (f"{q}.experts.{e}.w3.weight", (inter, H), s),
                      (f"{q}.experts.{e}.w2.weight", (H, inter), 1.0 / math.sqrt(inter))]
        else:
            E, inter = cfg["num_experts"], cfg["moe_intermediate_size"]
            q = f"{p}.mlp"
            t.append((f"{q}.gate.weight", (E, H), s))
            for e in range(E):
                t += [(f"{q}.experts.{e}.gate_proj.weight", (inter, H), s),
                      (f"{q}.experts.{e}.up_proj.weight", (inter, H), s),
                      (f"{q}.experts.{e}.down_proj.weight", (H, inter), 1.0 / math.sqrt(inter))]
            if mt == "qwen2_moe":
                si = cfg["shared_expert_intermediate_size"]
                t += [(f"{q}.shared_expert.gate_proj.weight", (si, H), s),
                      (f"{q}.shared_expert.up_proj.weight", (si, H), s),
                      (f"{q}.shared_expert.down_proj.weight", (H, si), 1.0 / math.sqrt(si)),
                      (f"{q}.shared_expert_gate.weight", (1, H), s)]
        shards[f"model-layer{i:03d}.safetensors"] = t
    return shards


def checkpoint_bytes(cfg: dict) -> int:
    return sum(2 * math.prod(shape) for ts in tensor_shapes(cfg).values() for _, shape, _ in ts)


def config_hash(cfg: dict, seed: int) -> str:
    text = json.dumps({"config": cfg, "seed": int(seed), "writer": WRITER_VERSION}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def cache_root() -> Path:
    return Path(os.environ.get("HINABENCH_E2E_CACHE") or Path.home() / ".cache" / "hinabench" / "e2e")


@dataclass(frozen=True)
class Checkpoint:
    model: str
    layers: int
    seed: int
    path: Path
    hash: str
    config: dict

    @property
    def bytes(self) -> int:
        return checkpoint_bytes(self.config)


def _make_tensor(name: str, shape: tuple[int, ...], scale: float, seed: int) -> torch.Tensor:
    from ..problems.base import fill_bf16, seed_for
    t = torch.empty(shape, dtype=torch.bfloat16)
    if scale == 0.0:
        t.fill_(1.0)
    else:
        fill_bf16(t, seed_for(seed, name), scale)
    return t


def word(i: int) -> str:
    """The tokenizer's word for id i: `<i>` (bracketed, so no special token is a prefix of another word)."""
    return f"<{i}>"


def write_tokenizer(path: Path, vocab_size: int, bos: int, eos: int) -> None:
    """A word-level tokenizer whose vocabulary is exactly the model's ids: word `<i>` is id i."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    vocab = {word(i): i for i in range(vocab_size)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=word(0)))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")   # joins words with spaces
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": word(bos), "eos_token": word(eos),
        "unk_token": word(0), "pad_token": word(eos), "model_max_length": 1 << 20, "clean_up_tokenization_spaces": False,
    }, indent=1))
    (path / "special_tokens_map.json").write_text(json.dumps(
        {"bos_token": word(bos), "eos_token": word(eos), "unk_token": word(0), "pad_token": word(eos)}))


def checkpoint(model: str, layers: int, seed: int = 0, root: Path | None = None, echo=None) -> Checkpoint:
    """The checkpoint of `model` cut to `layers` layers with weights from `seed`: written on first use,
    then reused (a folder without its `.complete` marker, an interrupted write, is written again)."""
    m = get_model(model)
    cfg = hf_config(m, layers)
    h = config_hash(cfg, seed)
    root = Path(root) if root else cache_root()
    path = root / f"{m.name}-L{int(layers)}-s{int(seed)}-{h}"
    ck = Checkpoint(m.name, int(layers), int(seed), path, h, cfg)
    if (path / ".complete").exists():
        return ck
    need = checkpoint_bytes(cfg)
    _require_writer_packages()
    root.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(root).free
    if free < need + (1 << 30):
        raise UserError(f"writing the {m.name} checkpoint with {layers} layers needs {need / 1e9:.1f} GB; "
                        f"{root} has {free / 1e9:.1f} GB free (HINABENCH_E2E_CACHE picks another folder)")
    if echo:
        echo(f"writing {path.name}: {need / 1e9:.2f} GB of synthetic bf16 weights (seed {seed})")
    tmp = path.with_name(path.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.rmtree(path, ignore_errors=True)
    tmp.mkdir(parents=True)
    from safetensors.torch import save_file
    weight_map = {}
    for shard, tensors in tensor_shapes(cfg).items():
        data = {name: _make_tensor(name, shape, scale, seed) for name, shape, scale in tensors}
        save_file(data, str(tmp / shard), metadata={"format": "pt"})
        weight_map.update({name: shard for name in data})
        del data
    (tmp / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": need}, "weight_map": weight_map}, indent=1))
    (tmp / "config.json").write_text(json.dumps(cfg, indent=1))
    (tmp / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": cfg["bos_token_id"], "eos_token_id": cfg["eos_token_id"], "do_sample": False}))
    write_tokenizer(tmp, cfg["vocab_size"], cfg["bos_token_id"], cfg["eos_token_id"])
    (tmp / "hinabench-checkpoint.json").write_text(json.dumps(
        {"model": m.name, "layers": int(layers), "seed": int(seed), "hash": h, "writer": WRITER_VERSION,
         "bytes": need, "source": m.source}, indent=1))
    (tmp / ".complete").write_text(h + "\n")
    os.sync()   # the GBs written reach the disk now, not in the kernel's writeback under the samples that follow
    os.replace(tmp, path)
    return ck


def _require_writer_packages() -> None:
    """The checkpoint's writers come with the e2e extra: say so instead of failing halfway."""
    import importlib.util
    missing = [p for p in ("safetensors", "tokenizers") if importlib.util.find_spec(p) is None]
    if missing:
        raise UserError(f"writing a checkpoint needs {' and '.join(missing)} (the e2e extra): "
                        f"pip install -e '.[e2e]'")


def prompt_ids(vocab_size: int, batch: int, tokens: int, seed: int = 0) -> torch.Tensor:
    """[batch, tokens] prompt ids, the same in every process (a counter hash, not torch's RNG)."""
    idx = torch.arange(batch * tokens, dtype=torch.int64) + 1
    h = (idx * 0x9E3779B1 + int(seed) * 0x85EBCA77) % (2**31 - 1)
    return (h % (vocab_size - 16) + 8).reshape(batch, tokens)
