"""The learner side of R3L (paper §4, "Objective"): the policy as an RLModule, the loss with
gradient accumulation, shared-prefix training, precision, data parallelism and weight sync.

``torch_learner`` (plain torch / DDP) and ``deepspeed_learner`` (ZeRO) train ``rl_module``;
``prefix_tree`` and ``cascade_attention`` run shared prefixes once; ``weight_sync`` pushes the
learner's weights into the generation engines. ``prefix_tree`` imports with torch and numpy alone.
"""


def default_learner_class(config):
    """The learner ``config`` trains with: DeepSpeed's ZeRO learner, else R3L's torch learner; the
    fault-injecting subclass only when a fault plan names learner faults (a testing aid, ``faults.inject``)."""
    if config.deepspeed:
        from rllib_r3l.learner.deepspeed_learner import R3LDeepSpeedLearner

        return R3LDeepSpeedLearner
    from rllib_r3l.reliability import faults

    if faults.has_learner_faults(faults.fault_plan(config)):
        from rllib_r3l.reliability.learner_faults import FaultInjectingLearner

        return FaultInjectingLearner
    from rllib_r3l.learner.torch_learner import R3LTorchLearner

    return R3LTorchLearner
