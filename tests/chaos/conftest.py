"""Fixtures for the chaos tests, shared with the pipeline and OpenAI tests (fixture_sharing):
`make_pipeline` (real stage processes, the driver in the test; tests/pipeline) and `start_up` /
`tiny_llama` (a real `skippy up` in a subprocess; tests/openai), `netns_hosts` (namespace hosts, removed
at teardown; tests/netns)."""

from __future__ import annotations

from fixture_sharing import fixtures_of

_pipeline = fixtures_of("pipeline")
_openai = fixtures_of("openai")

make_pipeline = _pipeline.make_pipeline
_fresh_slice_cache = _pipeline._fresh_slice_cache
start_up = _openai.start_up
tiny_llama = _openai.tiny_llama
_netns = fixtures_of("netns")
netns_ok = _netns.netns_ok
netns_hosts = _netns.netns_hosts
