"""Losing a host: `skippy up --hosts` over namespace hosts reached only over SSH, one cut off with streams in flight.

A host is cut off as a machine that goes away is: its link set down (the bridge drops what is sent to it), then every
process in its namespace killed, its sshd too, so nothing of it answers and nothing of it is left. SmolLM2-135M at 4
lanes x 256 needs ~222 MiB whole; each host's budget is 160 MiB, so one host cannot hold it and two can.

- Three hosts: the plan uses them (or two, the third spare). With four greedy streams in flight (`--deterministic`:
  each request's tokens depend on nothing but the request) the host of stage 1 is cut off, or stage 0's (the broker
  then reaches the new plan's stage 0 on another host). Its stage's SSH session
  ends (keepalives), the restart finds the host unreachable, the host is dropped, the model re-planned over the two
  left (new layer ranges, their slices sent) and every stream ends with the text of the same requests served
  undisturbed before the cut. The re-plan is counted on /metrics, restarts.json names the dropped host, and the
  dashboard shows it (its data, and its page in a headless Chromium where there is one).
- Two hosts: the host of stage 1 is cut off and the one left cannot hold the model: every stream in flight ends with
  one error naming the lost host, and `skippy up` stops (exit 1) leaving nothing on either host.
"""

from __future__ import annotations

import json
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

import openai
import pytest
from netns_helpers import MakeHosts
from sshd_helpers import SshHost, cut_off, sshd_hosts, stage_processes, wait_empty

from skippy.testing.browser import chromium_missing, headless_chromium, text_of

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "openai"))
from up_helpers import SkippyServer, launch_up  # noqa: E402  (tests/openai is not a package)

BUDGET_MB = 160  # per host: below the whole model's need at SHAPE (~222 MiB), two hosts hold it
SHAPE = ["--model", "smollm2-135m", "--lane-count", "4", "--ctx-size", "256", "--deterministic",
         "--openai-resume-timeout-s", "600"]  # a re-plan on this shared 2-CPU machine may take a while
PROMPTS = ["Tell me a story about a lighthouse.", "Explain how a bicycle works.", "Describe a busy market.",
           "Write a letter to a friend about the sea."]
MAX_TOKENS = 64
STREAM_TIMEOUT_S = 600.0  # a stream that gets no byte for this long hangs (the test fails naming it)


@dataclass
class Stream:
    prompt: str
    text: str = ""
    finish: str | None = None
    error: str | None = None
    started: threading.Event = field(default_factory=threading.Event)  # its first token came (or it ended)

    def run(self, server: SkippyServer) -> None:
        client = server.client(timeout=STREAM_TIMEOUT_S)
        try:
            for chunk in client.chat.completions.create(
                    model=server.model_id, messages=[{"role": "user", "content": self.prompt}], max_tokens=MAX_TOKENS,
                    temperature=0, stream=True, extra_body={"ignore_eos": True}):
                if chunk.choices:
                    self.text += chunk.choices[0].delta.content or ""
                    self.finish = chunk.choices[0].finish_reason or self.finish
                    if self.text:
                        self.started.set()
        except openai.APIError as error:
            self.error = str(error)
        finally:
            self.started.set()
            client.close()


def start_streams(server: SkippyServer) -> tuple[list[Stream], list[threading.Thread]]:
    streams = [Stream(prompt) for prompt in PROMPTS]
    threads = [threading.Thread(target=s.run, args=(server,), daemon=True) for s in streams]
    for thread in threads:
        thread.start()
    return streams, threads


def finish(streams: list[Stream], threads: list[threading.Thread]) -> list[Stream]:
    for stream, thread in zip(streams, threads):
        thread.join(STREAM_TIMEOUT_S + 60)
        assert not thread.is_alive(), f"stream {stream.prompt!r} hangs"
    return streams


def write_hosts(path: Path, hosts: list[SshHost]) -> Path:
    path.write_text(json.dumps({"hosts": [{**h.entry(f"h{i + 1}"), "mem_mb": BUDGET_MB} for i, h in enumerate(hosts)]}))
    return path


def plan_of(server: SkippyServer) -> list[dict[str, object]]:
    return list(json.loads((server.run_dir / "topology" / "plan.json").read_text())["stages"])


def props_ranges(server: SkippyServer) -> list[tuple[object, object]]:
    return [(s["layer_start"], s["layer_end"]) for s in server.request("GET", "/props").json()["stages"]]


def metric_line(server: SkippyServer, prefix: str) -> str:
    text = server.request("GET", "/metrics").body.decode()
    return next((line for line in text.splitlines() if line.startswith(prefix)), "")


def wait_gone(hosts: list[SshHost]) -> None:
    """Every host's namespace empty of skippy's processes (their sessions end with `skippy up`)."""
    for host in hosts:
        assert wait_empty(host) == [], host.namespace


