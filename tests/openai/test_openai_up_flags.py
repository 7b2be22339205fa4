"""`skippy up` hands each serving flag to the process that owns it: stage flags to every stage, prefill
flags to stage 0's driver, admission flags to the broker, the model id, default max tokens and HTTP
limits to the adapter (read back from each process's `ready` line and from the API)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families
from up_helpers import SkippyServer

from skippy.launcher import read_events
from skippy.telemetry.scrape import scrape
from skippy.telemetry.targets import TARGETS_FILE, read_targets


def ready_line(server: SkippyServer, name: str) -> dict[str, Any]:
    return next(e for e in read_events(server.run_dir / f"{name}.log") if e.get("event") == "ready")


def test_up_hands_each_flag_to_its_owner(start_up: Callable[..., Any], tiny_llama: Path) -> None:
    flags = ["--openai-prefill-chunk-policy", "fixed", "--openai-prefill-chunk-size", "5",
             "--openai-generation-concurrency", "1", "--openai-generation-queue-capacity", "3",
             "--openai-model-id", "tiny-served", "--openai-default-max-tokens", "7", "--reply-credit-limit", "0",
             "--openai-http-head-timeout-s", "12.5", "--openai-http-max-connections", "64"]
    with start_up("up-flags", tiny_llama, *flags) as server:
        stage0, stage1 = ready_line(server, "stage0"), ready_line(server, "stage1")
        assert stage0["prefill"]["policy"] == "fixed" and stage0["prefill"]["chunk_size"] == 5
        assert stage1["reply_credit_limit"] == 0
        broker = ready_line(server, "broker")
        assert (broker["concurrency"], broker["queue_capacity"]) == (1, 3)
        adapter = ready_line(server, "adapter")
        assert adapter["model_id"] == server.model_id == "tiny-served"
        limits = adapter["http_limits"]
        assert (limits["head_timeout_s"], limits["body_timeout_s"], limits["max_connections"]) == (12.5, 60.0, 64)
        client = server.client()
        prompt = "one two three four five six seven eight nine ten eleven twelve"  # several 5-token chunks
        reply = client.completions.create(model="tiny-served", prompt=prompt, temperature=0,
                                          extra_body={"ignore_eos": True})
        client.close()
        assert reply.usage is not None and reply.usage.prompt_tokens > 10
        assert reply.usage.completion_tokens == 7  # --openai-default-max-tokens, not the default 16
        events = list(read_events(server.run_dir / "stage0.log"))
    # no speculative flag: the default plan under the per-session policy, C(rows) calibrated at startup
    policy = [e for e in events if e.get("event") == "speculation_policy"]
    assert [(e["proposer"], e["max_k"], e["max_depth"]) for e in policy] == [("suffix", 16, 2)]
    calibrated = [e for e in events if e.get("event") == "window_cost_calibrated"]
    assert len(calibrated) == 1 and calibrated[0]["rows"][:17] == list(range(1, 18))  # every row of a window of 16
    assert len(calibrated[0]["cost_ms"]) == len(calibrated[0]["rows"])
    done = [e for e in events if e.get("event") == "request_done"]
    assert done[-1]["speculative"]["proposer"] == "suffix" and done[-1]["speculative"]["proposer_calls"] > 0


def test_up_with_speculative_flags_gives_plain_greedy_output(start_up: Callable[..., Any], tiny_llama: Path,
                                                             tmp_path: Path) -> None:
    """A suffix plan with the calibrated cost-model window: stage 0 measures C(rows) through the real
    pipeline at startup, and greedy output through the OpenAI client equals plain decoding's
    (`--no-speculative`: nothing drafts at all)."""
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"requested_strategy": "ngram", "effective_strategy": "ngram-suffix",
                                "ngram": {"kind": "suffix", "min_ngram": 3, "max_ngram": 8, "max_proposal_tokens": 8},
                                "verify_window": {"min_tokens": 1, "max_tokens": 8}}))
    prompt = "one two three four five one two three four five one two three four"
    with start_up("up-plain", tiny_llama, "--no-speculative") as server:
        client = server.client()
        plain = client.completions.create(model=server.model_id, prompt=prompt, temperature=0, max_tokens=12,
                                          extra_body={"ignore_eos": True})
        client.close()
        events = list(read_events(server.run_dir / "stage0.log"))
        plain_metrics = server.request("GET", "/metrics").body.decode()
    # --no-speculative: no proposer, no calibration, no draft in the reply or the metrics
    assert not [e for e in events if e.get("event") in ("speculation_policy", "window_cost_calibrated")]
    assert [e["speculative"] for e in events if e.get("event") == "request_done"] == [None]
    assert ((plain.model_extra or {}).get("timings") or {}).get("draft_n", 0) == 0
    assert "skippy_spec_decode_num_draft_tokens_total 0.0" in plain_metrics
    with start_up("up-spec", tiny_llama, "--openai-speculative-config", str(plan), "--openai-speculative-window", "8",
                  "--openai-adaptive-speculative-window") as server:
        calibrated = [e for e in read_events(server.run_dir / "stage0.log") if e.get("event") == "window_cost_calibrated"]
        assert len(calibrated) == 1 and calibrated[0]["rows"][:9] == list(range(1, 10)) and calibrated[0]["hops"] == 2
        assert all(ms > 0 for ms in calibrated[0]["cost_ms"]) and len(calibrated[0]["cost_ms"]) == len(calibrated[0]["rows"])
        assert all(r % 8 == 0 for r in calibrated[0]["rows"][9:]) and calibrated[0]["rows"][-1] <= 32  # then every 8
        plans = [e for e in read_events(server.run_dir / "stage0.log") if e.get("event") == "speculative_plan"]
        assert [(e["requested_strategy"], e["effective_strategy"]) for e in plans] == [("ngram", "ngram-suffix")]
        client = server.client()
        spec = client.completions.create(model=server.model_id, prompt=prompt, temperature=0, max_tokens=12,
                                         extra_body={"ignore_eos": True})
        client.close()
        done = [e for e in read_events(server.run_dir / "stage0.log") if e.get("event") == "request_done"]
        metrics = server.request("GET", "/metrics").body.decode()
        stage0 = scrape(dict(read_targets(server.run_dir / TARGETS_FILE))["stage0"], timeout_s=10.0) or []
    assert spec.choices[0].text == plain.choices[0].text
    summary = done[-1]["speculative"]
    assert summary["proposer"] == "suffix" and summary["proposer_calls"] > 0
    timings = (spec.model_extra or {})["timings"]  # as llama-server reports drafts
    assert timings["draft_n"] == summary["proposed"] and timings["draft_n_accepted"] == summary["accepted"]
    assert "skippy_speculative_requests_total 1" in metrics
    assert f"skippy_speculative_proposed_total {summary['proposed']}" in metrics
    samples = {s.name: s.value for family in text_string_to_metric_families(metrics) for s in family.samples}
    assert samples["skippy_spec_decode_num_draft_tokens_total"] == summary["proposed"]  # llama-server's names
    assert samples["skippy_spec_decode_num_accepted_tokens_total"] == summary["accepted"]
    assert samples["skippy_spec_decode_num_drafts_total"] == summary["windows"]
    limit = [m.value for m in stage0 if m.name == "skippy_speculative_global_tokens_limit"]
    assert limit == [65536]  # the global suffix index, on by default with the suffix proposer
    assert {m.labels.get("k") for m in stage0 if m.name == "skippy_speculative_sessions_by_k"} == {str(k) for k in range(9)}
