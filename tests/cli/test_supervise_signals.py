"""`Children.supervise` (what `skippy up` waits in) stops on SIGINT/SIGTERM even when the signal lands while the
main thread is inside the read of its exits queue: the handlers put into that queue, and with a `queue.Queue` a
handler run while `get()` held the queue's lock blocked on that lock forever (seen: `skippy up` deaf to Ctrl-C
and SIGTERM, its children left running).

The child process below raises the signal at the worst moment on purpose: a profile hook raises SIGTERM from
inside the queue read (Queue's `_get`, run with its lock held, or SimpleQueue's `get`); with the old Queue this
test times out (checked).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

CHILD = textwrap.dedent("""
    import signal, sys
    from pathlib import Path
    from skippy.launcher import Children

    children = Children(Path(sys.argv[1]))
    fired = []

    def inside_the_read(frame, event, arg):
        if fired:
            return
        python_get = event == "call" and frame.f_code.co_name == "_get" and frame.f_locals.get("self") is children._exits
        c_get = event == "c_call" and getattr(arg, "__self__", None) is children._exits and arg.__name__ == "get"
        if python_get or c_get:
            fired.append(event)
            signal.raise_signal(signal.SIGTERM)  # its handler runs here, inside the read

    def start():
        sys.setprofile(inside_the_read)
        return "ready"

    code = children.supervise("t", start)
    sys.setprofile(None)
    print("returned", code, fired, flush=True)
""")


def test_a_signal_landing_inside_the_exits_read_still_stops_supervise(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(tmp_path / "run")], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"supervise deadlocked on a signal inside its exits read\n{out}\n{err[-2000:]}") from None
    assert proc.returncode == 0, err[-2000:]
    assert out.splitlines()[0] == "ready"
    assert out.splitlines()[1].startswith("returned 0 ['"), out  # the hook fired inside the read, and it returned