def dashboard_shows_hosts(server: SkippyServer, lost_name: str) -> None:
    """The live page's hosts table, in a real headless Chromium where there is one: the lost host dropped."""
    if chromium_missing() is not None:
        return
    from selenium.webdriver.support.ui import WebDriverWait

    with headless_chromium() as browser:
        browser.get(f"{server.base_url.removesuffix('/v1')}/dashboard?interval=200")
        WebDriverWait(browser, 90, poll_frequency=0.1).until(lambda d: text_of(d, "replans") == "1")
        row = text_of(browser, f"host-{lost_name}")
        assert "dropped" in row and "cannot reach it over SSH" in row, row
        assert text_of(browser, "hosts").count("serving") == 2


def fresh(path: Path) -> Path:
    path.mkdir()
    return path


@pytest.mark.parametrize("cut_stage", [1, 0], ids=["stage1-host", "stage0-host"])
def test_a_host_cut_off_is_dropped_and_the_model_replanned_over_the_two_left(
        netns_hosts: MakeHosts, tmp_path: Path, skippy_cache_dir: Path, cut_stage: int) -> None:
    host_set = netns_hosts(3, emulator="none")
    with sshd_hosts(host_set, tmp_path / "ssh") as hosts:
        hosts_file = write_hosts(tmp_path / "hosts.json", hosts)
        with launch_up(fresh(tmp_path / "up"), skippy_cache_dir, None, [*SHAPE, "--hosts", str(hosts_file)]) as server:
            undisturbed = [s.text for s in finish(*start_streams(server))]
            before = plan_of(server)
            assert props_ranges(server) == [(s["layer_start"], s["layer_end"]) for s in before]
            lost_name = str(before[cut_stage]["host"])
            lost = next(h for i, h in enumerate(hosts) if f"h{i + 1}" == lost_name)
            streams, threads = start_streams(server)
            for stream in streams:
                assert stream.started.wait(STREAM_TIMEOUT_S), stream.prompt
            cut_off(host_set, lost)
            finish(streams, threads)
            for stream, expected in zip(streams, undisturbed):
                assert stream.error is None, (stream.prompt, stream.error, server.log_tail())
                assert stream.finish == "length" and stream.text == expected, (stream.prompt, stream.text, expected)
            after = plan_of(server)
            assert len(after) == 2 and lost_name not in {s["host"] for s in after}, after
            assert props_ranges(server) == [(s["layer_start"], s["layer_end"]) for s in after]  # /props: the new plan
            assert metric_line(server, "skippy_replans_total") == "skippy_replans_total 1.0"
            assert metric_line(server, f'skippy_host_dropped{{host="{lost_name}"}}').endswith(" 1.0")
            assert float(metric_line(server, "skippy_http_resumed_total").split()[-1]) >= len(PROMPTS)
            state = json.loads((server.run_dir / "restarts.json").read_text())["hosts"]
            dropped = [h for h in state["hosts"] if h["state"] == "dropped"]
            assert [h["name"] for h in dropped] == [lost_name] and "cannot reach it over SSH" in dropped[0]["reason"]
            assert state["replans"] == 1 and state["failed"] is None
            assert server.request("GET", "/dashboard/data").json()["hosts"] == state  # what the page shows
            dashboard_shows_hosts(server, lost_name)
            for stage in after:  # each stage on a host left maps its new range's slice, sent there
                host = next(h for i, h in enumerate(hosts) if f"h{i + 1}" == stage["host"])
                [(pid, _)] = stage_processes(host)
                maps = Path(f"/proc/{pid}/maps").read_text()
                assert f"-{stage['layer_start']}-{stage['layer_end']}-" in maps, (stage, maps[-2000:])
        stderr = (tmp_path / "up" / "up.stderr").read_text()
        assert f"host {lost_name} is lost, dropping it" in stderr and "re-planned over" in stderr, stderr
        wait_gone([h for h in hosts if h is not lost])


def test_a_host_lost_when_the_rest_cannot_hold_the_model_fails_each_waiting_request_naming_it(
        netns_hosts: MakeHosts, tmp_path: Path, skippy_cache_dir: Path) -> None:
    host_set = netns_hosts(2, emulator="none")
    with sshd_hosts(host_set, tmp_path / "ssh") as hosts:
        hosts_file = write_hosts(tmp_path / "hosts.json", hosts)
        with launch_up(fresh(tmp_path / "up"), skippy_cache_dir, None, [*SHAPE, "--hosts", str(hosts_file)]) as server:
            assert [s["host"] for s in plan_of(server)] == ["h1", "h2"]
            streams, threads = start_streams(server)
            for stream in streams:
                assert stream.started.wait(STREAM_TIMEOUT_S), stream.prompt
            cut_off(host_set, hosts[1])
            finish(streams, threads)
            for stream in streams:
                assert stream.finish is None and stream.error is not None, (stream.prompt, stream.text)
                assert "host h2 was lost" in stream.error and "cannot serve the model" in stream.error, stream.error
            assert server.proc.wait(120) == 1
        stderr = (tmp_path / "up" / "up.stderr").read_text()
        assert "the hosts left (h1) cannot serve the model" in stderr, stderr
        state = json.loads((server.run_dir / "restarts.json").read_text())["hosts"]
        assert "host h2 was lost" in state["failed"], state
        wait_gone([hosts[0]])
