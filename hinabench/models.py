"""The model registry: the expert-FFN and attention shapes of the MoE models the paper evaluates.

Every field comes from the model's public `config.json` on the Hugging Face Hub (the file named in
`source`). A new model is one entry in MODELS.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from .errors import UserError


@dataclass(frozen=True)
class Model:
    name: str
    hidden_size: int          # H: rows of w_down, columns of w_gate / w_up
    intermediate_size: int    # I: the routed expert's intermediate size (moe_intermediate_size)
    routed_experts: int       # E
    top_k: int                # experts per token
    shared_experts: int
    layers: int
    attention_heads: int
    kv_heads: int
    head_dim: int
    vocab_size: int
    source: str               # the public config the numbers come from
    # Dense projections whose shape is not the GQA pattern below (DeepSeek's MLA): name -> (N, K)
    projection_override: tuple[tuple[str, int, int], ...] = ()
    # Attention facts (config.json): rope_theta, whether q/k get a per-head RMSNorm before RoPE (Qwen3's
    # q_norm / k_norm), and the attention kind: "gqa" (h_q query heads share h_kv KV heads of head_dim)
    # or "mla" (DeepSeek's multi-head latent attention; see attention_unsupported).
    rope_theta: float = 10000.0
    qk_norm: bool = False
    attention: str = "gqa"

    def expert_bytes(self, bytes_per_weight: float = 2.0) -> int:
        """Bytes of one routed expert's three matrices (gate, up: I x H; down: H x I)."""
        return int(3 * self.hidden_size * self.intermediate_size * bytes_per_weight)

    def projections(self) -> dict[str, tuple[int, int]]:
        """The dense projections of one layer and the LM head, name -> (N out, K in), nn.Linear's
        [out, in] layout: GQA's fused qkv ((h_q + 2 h_kv) * d x H) and o (H x h_q * d), and lm_head
        (vocab x H); a model with another attention (MLA) lists its own."""
        if self.projection_override:
            out = {name: (n, k) for name, n, k in self.projection_override}
        else:
            d = self.head_dim
            out = {"qkv": ((self.attention_heads + 2 * self.kv_heads) * d, self.hidden_size),
                   "o": (self.hidden_size, self.attention_heads * d)}
        out["lm_head"] = (self.vocab_size, self.hidden_size)
        return out

    @property
    def group_size(self) -> int:
        """Query heads per KV head (GQA's group G: the small M operand of decode attention)."""
        return self.attention_heads // self.kv_heads

    def attention_unsupported(self) -> str:
        """Why hinabench's `attention` problem kind has no case for this model, or '' if it has one."""
        if self.attention == "mla":
            return ("MLA: the absorbed decode form is MQA over a 576-wide latent (512 kv_lora_rank + 64 rope) "
                    "with a 512-wide V, 128 query heads and one KV head; hinabench's attention kernels take "
                    "head_dim <= 256 with K and V of one width, so DeepSeek-V3 is left out on purpose")
        return ""

    def as_dict(self) -> dict:
        d = asdict(self)
        d.pop("projection_override")
        d["projections"] = {k: list(v) for k, v in self.projections().items()}
        return d


MODELS: dict[str, Model] = {m.name: m for m in [
    # Paper Table 3 (FFN kernel evaluation)
    Model("mixtral-8x7b", 4096, 14336, 8, 2, 0, 32, 32, 8, 128, 32000,
          "mistralai/Mixtral-8x7B-v0.1/config.json", rope_theta=1e6),
    Model("mixtral-8x22b", 6144, 16384, 8, 2, 0, 56, 48, 8, 128, 32768,
          "mistralai/Mixtral-8x22B-v0.1/config.json", rope_theta=1e6),
    # DeepSeek-V3 uses MLA: head_dim is qk_nope_head_dim + qk_rope_head_dim = 128 + 64 (v: 128);
    # the first 3 of its 61 layers are dense (first_k_dense_replace = 3).
    # MLA projections (q_lora_rank 1536, kv_lora_rank 512, qk_rope_head_dim 64, v_head_dim 128):
    # q_a 7168 -> 1536, q_b 1536 -> 128 x 192, kv_a (with MQA rope) 7168 -> 512 + 64,
    # kv_b 512 -> 128 x (128 + 128), o 128 x 128 -> 7168.
    Model("deepseek-v3", 7168, 2048, 256, 8, 1, 61, 128, 128, 192, 129280,
          "deepseek-ai/DeepSeek-V3/config.json",
          (("q_a", 1536, 7168), ("q_b", 128 * 192, 1536), ("kv_a", 512 + 64, 7168),
           ("kv_b", 128 * 256, 512), ("o", 7168, 128 * 128)),
          rope_theta=10000.0, attention="mla"),   # + YaRN rope_scaling (factor 40) on the 64 rope dims
    Model("qwen3-235b-a22b", 4096, 1536, 128, 8, 0, 94, 64, 4, 128, 151936,
          "Qwen/Qwen3-235B-A22B/config.json", rope_theta=1e6, qk_norm=True),
    # The paper's end-to-end models
    Model("qwen3-30b-a3b", 2048, 768, 128, 8, 0, 48, 32, 4, 128, 151936,
          "Qwen/Qwen3-30B-A3B/config.json", rope_theta=1e6, qk_norm=True),
    # Qwen2-57B-A14B's shared expert has intermediate size 20480 (shared_expert_intermediate_size).
    Model("qwen2-57b-a14b", 3584, 2560, 64, 8, 1, 28, 28, 4, 128, 151936,
          "Qwen/Qwen2-57B-A14B/config.json", rope_theta=1e6),
]}


class UnknownModel(UserError, ValueError):
    pass


def get_model(name: str) -> Model:
    key = name.strip().lower()
    if key not in MODELS:
        raise UnknownModel(f"unknown model '{name}'; known models: {', '.join(MODELS)}")
    return MODELS[key]
