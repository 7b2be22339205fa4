"""The family table of the tiny-model writer: what one architecture's tiny GGUF holds.

Each `FamilySpec` says, as data, what distinguishes an architecture's tensors and metadata (norm kind
and placement, fused or separate projections, biases, q/k norms, the feed-forward kind, sliding-window
and recurrent layer patterns, extra hyperparameters); `layer_tensors` turns a spec into one block's
tensor list. Shapes follow llama.cpp's `load_arch_tensors` (src/models/*.cpp of the pinned sources),
written here numpy-style as (out, in). `skippy.testing.tiny_models` writes the files.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gguf.constants import MODEL_TENSOR as T
from gguf.constants import Keys

Tensor = tuple[T, str, tuple[int, ...]]  # (tensor, "weight" | "bias", numpy shape)


@dataclass(frozen=True)
class FamilySpec:
    """What distinguishes one family's tiny model from another's."""

    rope_freq_base: float = 1000000.0
    norm_eps: float = 1e-6
    layer_norm: bool = False  # LayerNorm (eps key layer_norm_epsilon) instead of RMSNorm
    norm_bias: bool = False  # the LayerNorms carry a bias (StarCoder2)
    norms: str = "pre"  # "pre": attn_norm + ffn_norm; "sandwich": + post norms (Gemma 3); "post": post only (OLMo 2);
    # "parallel": one attn_norm feeding attention and FFN side by side (Cohere 2)
    tied_output: bool = True  # no output.weight: the head reuses token_embd
    fused_qkv: bool = False  # one attn_qkv (Phi-3)
    qkv_bias: bool = False  # attn_{q,k,v}.bias (Qwen2, StarCoder2)
    out_bias: bool = False  # attn_output.bias and the FFN biases (StarCoder2)
    qk_norm: str = ""  # "head": q/k norm over each head (Qwen3, Gemma 3); "full": over all heads (OLMo 2)
    ffn: str = "gated"  # "gated": gate/up/down; "fused": up holds gate and up (Phi-3); "plain": up/down (GELU); "moe"
    sliding_window: int = 0  # >0: sliding-window attention on local layers
    swa_period: int = 0  # every swa_period-th layer is global, the rest local
    attention_period: int = 0  # >0: hybrid, only layers il % attention_period == attention_period - 1 attend;
    # the others are short-convolution (recurrent) layers (LFM2)
    n_expert: int = 0  # MoE: experts per layer, 2 of them used per token
    metadata: tuple[tuple[str, Any], ...] = ()  # extra (key template, value): "{arch}." keys of the family
    output_norm: T = T.OUTPUT_NORM
    model_name: str = ""  # general.name when "tiny-FAMILY" would not do
    swa_array: bool = False  # the sliding-window pattern written as a per-layer array (MiMo-V2 requires one)
    nextn: int = 0  # NextN (MTP) blocks appended after the trunk: blk.{n_layer}.nextn.* (docs/mtp.md)
    extra_tensors: tuple[T, ...] = ()  # tensors llama.cpp loads for the architecture that gguf-py does not list


FAMILY_SPECS: dict[str, FamilySpec] = {
    "llama": FamilySpec(500000.0, 1e-5, tied_output=False),
    # Gemma 3: no final logit softcapping (unlike Gemma 2); the real period is 6, 3 fits few layers.
    "gemma3": FamilySpec(norms="sandwich", qk_norm="head", sliding_window=32, swa_period=3),
    "qwen2": FamilySpec(qkv_bias=True),
    "qwen3": FamilySpec(qk_norm="head"),
    # Phi-3: llama.cpp looks Phi-3's special tokens up when general.name mentions "phi3"; this vocabulary has none.
    "phi3": FamilySpec(10000.0, 1e-5, tied_output=False, fused_qkv=True, ffn="fused", model_name="tiny-phi-iii"),
    "olmo2": FamilySpec(500000.0, 1e-6, tied_output=False, norms="post", qk_norm="full"),
    # Granite: the embedding, residual, attention and logit scales are its own hyperparameters.
    "granite": FamilySpec(10000.0, 1e-5, metadata=(
        (Keys.LLM.EMBEDDING_SCALE, 3.0), (Keys.LLM.RESIDUAL_SCALE, 0.5), (Keys.LLM.LOGIT_SCALE, 0.75),
        (Keys.Attention.SCALE, 0.3))),
    "starcoder2": FamilySpec(100000.0, 1e-5, layer_norm=True, norm_bias=True, qkv_bias=True, out_bias=True,
                             ffn="plain"),
    "qwen3moe": FamilySpec(qk_norm="head", ffn="moe", n_expert=4),
    # SmolLM3: every 4th layer (il % 4 == 3) has no RoPE, a rule llama.cpp hard-codes by layer index.
    "smollm3": FamilySpec(5000000.0, 1e-6),
    # Cohere 2: LayerNorm without bias, parallel attention + FFN, sliding window (the real period is 4), logit scale.
    "cohere2": FamilySpec(50000.0, 1e-5, layer_norm=True, norms="parallel", sliding_window=32, swa_period=3,
                          metadata=((Keys.LLM.LOGIT_SCALE, 0.5),)),
    # MTP: MiMo-V2's layout (fused QKV, a separate head, sliding-window layers by an explicit per-layer array)
    # plus one NextN block, whose MTP graph llama.cpp builds (src/models/mimo2.cpp graph_mtp); docs/mtp.md.
    "mimo2": FamilySpec(10000.0, 1e-5, tied_output=False, fused_qkv=True, sliding_window=32, swa_period=3,
                        swa_array=True, nextn=1,
                        metadata=((Keys.LLM.EXPERT_FEED_FORWARD_LENGTH, 0),),  # llama.cpp requires the key
                        extra_tensors=(T.ATTN_QKV, T.NEXTN_EH_PROJ, T.NEXTN_ENORM, T.NEXTN_HNORM)),
    # LFM2: short-convolution (recurrent) layers with an attention layer every third; head_count_kv 0 on conv layers.
    "lfm2": FamilySpec(1000000.0, 1e-5, qk_norm="head", attention_period=3, output_norm=T.TOKEN_EMBD_NORM,
                       metadata=((Keys.ShortConv.L_CACHE, 3),)),
}

FAMILIES: tuple[str, ...] = tuple(FAMILY_SPECS)
FAMILY_ALIASES: dict[str, str] = {"mtp": "mimo2"}  # `tiny_models mtp OUT.gguf`: the family with a NextN block


def is_attention_layer(spec: FamilySpec, il: int) -> bool:
    """False for a hybrid family's recurrent layers."""
    return not spec.attention_period or il % spec.attention_period == spec.attention_period - 1


