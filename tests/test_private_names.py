"""Every private name of another package that R3L touches, with the reason (issue 48, item 1).

A Ray, vLLM, torch or transformers upgrade may move or drop a private name without notice; a use that
catches every exception then switches a feature off silently. So each one is a decision written down
here: the test reads the package's source (``rllib_r3l/``, ``environments/``) and fails on a private
name that is not listed (add it with the reason it has no public equivalent, or use the public one) and
on a listed name that is no longer used (take it off). R3L's own private names on other objects
(``_r3l_*`` attributes it sets on Ray's objects, ``runner._explorer`` of its own runner) are listed too:
reading another object's private state is a choice either way.

What counts: an import from a module path with a ``_private`` part or of a ``_name``; ``obj._name`` and
``getattr/setattr/hasattr(obj, "_name")`` where ``obj`` is not ``self``/``cls`` and ``_name`` is no
function or class of the package; and a private method of a base class from another package that an R3L
class overrides (found by importing the classes)."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
from pathlib import Path
from typing import Dict, Set

import pytest

from tests import REPO_ROOT

PACKAGES = ("rllib_r3l", "environments")
OWN_PREFIX = "_r3l_"  # R3L's attributes on other packages' objects: named so they cannot collide

ADAPTER = "rllib_r3l/ray_internals.py"  # where every private name of Ray lives, behind its version check

# Ray's private names -> why there is no public equivalent (all in ADAPTER; "TODO(issue 48)": a public one exists)
RAY: Dict[str, str] = {
    # Tune / Train: the CLI's resume bookkeeping
    "ray.train._internal.checkpoint_manager": "which checkpoint a resumed trial continues from: Tune has no API",
    "ray.train._internal.checkpoint_manager._CheckpointManager": "the same: the trial's checkpoint manager class",
    "ray.train._internal.session": "the same: the result record a checkpoint manager holds",
    "ray.train._internal.session._TrainingResult": "the same",
    "ray.tune.trainable.metadata._TrainingRunMetadata": "the same: a trial's run metadata in Tune's saved state",
    "ray.tune.utils.serialization._loads_with_cloudpickle": "decoding Tune's saved experiment state",
    "._checkpoint_results": "the checkpoint manager's list: setting aside the checkpoints after the chosen one",
    "._latest_checkpoint_result": "the same: the checkpoint a restored trial starts from",
    "ray._common.utils": "Ray's temp folder (get_default_ray_temp_dir) where a staged result row waits",
    "._stopper": "where tune.Experiment keeps time_budget_s's stopper: no public setter (a CombinedStopper "
    "passed as stop= would lose trial.stopping_criterion, which the console reads)",
    "getattr:_storage": "Trainable._storage: the trial folder of a class trainable; "
    "tune.get_context().get_trial_dir() is None there",
    "ray._private.worker": "this process's GCS client: whether a group signal stopped Ray's GCS",
    "._getframe": "sys._getframe: the Tune controller calling Callback.setup (its scheduler's and searcher's metric)",
    # RLlib
    "._translate_special_keys": "AlgorithmConfig's own key aliases, so update_from_dict accepts what RLlib does",
    "ray._common.deprecation": "DEPRECATED_VALUE: RLlib's marker for a retired config field (no public alias)",
    "._worker_manager": "the actor ids of the runners/learners and their health (resilience, weight sync)",
    "._actors": "a runner's actor handle by id: the weight transfer's engines live in the runner actors",
    "._learner": "the local learner of a LearnerGroup (the default layout): weights to the engine",
    "._counters": "Algorithm's counters: restored runners counted as RLlib counts them",
    "._check_component": "Algorithm's check of which state components a get_state call asked for",
    "._params": "the Learner's parameters by id (fault injection poisons one gradient)",
}

# Other packages' private names (and R3L's own, read across objects) -> why
OTHER: Dict[str, str] = {
    # vLLM
    "._registry": "vLLM's weight-transfer factories: whether the gloo engine is registered already",
    "._checked_iter": "vLLM's NCCL trainer's checked iteration over the tensors to send, reused for gloo",
    "getattr:_weight_update_active": "vLLM's worker flag for a weight update in progress: a failed round leaves "
    "it set (start and shutdown then refuse) and vLLM has no abort (vllm_weights.abort_weight_update_on_worker)",
    "._weight_update_active": "the same, cleared",
    # torch / transformers
    "._foreach_norm": "one fused norm over all gradients (the non-finite check); torch.nn.utils.get_total_norm "
    "returns one total, not one per tensor",
    "torch.utils._foreach_utils": "whether fused AdamW runs on the device",
    "torch.utils._foreach_utils._get_fused_kernels_supported_devices": "the same",
    "._is_avx512_bf16_supported": "whether the CPU computes bf16 natively (precision='auto')",
    "._is_amx_tile_supported": "the same (AMX)",
    "._scaled_dot_product_flash_attention_for_cpu": "cascade attention's CPU kernel with its log-sum-exp",
    "._scaled_dot_product_flash_attention_for_cpu_backward": "its backward",
    "._attn_implementation": "transformers' attention switch: cascade attention is registered under it",
    "getattr:_attn_implementation": "the same, read",
    # environments' own simulators
    "._gateway": "ScienceWorld/TextWorldExpress's py4j gateway: the JVM's pid (closed and counted on a crash)",
    "getattr:_gateway": "the same",
    "getattr:_obj_tree_tempdir": "ScienceWorld's temp folder, removed on close (it leaks one per episode)",
    "getattr:_env": "the wrapped simulator of an R3L environment (fault injection kills its JVM)",
    # Python itself
    "._exit": "os._exit: a second signal ends the process at once (documented; the underscore is Python's)",
    "._run_exitfuncs": "atexit._run_exitfuncs: the exit hooks run before os._exit keeps the exit code",
    # R3L's own objects, read across modules
    "._explorer": "the runner's explorer, read by the runner's metrics module",
    "._engine_start_logged": "the runner's one-time engine log flag, set by the same module",
    "getattr:_backend": "a runner's generation backend (the weight transfer's local engine)",
    "getattr:_keeper": "a runner's weight keeper (the transfer's fallback copy)",
    "getattr:_gathered": "a DeepSpeed learner's gathered parameters (ZeRO-3: no hf_state_dict shortcut)",
    "._done": "an R3L environment's own done flag, set after the gold-path walk (environments/base.py)",
    "._fault_injection": "the config's fault plan, set by faults.inject (a test aid, not an option)",
}
ALLOWED = {**RAY, **OTHER}

# Private methods of another package's class that an R3L class overrides: "Class._name" -> why.
OVERRIDES: Dict[str, str] = {
    "R3LCausalLMModule._forward": "RLModule's documented extension point (the underscore is RLlib's)",
    "R3LCausalLMModule._forward_train": "the same",
    "R3LTorchLearner._update": "micro-batch gradient accumulation, the non-finite check and one step: TorchLearner's "
    "public hooks (compute_losses/compute_gradients/apply_gradients) see one batch at once",
    "FaultInjectingLearner._update": "a testing aid: decides the update's injected faults around R3L's own update",
    "R3LTorchLearner._set_optimizer_state": "a DeepSpeed checkpoint's optimizer state refused into plain AdamW "
    "with a warning (RLlib's set_state calls it)",
    "R3LDeepSpeedLearner._update": "DeepSpeed's engine owns backward and step",
    "R3LDeepSpeedLearner._get_optimizer_state": "ZeRO's partitioned optimizer state, gathered per rank",
    "R3LDeepSpeedLearner._set_optimizer_state": "the same, restored",
    "R3LDeepSpeedLearner._make_modules_ddp_if_necessary": "DeepSpeed does the data parallelism, not torch DDP",
    "R3LDeepSpeedLearner._restore_all_subcomponents_from_path": "fp32 master weights follow a restored module",
}


def _package_files(root: Path):
    for pkg in PACKAGES:
        yield from sorted((root / pkg).rglob("*.py"))


def _private(part: str) -> bool:
    return part.startswith("_") and not part.startswith("__")


def private_uses(root: Path = Path(REPO_ROOT)) -> Dict[str, Set[str]]:
    """``{name: {files}}`` of the private names of other packages (and other objects) the package uses."""
    trees = {p: ast.parse(p.read_text()) for p in _package_files(root)}
    ours = {
        n.name
        for t in trees.values()
        for n in ast.walk(t)
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
    }
    ours |= {
        target.id
        for t in trees.values()
        for n in t.body
        if isinstance(n, (ast.Assign, ast.AnnAssign))
        for target in (n.targets if isinstance(n, ast.Assign) else [n.target])
        if isinstance(target, ast.Name)
    }
    found: Dict[str, Set[str]] = {}

    def add(name: str, path: Path) -> None:
        found.setdefault(name, set()).add(str(path.relative_to(root)))

    for path, tree in trees.items():
        for n in ast.walk(tree):
            if isinstance(n, ast.Import):
                for a in n.names:
                    if not a.name.startswith(PACKAGES) and any(map(_private, a.name.split("."))):
                        add(a.name, path)
            elif isinstance(n, ast.ImportFrom) and n.level == 0 and n.module and not n.module.startswith(PACKAGES):
                if any(map(_private, n.module.split("."))):
                    add(n.module, path)
                for a in n.names:
                    if _private(a.name):
                        add(f"{n.module}.{a.name}", path)
            elif isinstance(n, ast.Attribute) and _private(n.attr):
                if (
                    not (isinstance(n.value, ast.Name) and n.value.id in ("self", "cls"))
                    and n.attr not in ours
                    and not n.attr.startswith(OWN_PREFIX)
                ):
                    add(f".{n.attr}", path)
            elif (
                isinstance(n, ast.Call)
                and isinstance(n.func, ast.Name)
                and n.func.id in ("getattr", "setattr", "hasattr")
            ):
                if len(n.args) >= 2 and isinstance(n.args[1], ast.Constant) and isinstance(n.args[1].value, str):
                    attr, obj = n.args[1].value, n.args[0]
                    if (
                        _private(attr)
                        and not attr.startswith(OWN_PREFIX)
                        and not (isinstance(obj, ast.Name) and obj.id in ("self", "cls"))
                    ):
                        add(f"getattr:{attr}", path)
    return found


def private_overrides() -> Dict[str, str]:
    """``{"Class._name": module}``: private methods of another package's base classes that R3L overrides."""
    found = {}
    for pkg in PACKAGES:
        root = importlib.import_module(pkg)
        for info in pkgutil.walk_packages(root.__path__, prefix=f"{pkg}."):
            try:
                mod = importlib.import_module(info.name)
            except ImportError:  # an optional simulator that is not installed: nothing of it runs
                continue
            for cls in vars(mod).values():
                if not inspect.isclass(cls) or cls.__module__ != mod.__name__:
                    continue
                foreign = [b for b in cls.__mro__[1:] if not b.__module__.startswith(PACKAGES + ("builtins",))]
                for name, value in vars(cls).items():
                    method = inspect.isfunction(value) or isinstance(value, (staticmethod, classmethod, property))
                    sunder = name.endswith("_")  # enum's and abc's machinery (_generate_next_value_)
                    if _private(name) and not sunder and method and any(name in vars(b) for b in foreign):
                        found[f"{cls.__name__}.{name}"] = mod.__name__
    return found


