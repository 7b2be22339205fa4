"""The house's one rule, kept: imports between skippy's modules run down the layers below, with no cycle.

Every module of `skippy` and `brokers` is read with `ast`, so imports under `TYPE_CHECKING` and inside
functions count as much as the ones at the top: a helper split off a class must not import the class
back (pass it callbacks or parts instead), and an observer lives with what it observes.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("skippy", "brokers")

# Top to bottom: a module may import its own layer's modules (acyclically) and any layer below its own.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("skippy.cli",),  # the commands
    ("skippy.bench",),  # benchmarks behind `skippy bench KIND`
    ("skippy.remote",),  # stages started on other machines over SSH (`skippy up --hosts` with ssh hosts)
    ("skippy.plan",),  # the cost model and the split planner (`skippy plan`, `skippy up` without --split)
    ("skippy.testing",),  # generated tiny models, op-log replay, browser helpers (tests and benches)
    ("skippy.launcher", "skippy.restarts"),  # child processes of `skippy up`
    ("skippy.adapter", "brokers"),  # the OpenAI/Anthropic adapter process and the admission broker process
    ("skippy.driver",),  # stage 0
    ("skippy.client", "skippy.request_events"),  # the request protocol's client and what a request gives back
    ("skippy.stage",),  # a stage process
    ("skippy.runtime",),  # llama.cpp
    ("skippy.telemetry",),  # shared metric types, spans, the process's telemetry
    ("skippy.transport",),  # ZeroMQ sockets and their CURVE keys
    ("skippy.http",),  # the small HTTP/1.1 server library under the adapter (h11)
    ("skippy.cpu_pinning", "skippy.netns"),  # small utilities that read configs or run commands
    ("skippy.config",),
    ("skippy.protocol",),  # the wire
    ("skippy.supervise", "skippy.faults", "skippy.log"),  # small utilities
    ("skippy",),  # the package itself
)


def modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            found[name.removesuffix(".__init__")] = path
    return found


def imports(mods: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the modules of `mods` it imports anywhere in its source (its own package's __init__ aside)."""
    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    edges: dict[str, set[str]] = {}
    for mod, path in mods.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        targets: list[str] = []
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets += [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*parts, base] if base else parts)
                targets += [base, *(f"{base}.{alias.name}" for alias in node.names)]
        edges[mod] = {r for t in targets if (r := resolve(t)) and r != mod and not mod.startswith(r + ".")}
    return edges


def layer_of(mod: str) -> int:
    best, depth = -1, -1
    for index, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (mod == prefix or mod.startswith(prefix + ".")) and prefix.count(".") > depth:
                best, depth = index, prefix.count(".")
    return best


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_every_module_has_a_layer() -> None:
    assert [mod for mod in modules() if layer_of(mod) < 0] == []


def test_no_import_cycle_between_modules() -> None:
    assert cycles(imports(modules())) == []


def test_no_import_climbs_a_layer() -> None:
    edges = imports(modules())
    upward = sorted(f"{mod} -> {target}" for mod, targets in edges.items() for target in targets
                    if layer_of(target) < layer_of(mod))
    assert upward == []


def test_the_walk_sees_type_checking_and_function_local_imports(tmp_path: Path) -> None:
    """The checker itself: a cycle made only of a TYPE_CHECKING import and a function-local one is found."""
    source = {"a": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import b\n",
              "b": "def f() -> None:\n    from pkg.a import x\n"}
    mods = {}
    for name, text in source.items():
        path = tmp_path / f"{name}.py"
        path.write_text(text)
        mods[f"pkg.{name}"] = path
    assert cycles(imports(mods)) == [["pkg.a", "pkg.b"]]
    assert layer_of("skippy.cli.up") < layer_of("skippy.adapter.routes") < layer_of("skippy.http.server")
    assert layer_of("skippy.http.server") < layer_of("skippy.protocol.codec")