def _norm(tensor: T, n: int, spec: FamilySpec) -> list[Tensor]:
    shape: tuple[int, ...] = (n,)
    return [(tensor, suffix, shape) for suffix in ("weight", "bias")[:2 if spec.norm_bias else 1]]


def _attention(spec: FamilySpec, n_embd: int, n_q: int, n_kv: int) -> list[Tensor]:
    if spec.fused_qkv:
        return [(T.ATTN_QKV, "weight", (n_q + 2 * n_kv, n_embd)), (T.ATTN_OUT, "weight", (n_embd, n_q))]
    return [(T.ATTN_Q, "weight", (n_q, n_embd)), (T.ATTN_K, "weight", (n_kv, n_embd)),
            (T.ATTN_V, "weight", (n_kv, n_embd)), (T.ATTN_OUT, "weight", (n_embd, n_q))]


def _attention_extras(spec: FamilySpec, n_embd: int, n_q: int, n_kv: int, head_dim: int) -> list[Tensor]:
    """Biases and q/k norms (after the block's matrices, as the writer always laid them out)."""
    out: list[Tensor] = []
    if spec.qkv_bias:
        out += [(T.ATTN_Q, "bias", (n_q,)), (T.ATTN_K, "bias", (n_kv,)), (T.ATTN_V, "bias", (n_kv,))]
    if spec.out_bias:
        out.append((T.ATTN_OUT, "bias", (n_embd,)))
    if spec.qk_norm == "head":
        out += [(T.ATTN_Q_NORM, "weight", (head_dim,)), (T.ATTN_K_NORM, "weight", (head_dim,))]
    elif spec.qk_norm == "full":
        out += [(T.ATTN_Q_NORM, "weight", (n_q,)), (T.ATTN_K_NORM, "weight", (n_kv,))]
    return out


def _short_conv(spec: FamilySpec, n_embd: int) -> list[Tensor]:
    l_cache = dict(spec.metadata)[Keys.ShortConv.L_CACHE]
    return [(T.SHORTCONV_CONV, "weight", (n_embd, l_cache)), (T.SHORTCONV_INPROJ, "weight", (3 * n_embd, n_embd)),
            (T.SHORTCONV_OUTPROJ, "weight", (n_embd, n_embd))]


