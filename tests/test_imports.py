"""The package's import structure: pure parts import without Ray/vLLM, no import cycles, the CLI on top.

Every import counts, also one inside a function: a cycle hidden in a function body is still a cycle.
"""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from tests import REPO_ROOT

ROOT = REPO_ROOT
PKG = ROOT / "rllib_r3l"
PURE = (
    "rllib_r3l.core_algos",
    "rllib_r3l.batch",
    "rllib_r3l.trajectory",
    "rllib_r3l.options",
    "rllib_r3l.learner.prefix_tree",
    "rllib_r3l.learner.forward",
)


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules():
    return {_module_name(p): p for p in PKG.rglob("*.py")}


def _imports(path: Path, modules) -> set:
    """The package modules ``path`` imports (``from a.b import c`` counts ``a.b.c`` where it is a module)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [
                f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module for a in node.names
            ]
        else:
            continue
        out.update(n for n in names if n in modules)
    return out


def _graph():
    modules = _modules()
    # A package's __init__ is imported with any of its modules; it is not an edge of its own here.
    return {m: {d for d in _imports(p, modules) if d != m and not m.startswith(d + ".")} for m, p in modules.items()}


@pytest.mark.subprocess
def test_pure_modules_import_without_ray_vllm_gymnasium_or_transformers():
    blocked = ("ray", "vllm", "gymnasium", "transformers", "pandas", "deepspeed")
    code = (
        "import sys\n"
        + "".join(f"sys.modules[{b!r}] = None\n" for b in blocked)
        + "".join(f"import {m}\n" for m in PURE)
        + "import rllib_r3l\n"
        + "assert rllib_r3l.register() is False\n"
        + "print('ok')\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]


def test_the_package_has_no_import_cycle():
    graph = _graph()
    state, stack = {}, []

    def visit(m):
        state[m] = "open"
        stack.append(m)
        for d in sorted(graph.get(m, ())):
            if state.get(d) == "open":
                cycle = stack[stack.index(d) :] + [d]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if d not in state:
                visit(d)
        stack.pop()
        state[m] = "done"

    for m in sorted(graph):
        if m not in state:
            visit(m)


def test_lower_layers_never_import_the_cli():
    offenders = {
        m: sorted(d for d in deps if d.startswith("rllib_r3l.cli"))
        for m, deps in _graph().items()
        if not m.startswith("rllib_r3l.cli")
    }
    assert {m: d for m, d in offenders.items() if d} == {}


def test_the_graph_sees_function_level_imports():
    # the checks above are only as good as the import reader: it must see an import inside a function
    g = _graph()
    assert "rllib_r3l.runner.env_runner" in g["rllib_r3l.config"]  # R3LConfig.__init__'s import
    assert "rllib_r3l.config" in g["rllib_r3l.algorithm"]


@pytest.mark.subprocess
def test_import_rllib_r3l_registers_r3l_with_tune_across_ray_sessions():
    code = (
        "import ray, rllib_r3l\n"
        "from ray.tune.registry import get_trainable_cls\n"
        "for _ in range(2):\n"
        "    ray.init(address='local', num_cpus=1, include_dashboard=False, log_to_driver=False)\n"
        "    assert get_trainable_cls('R3L') is rllib_r3l.R3L\n"
        "    ray.shutdown()\n"
        "print('ok')\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-2000:]


@pytest.mark.subprocess
def test_import_rllib_r3l_changes_nothing_but_tunes_table_of_algorithms():
    """Issue 48 item 3: ``import rllib_r3l`` set RAY_TUNE_CALLBACKS and added a log filter to RLlib's logger.
    Now the environment, the loggers, the signal handlers and the loaded modules are what they were (Ray's
    RLlib table aside); the stop-key check arrives with the algorithm, when Tune resolves "R3L"."""
    code = (
        "import logging, os, signal, sys\n"
        "import ray.rllib.algorithms.registry\n"
        "env, mods = dict(os.environ), set(sys.modules)\n"
        "loggers = {n: list(l.filters) for n, l in logging.Logger.manager.loggerDict.items() "
        "if isinstance(l, logging.Logger)}\n"
        "handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}\n"
        "import rllib_r3l\n"
        "assert dict(os.environ) == env, set(os.environ.items()) ^ set(env.items())\n"
        "assert all(logging.getLogger(n).filters == f for n, f in loggers.items())\n"
        "assert {s: signal.getsignal(s) for s in handlers} == handlers\n"
        "assert not [m for m in set(sys.modules) - mods if m.startswith('rllib_r3l.')], "
        "sorted(set(sys.modules) - mods)\n"
        "assert 'R3L' in ray.rllib.algorithms.registry.ALGORITHMS\n"
        "from ray.tune.registry import get_trainable_cls\n"
        "get_trainable_cls('R3L')\n"
        "assert 'rllib_r3l.stopping.StopCriteriaCheck' in os.environ['RAY_TUNE_CALLBACKS'].split(',')\n"
        "print('ok')\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-3000:]
