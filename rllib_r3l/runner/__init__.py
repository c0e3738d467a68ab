"""The env-runner side of R3L (paper §4, "Reflect-then-retry"): multi-turn episodes with an LLM,
reflection on failures, retries from the pivot, and the explored task groups handed to the learner.

``env_runner`` (the RLlib EnvRunner) -> ``explore`` (base -> reflect -> retry) -> ``rollout``
(episodes, a retry replaying its base's prefix) on ``chat`` segments; ``reflection/`` holds the
reflector's prompt, report parsing, context and the oracle diagnostics.
"""