def _ffn(spec: FamilySpec, n_embd: int, n_ff: int) -> list[Tensor]:
    if spec.ffn == "moe":
        n_ff_exp = n_ff // 2
        return [(T.FFN_GATE_INP, "weight", (spec.n_expert, n_embd)),
                (T.FFN_GATE_EXP, "weight", (spec.n_expert, n_ff_exp, n_embd)),
                (T.FFN_UP_EXP, "weight", (spec.n_expert, n_ff_exp, n_embd)),
                (T.FFN_DOWN_EXP, "weight", (spec.n_expert, n_embd, n_ff_exp))]
    if spec.ffn == "fused":
        return [(T.FFN_UP, "weight", (2 * n_ff, n_embd)), (T.FFN_DOWN, "weight", (n_embd, n_ff))]
    gate: list[Tensor] = [] if spec.ffn == "plain" else [(T.FFN_GATE, "weight", (n_ff, n_embd))]
    return gate + [(T.FFN_UP, "weight", (n_ff, n_embd)), (T.FFN_DOWN, "weight", (n_embd, n_ff))]


def layer_tensors(spec: FamilySpec, il: int, n_embd: int, n_head: int, n_head_kv: int, n_ff: int) -> list[Tensor]:
    """The tensors of block `il`: norms and matrices in the order the writer has always used (weights are
    drawn in this order, so it fixes every file's bytes), then biases and the other norms."""
    head_dim = n_embd // n_head
    n_q, n_kv = n_head * head_dim, n_head_kv * head_dim
    attends = is_attention_layer(spec, il)
    out = _norm(T.ATTN_NORM, n_embd, spec) if spec.norms != "post" else []
    out += _attention(spec, n_embd, n_q, n_kv) if attends else _short_conv(spec, n_embd)
    if spec.norms in ("pre", "sandwich"):
        out += _norm(T.FFN_PRE_NORM if spec.norms == "sandwich" else T.FFN_NORM, n_embd, spec)
    out += _ffn(spec, n_embd, n_ff)
    out += _attention_extras(spec, n_embd, n_q, n_kv, head_dim) if attends else []
    if spec.out_bias:
        out += [(T.FFN_UP, "bias", (n_ff,)), (T.FFN_DOWN, "bias", (n_embd,))]
    if spec.norms in ("sandwich", "post"):
        out += _norm(T.ATTN_POST_NORM, n_embd, spec) + _norm(T.FFN_POST_NORM, n_embd, spec)
    return out


def nextn_tensors(spec: FamilySpec, il: int, n_embd: int, n_head: int, n_head_kv: int, n_ff: int) -> list[Tensor]:
    """A NextN (MTP) block at index `il`: a trunk-shaped decoder block, then eh_proj (the concatenated token
    embedding and hidden state, 2 * n_embd, projected to n_embd) and its two input norms."""
    return layer_tensors(spec, il, n_embd, n_head, n_head_kv, n_ff) + [
        (T.NEXTN_EH_PROJ, "weight", (n_embd, 2 * n_embd)), (T.NEXTN_ENORM, "weight", (n_embd,)),
        (T.NEXTN_HNORM, "weight", (n_embd,))]


def swa_layers(spec: FamilySpec, n_layer: int) -> list[bool]:
    """Per block, whether it uses the sliding window (every swa_period-th is global; NextN blocks are global)."""
    trunk = [il % spec.swa_period < spec.swa_period - 1 for il in range(n_layer)]
    return trunk + [False] * spec.nextn


def family_metadata(spec: FamilySpec, n_layer: int, n_head_kv: int, n_ff: int) -> list[tuple[str, Any]]:
    """(key template, value) of the family's hyperparameters beyond the common ones."""
    out = list(spec.metadata)
    if spec.nextn:
        out.append((Keys.LLM.NEXTN_PREDICT_LAYERS, spec.nextn))
    if spec.n_expert:
        out += [(Keys.LLM.EXPERT_COUNT, spec.n_expert), (Keys.LLM.EXPERT_USED_COUNT, 2),
                (Keys.LLM.EXPERT_FEED_FORWARD_LENGTH, n_ff // 2)]
    if spec.attention_period:
        out.append((Keys.Attention.HEAD_COUNT_KV,
                    [n_head_kv if is_attention_layer(spec, il) else 0 for il in range(n_layer)]))
    return out