def test_every_private_name_the_package_touches_is_listed_with_its_reason():
    found = private_uses()
    new = {k: sorted(v) for k, v in found.items() if k not in ALLOWED}
    assert not new, (
        "private names of other packages used without a decision: add each to ALLOWED with why "
        f"no public name does, or use the public one: {new}"
    )
    gone = sorted(set(ALLOWED) - set(found))
    assert not gone, f"listed but no longer used: take them off ALLOWED: {gone}"
    assert all(reason.strip() for reason in [*ALLOWED.values(), *OVERRIDES.values()])


def test_every_private_method_of_another_package_that_r3l_overrides_is_listed():
    found = private_overrides()
    assert set(found) == set(OVERRIDES), {
        "not listed": sorted(set(found) - set(OVERRIDES)),
        "listed, no longer overridden": sorted(set(OVERRIDES) - set(found)),
    }


def test_the_scanner_sees_each_kind_of_private_use(tmp_path):
    """The scanner itself: a planted use of each kind is found; self's own private names are not."""
    pkg = tmp_path / "rllib_r3l"
    pkg.mkdir()
    (pkg / "planted.py").write_text(
        "import ray._private.worker\nfrom ray.tune.utils.serialization import _loads_with_cloudpickle\n"
        "def f(algo):\n    algo._counters['x'] += 1\n    return getattr(algo, '_storage', None)\n"
        "class C:\n    def g(self):\n        self._mine = 1\n        obj._r3l_tag = 1\n"
    )
    found = private_uses(tmp_path)
    assert set(found) == {
        "ray._private.worker",
        "ray.tune.utils.serialization._loads_with_cloudpickle",
        "._counters",
        "getattr:_storage",
    }


