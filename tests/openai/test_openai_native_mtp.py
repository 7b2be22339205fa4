"""`skippy up` serving native-MTP plans on the tiny mimo2 model with a NextN block (docs/mtp.md).

The final stage drafts from its NextN block, the drafts ride back with the predictions, stage 0 verifies them
in the next window: greedy text through the OpenAI client equals that of the same model served with
`--no-speculative` (which drafts nothing), with `timings.draft_n > 0`, over 2 stages (a native-MTP-only plan)
and 3 stages (the reference's composite plan: an MTP prefix and an n-gram cache tail, verify window 1-6,
pipeline depth 2); the request's drafted and accepted counts are what stage 0's metrics count by source. A
final stage without NextN tensors logs `native_mtp_off` and serves on without MTP drafts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pytest

from skippy.launcher import read_events
from skippy.telemetry.scrape import scrape
from skippy.telemetry.targets import TARGETS_FILE, read_targets

PROMPT = "the quick brown fox jumps over the lazy dog and the cat sat on the mat"
MAX_TOKENS = 16
NATIVE_MTP = {"native_mtp": {"enabled": True, "max_draft_tokens": 2}, "verify_window": {"max_tokens": 4}}
COMPOSITE = {  # the reference's cache_composite_plan (tests/config/test_config_mtp.py)
    "requested_strategy": "mtp-cache", "effective_strategy": "native-mtp+ngram-cache",
    "native_mtp": {"enabled": True, "max_draft_tokens": 1, "min_draft_tokens": 0, "reject_cooldown_tokens": 0,
                   "suppress_cooldown_drafts": False, "suppress_cooldown_draft_limit": 0},
    "ngram": {"kind": "cache", "min_ngram": 2, "max_ngram": 4, "max_proposal_tokens": 6},
    "extension": {"max_tokens": 6},
    "verify_window": {"min_tokens": 1, "max_tokens": 6, "pipeline_depth": 2, "runahead_max_tokens": 0},
}  # fmt: skip


def complete(server: Any) -> Any:
    client = server.client()
    reply = client.completions.create(model=server.model_id, prompt=PROMPT, temperature=0, max_tokens=MAX_TOKENS,
                                      extra_body={"ignore_eos": True})
    client.close()
    return reply


def by_source(server: Any, counted: str = "proposed") -> dict[str, float]:
    """Stage 0's draft tokens `counted` ("proposed" or "accepted") in verify windows, by the proposer's source."""
    stage0 = scrape(dict(read_targets(server.run_dir / TARGETS_FILE))["stage0"], timeout_s=10.0) or []
    name = f"skippy_speculative_source_{counted}_tokens_total"
    return {s.labels["source"]: s.value for s in stage0 if s.name == name}


@pytest.fixture(scope="module")
def plain_text(start_up: Callable[..., Any], tiny_model: Callable[..., Path]) -> str:
    """The same model (NextN block and all) with `--no-speculative`: plain greedy decoding, no draft at all."""
    with start_up("mtp-plain", tiny_model("mtp"), "--no-speculative") as server:
        reply = complete(server)
        drafted = by_source(server)
    assert "timings" not in (reply.model_extra or {}) and not any(drafted.values()), "the plain server drafted"
    return str(reply.choices[0].text)


@pytest.mark.parametrize(("name", "plan", "split"), [("native-mtp", NATIVE_MTP, "3"), ("composite", COMPOSITE, "2,4"),
                                                     ("one-stage", NATIVE_MTP, "none")])
def test_native_mtp_plan_serves_plain_greedy_text_with_drafts(
    name: str, plan: dict[str, Any], split: str, plain_text: str, start_up: Callable[..., Any],
    tiny_model: Callable[..., Path], tmp_path: Path,
) -> None:
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(plan))
    with start_up(f"mtp-{name}", tiny_model("mtp"), "--split", split, "--openai-speculative-config", str(path)) as server:
        reply = complete(server)
        sources, accepted = by_source(server), by_source(server, "accepted")
        final = server.run_dir / f"stage{0 if split == 'none' else split.count(',') + 1}.log"
        native = [e for e in read_events(final) if e.get("event") == "native_mtp"]
    done = [cast(dict[str, int], e["speculative"]) for e in read_events(server.run_dir / "stage0.log")
            if e.get("event") == "request_done" and e.get("speculative")]  # a request lost and resumed: 2
    assert reply.choices[0].text == plain_text
    timings = (reply.model_extra or {})["timings"]
    assert timings["draft_n"] > 0
    assert (timings["draft_n"], timings["draft_n_accepted"]) == (done[-1]["proposed"], done[-1]["accepted"])
    # what each submission's verify windows proposed and accepted adds up to stage 0's counts by source
    assert sum(d["proposed"] for d in done) == sum(sources.values())
    assert sum(d["accepted"] for d in done) == sum(accepted.values())
    assert native and native[0]["mtp_source"] == "integrated"
    assert sources.get("native_mtp", 0) > 0
    if plan is COMPOSITE:
        assert set(sources) <= {"native_mtp", "ngram_extension"}
    else:
        assert set(sources) == {"native_mtp"}


def test_a_final_stage_without_nextn_tensors_serves_on_without_mtp_drafts(
    plain_text: str, start_up: Callable[..., Any], tiny_model: Callable[..., Path], tmp_path: Path,
) -> None:
    """The trunk-only GGUF under the native-MTP plan: its final stage finds no NextN tensors, logs that and
    serves the plain greedy text; stage 0 is sent no MTP drafts to propose."""
    path = tmp_path / "native-mtp.json"
    path.write_text(json.dumps(NATIVE_MTP))
    with start_up("mtp-trunk", tiny_model("mtp", part="trunk"), "--openai-speculative-config", str(path)) as server:
        text = str(complete(server).choices[0].text)
        sources = by_source(server)
        off = [e for e in read_events(server.run_dir / "stage1.log") if e.get("event") == "native_mtp_off"]
    assert off and "no NextN (MTP) layers" in str(off[0]["reason"])
    assert text == plain_text and not sources.get("native_mtp")


def test_external_sidecar_serves_and_a_mismatched_one_is_refused(
    plain_text: str, start_up: Callable[..., Any], tiny_model: Callable[..., Path], tmp_path: Path,
    skippy_cache_dir: Path,
) -> None:
    """A trunk-only GGUF with the MTP-only sidecar drafts at the final stage as the integrated model does; a
    sidecar of another n_embd is refused by `skippy up` before anything starts, naming both files."""
    path = tmp_path / "native-mtp.json"
    path.write_text(json.dumps(NATIVE_MTP))
    trunk, sidecar = tiny_model("mtp", part="trunk"), tiny_model("mtp", part="mtp")
    with start_up("mtp-external", trunk, "--openai-speculative-config", str(path),
                  "--openai-native-mtp-draft-model-path", str(sidecar)) as server:
        reply = complete(server)
        native = [e for e in read_events(server.run_dir / "stage1.log") if e.get("event") == "native_mtp"]
    assert reply.choices[0].text == plain_text and (reply.model_extra or {})["timings"]["draft_n"] > 0
    assert native and native[0]["mtp_source"] == "external" and native[0]["model_path"] == str(sidecar)

    narrow = tiny_model("mtp", part="mtp", n_embd=32)
    run_dir = tmp_path / "refused"
    out = subprocess.run([sys.executable, "-m", "skippy.cli.main", "up", "--model", str(trunk), "--bind", "127.0.0.1:0",
                          "--run-dir", str(run_dir), "--openai-speculative-config", str(path),
                          "--openai-native-mtp-draft-model-path", str(narrow)],
                         capture_output=True, text=True, timeout=120,
                         env={**os.environ, "SKIPPY_CACHE_DIR": str(skippy_cache_dir)})
    assert out.returncode == 2, out.stderr
    assert f"--openai-native-mtp-draft-model-path {narrow} does not fit the target model {trunk}: n_embd 32, not 64" \
        in out.stderr and len(out.stderr.strip().splitlines()) == 1
    assert not list(run_dir.glob("*.log")), "nothing may start"
