"""The ES math of coevo, shared by every backend (HF in-process, Ray actors, vLLM worker extension).

Backends call these functions with ``(canonical HF name, tensor)`` pairs:

  noise     counter-based Gaussian noise keyed by (seed, name, chunk); fused (vLLM) tensors
  scope     which tensors ES touches (full / all_linear, include / exclude patterns)
  params    ESParams: the tensors in canonical order, optional float32 masters, perturbation guard
  perturb   in-place perturb / exact restore (context manager), exception safe
  lowrank   EGGROLL low-rank perturbations: keyed factors, population forward term, exact update with
            deterministic stochastic rounding (perturbation: lowrank)
  normalize fitness shaping (zscore, centered_rank, none)
  update    the full-rank ES update, exact and device independent; skipped at sigma == 0
  schedule  constant / linear / cosine schedules with warm-up
  hashing   weights_hash
  history   GenerationRecord and the one replay loop (apply_records, replay)
  replica   the ESReplica protocol every backend implements (typing only)

Method: Agentic-ESOpt (arXiv 2608.17310), Salimans et al. 2017, EGGROLL (arXiv 2511.16652); see
docs/references.md §1 and §6.
"""

from coevo.es.hashing import weights_hash
from coevo.es.history import GenerationRecord, ReplayMismatchError, ReplayReport, apply_records, replay
from coevo.es.lowrank import LOWRANK_SPEC, FactorBank, draw_factors, lowrank_update, stochastic_round
from coevo.es.noise import (
    NOISE_CHUNK_NUMEL,
    NOISE_SPEC,
    NoiseBuffer,
    chunk_seed,
    fused_noise,
    generate_noise,
    iter_noise,
    noise_layout,
)
from coevo.es.normalize import centered_ranks, normalize_rewards
from coevo.es.params import ESParams
from coevo.es.perturb import Perturbation, perturb
from coevo.es.schedule import Schedule
from coevo.es.scope import ScopeSpec, select_params
from coevo.es.update import UpdateStats, es_update, fold_members

__all__ = [
    "LOWRANK_SPEC",
    "NOISE_CHUNK_NUMEL",
    "NOISE_SPEC",
    "ESParams",
    "FactorBank",
    "GenerationRecord",
    "NoiseBuffer",
    "Perturbation",
    "ReplayMismatchError",
    "ReplayReport",
    "Schedule",
    "ScopeSpec",
    "UpdateStats",
    "apply_records",
    "centered_ranks",
    "chunk_seed",
    "draw_factors",
    "es_update",
    "fold_members",
    "fused_noise",
    "generate_noise",
    "iter_noise",
    "lowrank_update",
    "noise_layout",
    "normalize_rewards",
    "perturb",
    "replay",
    "select_params",
    "stochastic_round",
    "weights_hash",
]