def test_every_private_name_of_ray_lives_in_the_adapter_behind_its_version_check():
    found = private_uses()
    outside = {k: sorted(f for f in found[k] if f != ADAPTER) for k in RAY if k in found}
    assert not any(outside.values()), f"Ray's private names outside {ADAPTER}: {outside}"
    text = (REPO_ROOT / ADAPTER).read_text()
    bodies = [b for b in text.split("\ndef ")[1:] if not b.startswith("check_version")]
    assert bodies and all("check_version()" in b for b in bodies), "an adapter function without the version check"


def test_another_ray_version_is_a_named_error_not_a_silent_nothing(monkeypatch, tmp_path):
    import ray

    from rllib_r3l import ray_internals
    from rllib_r3l.cli import resume_from

    ray_internals.check_version()  # the installed one passes
    monkeypatch.setattr(ray, "__version__", "2.61.0")
    with pytest.raises(
        ray_internals.RayInternalsError, match=r"Ray 2\.60\.x.*this is Ray 2\.61\.0.*ray\[rllib\]==2\.60"
    ):
        ray_internals.check_version()
    # before: the reader of Tune's saved state caught everything and returned [] (a resume choosing nothing)
    with pytest.raises(ray_internals.RayInternalsError):
        resume_from._state_trials(str(tmp_path))
    monkeypatch.setattr(ray, "__version__", "2.60.3")
    assert resume_from._state_trials(str(tmp_path)) == []  # a patch release is the same layout; no state: none


def test_train_on_another_ray_says_so_in_one_line_before_anything_runs(monkeypatch, capsys):
    import ray

    from rllib_r3l.cli import commands

    monkeypatch.setattr(ray, "__version__", "3.0.0")
    toy = str(REPO_ROOT / "tuned_examples" / "cpu" / "toy_corridor_tiny.yaml")
    assert commands.main(["train", toy, "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "this is Ray 3.0.0" in err and "Traceback" not in err
