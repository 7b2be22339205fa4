"""Stage 0's speculative decoding from its options: which proposer, which window policy, or none.

- proposer: the plan's `native_mtp` (the final stage's NextN block drafts, with `extension` an n-gram cache
  tail: skippy.driver.speculative.native_mtp), `--openai-draft-model-path` (a whole small GGUF sharing the
  target's vocabulary) or the plan's `ngram` section (`kind` suffix | cache); two at once is refused.
  The suffix proposer also drafts across requests from `--openai-speculative-global-tokens` tokens of
  recent sessions (skippy.driver.speculative.global_suffix; 0: only the request's own).
- window: `--openai-speculative-window K` fixes k (default: the plan's verify_window.max_tokens, or
  4); with `--openai-adaptive-speculative-window` k moves within [verify_window.min_tokens, K]:
  the cost model (C(rows) calibrated through the pipeline at startup, the hop delay measured) or,
  with `--openai-adaptive-speculative-window-mode simple`, the grow/shrink rule (skippy.driver.speculative.window).
- default (no plan, no draft model, no `--no-speculative`): the suffix proposer of
  config.generation.DEFAULT_POLICY_PLAN under `SpeculationPolicy` (skippy.driver.speculative.policy), which
  picks k and the pipeline depth per session from C(rows) calibrated at startup;
  `--openai-adaptive-speculative-window` picks one of the window policies above instead.
- plan fields: `effective_strategy` "disabled" means no proposer at all (logged when an ngram section is
  then unused); `verify_window.min_tokens` is the fewest drafts a verify window carries (a shorter
  proposal decodes plainly this step); `pipeline_depth` windows of a session in flight, holding at most
  `runahead_max_tokens` draft tokens together (0: no token cap); `requested_strategy` is logged only.
Option combinations that cannot work are refused by `skippy.config.serving.unsupported_options`.
"""

from __future__ import annotations

from skippy.config import MtpSource, ServingOptions, resolve_mtp_source
from skippy.config.generation import AdaptiveWindowMode
from skippy.config.speculative import NgramKind
from skippy.driver.speculative import ProposerFactory
from skippy.driver.speculative.engine import Speculation
from skippy.driver.speculative.global_suffix import GlobalSuffixProposerFactory
from skippy.driver.speculative.metrics import SpeculationCollector
from skippy.driver.speculative.native_mtp import NativeMtpProposerFactory
from skippy.driver.speculative.ngram_cache import NgramCacheProposerFactory
from skippy.driver.speculative.policy import SpeculationPolicy
from skippy.driver.speculative.suffix import SuffixProposerFactory
from skippy.driver.speculative.window import FixedWindow, SimpleAdaptiveWindow, WindowPolicy
from skippy.log import get_logger
from skippy.runtime.stage_params import MAX_DRAFT_TOKENS
from skippy.runtime.stage_runtime import StageRuntime
from skippy.telemetry.process import current

DEFAULT_WINDOW = 4  # where the grow/shrink rule starts (at most max_k)


def build_speculation(options: ServingOptions, runtime: StageRuntime) -> Speculation | None:
    """The driver's Speculation for these options (None: plain decoding)."""
    spec = options.speculative
    plan = spec.plan
    log = get_logger()
    if spec.plan_path is not None:
        log.info("speculative_plan", requested_strategy=plan.requested_strategy,
                 effective_strategy=plan.effective_strategy, source=spec.plan_path)
    factory: ProposerFactory
    ngram = plan.active_ngram
    mtp = resolve_mtp_source(options)
    if plan.native_mtp.enabled and not plan.disabled and mtp is not MtpSource.DISABLED:
        factory = NativeMtpProposerFactory(plan)  # drafts from the final stage's NextN block (docs/mtp.md)
        log.info("native_mtp", mtp_source=mtp.value, max_draft_tokens=plan.native_mtp.max_draft_tokens,
                 extension=plan.extension.max_tokens if plan.extension is not None else 0)
    elif spec.draft_model_path is not None:
        from skippy.driver.speculative.draft_model import DraftModelProposerFactory

        n_gpu_layers = spec.draft_n_gpu_layers if spec.draft_n_gpu_layers is not None else options.config.n_gpu_layers
        factory = DraftModelProposerFactory(spec.draft_model_path, target_vocab_model=runtime.model,
                                            lane_count=runtime.spec.lane_count, ctx_size=runtime.spec.ctx_size,
                                            kv_pool_cells=runtime.spec.kv_pool_cells,
                                            n_gpu_layers=n_gpu_layers, n_threads=runtime.spec.n_threads)
    elif ngram is not None:
        if ngram.kind is NgramKind.CACHE:
            factory = NgramCacheProposerFactory(ngram)
        elif spec.global_tokens > 0:
            factory = GlobalSuffixProposerFactory(ngram, spec.global_tokens)
        else:
            factory = SuffixProposerFactory(ngram)
    else:
        if plan.ngram is not None:
            log.info("speculation_off", reason=f"effective_strategy '{plan.effective_strategy}'",
                     unused="ngram", source=spec.plan_path)
        return None
    window = plan.verify_window
    max_k = min(spec.speculative_window or window.max_tokens, MAX_DRAFT_TOKENS)  # the plan default: DEFAULT_WINDOW
    min_k = min(max(window.min_tokens, 1), max_k)
    policy: WindowPolicy = FixedWindow(max_k)
    if spec.adaptive_speculative_window:
        policy = SimpleAdaptiveWindow(start=min(DEFAULT_WINDOW, max_k), min_k=min_k, max_k=max_k)
    elif spec.policy:
        policy = SpeculationPolicy(max_k, max_depth=window.pipeline_depth)
        log.info("speculation_policy", proposer=factory.name, max_k=max_k, max_depth=window.pipeline_depth,
                 global_tokens=spec.global_tokens)
    calibrate = spec.policy or spec.adaptive_speculative_window and spec.adaptive_mode is AdaptiveWindowMode.COST
    speculation = Speculation(factory, policy, max_k, depth=window.pipeline_depth, min_k=min_k,
                              runahead=window.runahead_max_tokens, calibrate=calibrate)
    if isinstance(factory, NativeMtpProposerFactory):
        speculation.mtp_draft_max = plan.native_mtp.max_draft_tokens
    current().attach(SpeculationCollector(speculation))
    return speculation
