"""The engine's end of vLLM's weight-transfer engine API (``rllib_r3l.generation.weight_transfer``; the
trainer's end is ``rllib_r3l.learner.weight_sync.WeightTransferSync``): join the trainer's transfer group,
receive one update's weights per round, leave the group (aborting a round begun and not finished).

A mixin of ``VLLMBackend``: it uses the backend's ``_llm`` (a ``vllm.LLM``), ``_in_process``, ``_asleep``,
``wake_up`` and ``_reset_prefix_cache``.
"""

from __future__ import annotations

import time
from typing import Any, Dict

from rllib_r3l.generation.vllm_weights import quiet_reload_logs
from rllib_r3l.generation.weight_transfer import engine_info, install_on_worker, leave_transfer_group


class TransferEndpoint:
    """vLLM's weight-transfer engine API on an in-process ``vllm.LLM``."""

    def weight_transfer_info(self) -> Dict[str, Any]:
        """What the trainer needs to choose and open a transfer group with this engine."""
        return engine_info(self, self._llm.llm_engine.vllm_config.parallel_config, in_process=self._in_process)

    def init_weight_transfer(self, backend: str, init_info: Dict[str, Any], session: str) -> None:
        """Join the trainer's transfer group (blocks until the trainer opens its end)."""
        self.transfer_session = None
        self._llm.collective_rpc(install_on_worker, args=(backend,))
        self._llm.init_weight_transfer_engine({"init_info": init_info})
        self.transfer_session = session

    def start_weight_update(self) -> None:
        self._transfer_t0 = time.perf_counter()
        if "weights" in self._asleep:  # sleeping engine: bring the weight memory back first
            self.wake_up(["weights"])
        self._llm.start_weight_update()

    def receive_weights(self, update_info: Dict[str, Any]) -> None:
        """Receive one update's weights from the trainer's broadcast (vLLM's ``update_weights``)."""
        with quiet_reload_logs():
            self._llm.update_weights({"update_info": update_info})

    def finish_weight_update(self) -> None:
        with quiet_reload_logs():
            self._llm.finish_weight_update()
        self._reset_prefix_cache()
        self.last_update_seconds = time.perf_counter() - getattr(self, "_transfer_t0", time.perf_counter())

    def shutdown_weight_transfer(self) -> None:
        """Leave the group; a round begun and not finished is aborted first (``leave_transfer_group``)."""
        self.transfer_session = None
        leave_transfer_group(self._llm)
