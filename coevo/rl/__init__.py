"""Reinforcement-learning baselines on coevo's environments (agentic GRPO with TRL, :mod:`coevo.rl.grpo`).

Needs the ``rl`` extra (``pip install coevo[rl]``: TRL).
"""
