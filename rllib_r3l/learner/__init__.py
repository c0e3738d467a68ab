"""The learner side of R3L (paper §4, "Objective"): the policy as an RLModule, the loss with
gradient accumulation, shared-prefix training, precision, data parallelism and weight sync.

``torch_learner`` (plain torch / DDP) and ``deepspeed_learner`` (ZeRO) train ``rl_module``;
``prefix_tree`` and ``cascade_attention`` run shared prefixes once; ``weight_sync`` pushes the
learner's weights into the generation engines. ``prefix_tree`` imports with torch and numpy alone.
"""
