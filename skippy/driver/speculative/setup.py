"""Stage 0's speculative decoding from its options: which proposer, which window policy, or none.

- proposer: `--openai-draft-model-path` (a whole small GGUF sharing the target's vocabulary) or the
  plan's `ngram` section (`kind` suffix | cache); both at once is refused, never silently resolved.
- window: `--openai-speculative-window K` fixes k (default: the plan's verify_window.max_tokens, or
  4); with `--openai-adaptive-speculative-window` k moves within [verify_window.min_tokens, K]:
  the cost model (C(rows) calibrated through the pipeline at startup, the hop delay measured) or,
  with `--openai-adaptive-speculative-window-mode simple`, the reference's grow/shrink rule.
Option combinations that cannot work are refused by `skippy.config.serving.unsupported_options`.
"""

from __future__ import annotations

from skippy.config import ServingOptions
from skippy.config.generation import AdaptiveWindowMode
from skippy.config.speculative import NgramKind
from skippy.driver.speculative import ProposerFactory
from skippy.driver.speculative.engine import Speculation
from skippy.driver.speculative.ngram_cache import NgramCacheProposerFactory
from skippy.driver.speculative.suffix import SuffixProposerFactory
from skippy.driver.speculative.window import FixedWindow, SimpleAdaptiveWindow, WindowPolicy
from skippy.runtime.stage_runtime import MAX_DRAFT_TOKENS, StageRuntime

DEFAULT_WINDOW = 4  # the reference's --openai-speculative-window default


def build_speculation(options: ServingOptions, runtime: StageRuntime) -> Speculation | None:
    """The driver's Speculation for these options (None: plain decoding)."""
    spec = options.speculative
    factory: ProposerFactory
    if spec.draft_model_path is not None:
        from skippy.driver.speculative.draft_model import DraftModelProposerFactory

        n_gpu_layers = spec.draft_n_gpu_layers if spec.draft_n_gpu_layers is not None else options.config.n_gpu_layers
        factory = DraftModelProposerFactory(spec.draft_model_path, target_vocab_model=runtime.model,
                                            lane_count=runtime.spec.lane_count, ctx_size=runtime.spec.ctx_size,
                                            n_gpu_layers=n_gpu_layers, n_threads=runtime.spec.n_threads)
    elif spec.plan.ngram is not None:
        ngram = spec.plan.ngram
        factory = SuffixProposerFactory(ngram) if ngram.kind is NgramKind.SUFFIX else NgramCacheProposerFactory(ngram)
    else:
        return None
    window = spec.plan.verify_window
    max_k = min(spec.speculative_window or (window.max_tokens if spec.plan.ngram else DEFAULT_WINDOW), MAX_DRAFT_TOKENS)
    policy: WindowPolicy
    depth = window.pipeline_depth
    if not spec.adaptive_speculative_window:
        return Speculation(factory, FixedWindow(max_k), max_k, depth=depth)
    min_k = min(max(window.min_tokens, 1), max_k)
    policy = SimpleAdaptiveWindow(start=min(DEFAULT_WINDOW, max_k), min_k=min_k, max_k=max_k)
    return Speculation(factory, policy, max_k, calibrate=spec.adaptive_mode is AdaptiveWindowMode.COST, depth=depth)
