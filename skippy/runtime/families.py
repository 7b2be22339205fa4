"""The family table: the architectures skippy splits, and what each needs of a split.

Each `Family` says what a slice of that architecture must do differently (layer-indexed behaviour
llama.cpp derives from metadata, metadata that must not reach a later stage), where it must not be
cut, and what its state allows (recurrent layers: no prefix cache; rewinds only inside the last
window). docs/families.md is generated from this table and the tests that prove each row
(`python -m skippy.runtime.families --write docs/families.md`; tests/runtime/test_families_doc.py
keeps it current).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["FAMILIES", "Family", "family", "split_point_problem", "supported_architectures", "unsupported_message"]

FAMILY_TABLE_DOC = "docs/families.md"


@dataclass(frozen=True)
class Family:
    """One architecture's rules for a split."""

    architecture: str
    mechanisms: str  # what the architecture exercises, for the table
    swa_period: int = 0  # >0: sliding-window layers by period when the file gives no explicit pattern
    stage_start_multiple: int = 1  # every stage must start at a multiple of this layer index
    split_rule: str = ""  # why stage_start_multiple is what it is
    token_input_keys: tuple[str, ...] = ()  # metadata that scales token embeddings only: dropped past stage 0
    recurrent: bool = False  # recurrent layers: state that cannot be trimmed by position
    slice_needs: tuple[str, ...] = ()  # "sliding-window", "attention", "recurrent": kinds of layer every
    # slice needs one of (skippy.runtime.layer_kinds)

    @property
    def prefix_cache(self) -> bool:
        return not self.recurrent

    def refusal(self) -> str:
        """Why the prefix cache is off for this family ('' when it is on)."""
        if not self.recurrent:
            return ""
        return (f"prefix cache off for {self.architecture}: its recurrent layers keep one running state per "
                f"session, which cannot be cut back to a cached prefix by position")


FAMILIES: dict[str, Family] = {f.architecture: f for f in (
    Family("llama", "dense GQA, separate output head (Llama, Mistral, SmolLM2)"),
    Family("gemma3", "sliding-window + global layers by index, q/k norms, sandwich norms, tied head",
           swa_period=6),
    Family("qwen2", "dense GQA, q/k/v biases, tied head"),
    Family("qwen3", "dense GQA, per-head q/k norms, tied head"),
    Family("phi3", "fused QKV and gate/up projections"),
    Family("olmo2", "post-norms only, q/k norms over all heads"),
    Family("granite", "embedding, residual, attention and logit scales", token_input_keys=("embedding_scale",)),
    Family("starcoder2", "LayerNorm with biases, plain GELU MLP, biases everywhere"),
    Family("qwen3moe", "mixture of experts (4 experts, 2 used), per-head q/k norms"),
    Family("smollm3", "no RoPE on every 4th layer (hard-coded by layer index)", stage_start_multiple=4,
           split_rule="llama.cpp skips RoPE on layers il % 4 == 3 by the slice's own layer index, so every "
                      "stage must start at a multiple of 4"),
    Family("cohere2", "LayerNorm, parallel attention + FFN, sliding-window layers by index, logit scale",
           swa_period=4, slice_needs=("sliding-window",)),
    Family("mimo2", "fused QKV, sliding-window layers by a per-layer array, separate head; a NextN (MTP) block "
           "that travels with the final stage (docs/mtp.md)", swa_period=4, slice_needs=("sliding-window",)),
    Family("lfm2", "hybrid: short-convolution (recurrent) layers and attention layers", recurrent=True,
           slice_needs=("attention", "recurrent")),
)}


def supported_architectures() -> tuple[str, ...]:
    return tuple(FAMILIES)


def unsupported_message(arch: str) -> str:
    return (f"unsupported architecture {arch!r} (supported: {', '.join(FAMILIES)}; "
            f"what each needs of a split: {FAMILY_TABLE_DOC})")


def family(arch: str) -> Family:
    """The family of `arch`; ValueError naming the supported ones otherwise."""
    try:
        return FAMILIES[arch]
    except KeyError:
        raise ValueError(unsupported_message(arch)) from None


def split_point_problem(arch: str, layer_start: int) -> str:
    """Why a stage of `arch` may not start at `layer_start` ('' when it may)."""
    fam = FAMILIES.get(arch)
    if fam is None or layer_start % fam.stage_start_multiple == 0:
        return ""
    return f"{arch} may not be split at layer {layer_start}: {fam.split_rule}"


CHECKED = ("split == unsplit bitwise: prompt logits at every position and 32 greedy steps at every split set the "
           "rules allow (tests/runtime/test_runtime_split_exactness.py); 4 sessions batched, verify-shaped windows "
           "and rewinds (tests/runtime/test_runtime_batching.py); slice metadata and tensors "
           "(tests/runtime/test_runtime_slices.py)")


def _row(fam: Family) -> str:
    rules = [fam.split_rule] if fam.split_rule else []
    rules += [f"every slice needs a {kind} layer: a non-final slice gets one as its stop block, a final slice "
              f"without one is refused" for kind in fam.slice_needs]
    if fam.token_input_keys:
        rules.append(f"{', '.join(fam.token_input_keys)} dropped past stage 0")
    if fam.recurrent:
        speculation = ("rewinds inside the last window only (llama.cpp's per-token state snapshots); further back "
                       "refused; mixed-length batches run window by window on non-final stages (within batch "
                       "variance, not bitwise)")
    else:
        speculation = "exact (KV trimmed by position)"
    prefix = "off, logged at start (`prefix_cache_off`)" if fam.recurrent else "on (KV kept by position)"
    return " | ".join(["", f"`{fam.architecture}`", fam.mechanisms, "; ".join(rules) or "any layer",
                       "f32 (bitwise)", speculation, prefix, ""]).strip()


def family_table_markdown() -> str:
    """docs/families.md, generated from FAMILIES."""
    lines = [
        "# Model families",
        "",
        "Generated from `skippy/runtime/families.py` (`python -m skippy.runtime.families --write "
        "docs/families.md`); tests/runtime/test_families_doc.py fails when it is stale. Each row is a tiny "
        "random-weight model of the architecture (`python -m skippy.testing.tiny_models FAMILY OUT.gguf`), "
        "6 layers, checked as follows:",
        "",
        f"- {CHECKED}.",
        "- A split a family's rules refuse is refused at load and by `skippy check-config`, naming the rule.",
        "- Wire formats: f32 is bitwise; f16 and q8 are certified when a pipeline starts with them: stage 0 compares "
        "the final stage's argmax with f32's through the real split and refuses a format that disagrees, or under "
        "`--activation-wire-dtype auto` uses the smallest that passes (docs/activation-wire-dtype.md, 'Certified at "
        "startup'; measured there: the tiny llama, gemma3 and qwen2 pass q8 and f16, Gemma 3 270M passes f16 and is "
        "refused q8).",
        "",
        "| architecture | mechanisms | split-point rules | certified wire | speculation rewinds | prefix cache |",
        "|---|---|---|---|---|---|",
        *(_row(fam) for fam in FAMILIES.values()),
        "",
        "An architecture not listed here is refused at load with this list and a pointer to this page.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(description="Print (or --write) the family table, docs/families.md.")
    parser.add_argument("--write", type=str, default=None, metavar="PATH")
    args = parser.parse_args(argv)
    if args.write is None:
        print(family_table_markdown(), end="")
        return
    with open(args.write, "w", encoding="utf-8") as out:
        out.write(family_table_markdown())


if __name__ == "__main__":
    main()
