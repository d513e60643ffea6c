"""MiniWoB++ through BrowserGym (``browsergym-miniwob``), fully offline.

MiniWoB++ (Shi et al., ICML 2017; Liu et al., ICLR 2018) is a suite of small synthetic web tasks, each a
static HTML page whose JavaScript draws a random instance from a seed and scores the episode. BrowserGym's
wrapper gives reward ``float(raw_reward > 0)`` (1.0 success, 0.0 otherwise) and ends the episode when the
page reports done. The pages ship in the ``miniwob`` package (see :mod:`coevo.envs.browser`).

Named task sets (:data:`MINIWOB_TASKSETS`) fix a list of tasks and disjoint train / held-out seed lists, so
that ES and skill evolution train on one set of instances and are measured on another.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from coevo.envs.browser import ensure_browser_env
from coevo.envs.web import WebEnv

Split = Literal["train", "heldout"]

#: tasks checked to reset in headless Chromium here (2 seeds each, 1.4-2.9 s per reset on 2 cores)
MINIWOB10_TASKS = (
    "click-button",
    "click-checkboxes",
    "enter-text",
    "click-link",
    "focus-text",
    "click-dialog",
    "click-tab",
    "enter-password",
    "login-user",
    "click-option",
)
MINIWOB_EXTENDED_TASKS = MINIWOB10_TASKS + (
    "choose-list",
    "use-autocomplete",
    "click-test",
    "click-test-2",
    "click-widget",
    "enter-text-2",
    "click-button-sequence",
    "click-collapsible",
    "navigate-tree",
)


@dataclass(frozen=True)
class MiniWoBTaskSet:
    """A named list of MiniWoB++ tasks with disjoint train and held-out seeds.

    Attributes:
        name: the set's name (key in :data:`MINIWOB_TASKSETS`).
        tasks: MiniWoB++ task names (``click-button``, ...).
        train_seeds, heldout_seeds: instance seeds (ints >= 0) for each split; disjoint.
    """

    name: str
    tasks: tuple[str, ...]
    train_seeds: tuple[int, ...]
    heldout_seeds: tuple[int, ...]

    def __post_init__(self) -> None:
        if not self.tasks:
            raise ValueError(f"task set {self.name!r}: tasks is empty")
        overlap = set(self.train_seeds) & set(self.heldout_seeds)
        if overlap:
            raise ValueError(f"task set {self.name!r}: train_seeds and heldout_seeds share {sorted(overlap)[:5]}")

    def seeds(self, split: Split) -> tuple[int, ...]:
        """Seeds of ``split`` (``"train"`` or ``"heldout"``); ``ValueError`` for any other split name."""
        if split == "train":
            return self.train_seeds
        if split == "heldout":
            return self.heldout_seeds
        raise ValueError(f"split must be 'train' or 'heldout', got {split!r}")

    def episodes(self, split: Split) -> list[tuple[str, int]]:
        """All ``(task, seed)`` pairs of ``split``, task-major."""
        return [(task, seed) for task in self.tasks for seed in self.seeds(split)]


MINIWOB_TASKSETS: dict[str, MiniWoBTaskSet] = {
    "miniwob10": MiniWoBTaskSet("miniwob10", MINIWOB10_TASKS, tuple(range(64)), tuple(range(10_000, 10_032))),
    "miniwob_extended": MiniWoBTaskSet(
        "miniwob_extended", MINIWOB_EXTENDED_TASKS, tuple(range(64)), tuple(range(10_000, 10_032))
    ),
    "miniwob_smoke": MiniWoBTaskSet("miniwob_smoke", ("click-test", "click-button"), (0, 1, 2, 3), (100, 101)),
}


def get_taskset(name: str) -> MiniWoBTaskSet:
    """The task set called ``name``; ``KeyError`` listing the known names otherwise."""
    try:
        return MINIWOB_TASKSETS[name]
    except KeyError:
        raise KeyError(f"unknown MiniWoB++ task set {name!r}; known: {sorted(MINIWOB_TASKSETS)}") from None


def miniwob_task_names() -> list[str]:
    """Every MiniWoB++ task BrowserGym registers (imports ``browsergym.miniwob``, which launches nothing)."""
    import browsergym.miniwob

    return sorted(task.subdomain for task in browsergym.miniwob.ALL_MINIWOB_TASKS)


class MiniWoBEnv(WebEnv):
    """MiniWoB++ tasks in headless Chromium.

    Args:
        setup_browser: call :func:`coevo.envs.browser.ensure_browser_env` first (sets ``MINIWOB_URL`` and
            ``PLAYWRIGHT_BROWSERS_PATH`` when unset).
        **kwargs: :class:`~coevo.envs.web.WebEnv` options (``headless``, ``timeout_ms``, ``gym_kwargs``).

    Raises:
        coevo.envs.browser.BrowserSetupError: no Chromium / miniwob package (when ``setup_browser``).
    """

    def __init__(self, *, setup_browser: bool = True, **kwargs: Any) -> None:
        if setup_browser:
            ensure_browser_env()
        super().__init__("miniwob", **kwargs)
        self._known: set[str] | None = None

    def check_task(self, task: str) -> None:
        super().check_task(task)
        if self._known is None:
            self._known = set(miniwob_task_names())
        if task not in self._known:
            raise ValueError(f"unknown MiniWoB++ task {task!r} (e.g. {sorted(self._known)[:5]} ...)")
