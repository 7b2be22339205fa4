"""The `skippy` command: subcommands, and one place that turns expected errors into one-line messages."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from skippy.config import ConfigError
from skippy.launcher import LaunchError
from skippy.request_events import PipelineUnavailable
from skippy.runtime.errors import ModelError, RuntimeUsageError
from skippy.stage.handshake import HandshakeError

EXPECTED_ERRORS = (ConfigError, ModelError, RuntimeUsageError, HandshakeError, PipelineUnavailable, LaunchError,
                   FileNotFoundError)


def build_parser() -> argparse.ArgumentParser:
    from skippy import bench
    from skippy.cli import adapter, broker, check_config, generate, keys, logs, pipeline, plan, slice_cmd, stage, up

    parser = argparse.ArgumentParser(
        prog="skippy", description="Serve one GGUF model split by layers across processes."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in (up, plan, generate, stage, pipeline, broker, adapter, keys, logs, slice_cmd, bench, check_config):
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    # `skippy pipeline T -- FLAGS`: everything after `--` is passed through to the stage processes
    passthrough = argv[argv.index("--") + 1 :] if "--" in argv else []
    args = parser.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    args.passthrough = passthrough
    try:
        return int(args.run(args) or 0)
    except EXPECTED_ERRORS as exc:
        print(f"skippy {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"skippy {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
