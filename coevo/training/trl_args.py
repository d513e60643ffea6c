"""TRL trainer arguments coevo sets the same way for every trainer (GRPO baseline, sampler-training evolvers).

coevo drives TRL's trainers itself: no checkpoints of TRL's own (coevo writes its own), no reporting services, no
progress bars (coevo's progress lines report), the dataset's extra columns kept (the rollout and reward functions
read them), data loaded in the main process, and the CPU used unless the device is CUDA.
"""

from __future__ import annotations

from typing import Any


def common_trainer_args(*, device: str = "cpu", seed: int = 0, bf16: bool = False) -> dict[str, Any]:
    """Keyword arguments of ``transformers.TrainingArguments`` (and TRL's ``GRPOConfig`` / ``DPOConfig``) that
    every coevo trainer shares; a caller adds its own (learning rate, batch sizes, loss settings).

    Args:
        device: ``"cpu"`` or a CUDA device (``use_cpu`` is set for the CPU).
        seed: seed of TRL's data order and of torch's RNG at the start of training (also ``data_seed``).
        bf16: bf16 autocast of the training compute (mixed precision over float32 weights).
    """
    return {
        "seed": int(seed),
        "data_seed": int(seed),
        "use_cpu": device == "cpu",
        "bf16": bf16,
        "fp16": False,
        "report_to": [],
        "logging_steps": 1,
        "save_strategy": "no",
        "disable_tqdm": True,
        "dataloader_num_workers": 0,
        "remove_unused_columns": False,
        "lr_scheduler_type": "constant",
    }


def grpo_step_args(
    *,
    prompts: int,
    group: int,
    micro_batch: int,
    beta: float,
    epsilon: float,
    loss_type: str,
    scale_rewards: Any,
    gradient_checkpointing: bool,
) -> dict[str, Any]:
    """Keyword arguments of TRL's ``GRPOConfig`` for coevo's GRPO step, shared by the Sudoku baseline
    (:mod:`coevo.rl.grpo`) and ``grpo_ahd``: one optimizer step = one generation batch of ``prompts`` x ``group``
    answers, in micro-batches of ``micro_batch`` (which must divide it), each group scored once (one iteration).
    """
    steps = prompts * group // micro_batch
    return {
        "per_device_train_batch_size": micro_batch,
        "gradient_accumulation_steps": steps,
        "steps_per_generation": steps,
        "num_generations": group,
        "num_iterations": 1,
        "beta": beta,
        "epsilon": epsilon,
        "loss_type": loss_type,
        "scale_rewards": scale_rewards,
        "gradient_checkpointing": gradient_checkpointing,
        "log_completions": False,
    }
