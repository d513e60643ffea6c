"""Training the sampler with gradients: the pieces the sampler-training evolvers (``grpo_ahd``, ``dpo_ahd``:
:mod:`coevo.evolvers.sampler_training`) and the agentic GRPO baseline (:mod:`coevo.rl.grpo`) share.

* :mod:`coevo.training.lora`: a LoRA adapter on the run's in-process model (PEFT): attach, save as a PEFT folder,
  load back, fingerprint;
* :mod:`coevo.training.meter`: wall time and peak resident memory of one update;
* :mod:`coevo.training.trl_args`: the TRL trainer arguments coevo sets the same way everywhere;
* :mod:`coevo.training.ahd_rewards`: CALM's typed rewards of heuristic answers, and answers' prompts read back
  from the store.

Needs the ``rl`` extra (TRL, datasets) and PEFT (the ``dev`` extra) where an update runs; importing this package
loads neither.
"""
