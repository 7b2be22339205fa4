"""`python -m skippy.bench.mtp`: plain greedy vs greedy verifying native-MTP drafts, side by side (docs/mtp.md).

The tiny mimo2 model with a NextN block, a LocalChain split at layer 3; each max_draft_tokens run alternates
with a plain run `--reps` times and the best of each is compared (ratios, not absolute times: shared CPUs).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from skippy.runtime.chain import LocalChain
from skippy.runtime.spec import RuntimeSpec
from skippy.testing.reference_runs import mtp_greedy
from skippy.testing.tiny_models import tiny_model_path

PROMPT = [1, *range(40, 80)]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args(argv)
    path = tiny_model_path("mtp", Path(tempfile.gettempdir()) / "skippy-bench-mtp")
    spec = RuntimeSpec(path, 0, 0, ctx_size=256, lane_count=1)
    plain = LocalChain(spec, [3])
    drafting = LocalChain(RuntimeSpec(path, 0, 0, ctx_size=256, lane_count=1, mtp="integrated"), [3])
    try:
        for n_draft in (1, 2, 3):
            plain_s, mtp_s, counts = [], [], (0, 0)
            for _ in range(args.reps):
                start = time.perf_counter()
                reference = list(plain.generate(PROMPT, args.steps))
                plain_s.append(time.perf_counter() - start)
                start = time.perf_counter()
                run = mtp_greedy(drafting, PROMPT, args.steps, n_draft)
                counts = (run.drafted, sum(run.accepted))
                mtp_s.append(time.perf_counter() - start)
                assert run.tokens == reference, "MTP drafting changed greedy output"
            print(f"max_draft_tokens={n_draft}: drafted {counts[0]}, accepted {counts[1]}, "
                  f"time vs plain {min(mtp_s) / min(plain_s):.2f}x (best of {args.reps}, {args.steps} tokens)")
    finally:
        plain.close()
        drafting.close()


if __name__ == "__main__":
    main()
