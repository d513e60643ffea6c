"""Every kind of artifact a run stores, with what its name and content hold.

Artifacts are versioned JSON documents in the run's store (:mod:`coevo.store.artifacts` keeps them;
``store.put_artifact(run_id, kind, name, content, key=...)``). This module is the one list of their kinds;
code that writes or reads an artifact names its kind through the constants here, and
``tests/test_import_graph.py`` checks that no ``put_artifact`` call in the package uses another kind.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ArtifactKind:
    """One artifact kind.

    Attributes:
        kind: the stored ``kind`` string.
        written_by: the module that writes it.
        name: what the artifact's ``name`` is.
        content: field -> meaning of the JSON content.
    """

    kind: str
    written_by: str
    name: str
    content: dict[str, str]


SKILL = "skill"
SKILL_GATE = "skill_gate"
HEURISTIC = "heuristic"
ES_MEMBER = "es_member"
LOOP_STEP = "loop_step"
STEP_CUT = "step_cut"
REPORT_SECTION = "report_section"
CONTEXT = "context"
RUN_IDENTITY = "run_identity"
CONTEXT_SCORE = "context_score"
SAMPLER_UPDATE = "sampler_update"

ARTIFACT_KINDS: dict[str, ArtifactKind] = {
    a.kind: a
    for a in (
        ArtifactKind(
            SKILL,
            "coevo.skills.versions",
            "the skill's name",
            {
                "format": "content format (1)",
                "name": "the skill's name",
                "files": "relative path -> text of every UTF-8 file of the version (SKILL.md included)",
                "binary_files": "relative path -> base64 of any other file",
                "diff": "unified diff from the parent version",
                "trajectory_ids": "store ids of the trajectories that caused it",
            },
        ),
        ArtifactKind(
            SKILL_GATE,
            "coevo.evolvers.trace2skill",
            "``<skill>/<evolver>`` (meta: the gate's label)",
            {
                "score": "held-out gate score (the rollout's member reward)",
                "version": "skill version gated",
                "split": "rollout split of the gate",
                "trajectory_ids": "store ids of the gate's episodes",
            },
        ),
        ArtifactKind(
            HEURISTIC,
            "coevo.evolvers.ahd_common",
            "``<problem>/<evolver>``",
            {
                "id, thought, code, objective, reward, operator, generation, parents, source, member": "the best heuristic so far (coevo.ahd.population.Individual fields)",
                "problem": "problem name",
                "instances": "training-set tag",
            },
        ),
        ArtifactKind(
            ES_MEMBER,
            "coevo.evolvers.es",
            "key prefix of an ES member or centre evaluation",
            {
                "keys": "trajectory keys of the member's rollout",
                "member": "ESMember fields, or None for the centre",
            },
        ),
        ArtifactKind(
            LOOP_STEP,
            "coevo.loop",
            "the evolver's name",
            {
                "samples, trajectories, best_reward, reward_unit, metrics, stop, stop_reason": "the step's StepReport",
                "round, evolver, space, samples_total, wall_s": "when and how long",
            },
        ),
        ArtifactKind(
            STEP_CUT,
            "coevo.loop",
            "the evolver's name",
            {
                "round, slot, evolver, space": "the step the wall-clock budget cut (it re-runs on resume)",
                "reason": "the stop line's budget part (``wall-clock budget reached ...``)",
                "wall_s, max_wall_s": "wall seconds of the run when it was cut (all sessions) and its budget",
                "samples_total": "LLM samples in the store then (the cut batch is not among them)",
                "cut_batch": "None (cut between two LLM calls) or the call decoding was stopped in: rows, "
                "rows_decoded, new_tokens, decode_s, backend (``coevo.errors.DeadlineReached``)",
            },
        ),
        ArtifactKind(
            CONTEXT,
            "coevo.context",
            "the published context key (e.g. ``system_prompt``, ``skill``)",
            {
                "key": "the context key",
                "value": "the published JSON value (a prompt text, a skill's {name, version, path, source}, ...)",
                "evolver": "the evolver that published it",
                "round": "the loop round it was published in",
            },
        ),
        ArtifactKind(
            CONTEXT_SCORE,
            "coevo.evolvers.base",
            "key prefix of the scored call (``<run>/<evolver>/score/...``)",
            {
                "keys": "trajectory keys of the call",
                "score": "the rollout's member reward of them",
                "versions": "context key -> version scored (-1: an unpublished candidate)",
                "split, generation": "which cases",
            },
        ),
        ArtifactKind(
            SAMPLER_UPDATE,
            "coevo.evolvers.sampler_training",
            "``<run>/<evolver>/<update, 5 digits>``",
            {
                "evolver, method, update, round": "who updated (grpo_ahd / dpo_ahd) and when",
                "answers, groups, answer_kinds, mean_reward, group_spread": "the step's groups and their typed rewards",
                "pairs, prompts_with_pairs": "dpo: preference pairs trained on",
                "skipped": "why the update was skipped (one line), or None",
                "loss": "the trainer's mean training loss",
                "wall_s, rss_before_mib, peak_rss_mib, peak_scope, peak_cuda_mib, peak_before_mib": "the update's cost (coevo.training.meter)",
                "adapter, adapter_hash": "the adapter folder after the update (relative to the run folder), its hash",
            },
        ),
        ArtifactKind(
            RUN_IDENTITY,
            "coevo.loop",
            "``run``",
            {
                "run_id": "the run's id, fixed when the run was created (a copied folder keeps it)",
                "folder": "the folder name the run was created in",
            },
        ),
        ArtifactKind(
            REPORT_SECTION,
            "coevo.evolvers.base",
            "``<run id>/<evolver>``",
            {
                "evolver": "the evolver's name",
                "markdown": "its report section (Evolver.report_markdown)",
            },
        ),
    )
}
