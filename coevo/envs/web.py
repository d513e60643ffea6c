"""A thin, text-only wrapper over BrowserGym gym environments.

BrowserGym (Drouin et al. 2024, "WorkArena", §3; github.com/ServiceNow/BrowserGym) registers each task as a
gymnasium env ``browsergym/<benchmark>.<task>`` whose observation holds the page's accessibility tree
(``axtree_object``), URL, goal and the error of the last action; actions are high-level strings such as
``click('13')`` turned into Playwright calls by ``HighLevelActionSet.to_python_code``.

:class:`WebEnv` reduces this to what a text agent needs:

* ``reset(task, seed) -> obs``, ``step(action) -> (obs, reward, done, info)``, ``close()``;
* ``obs`` is a dict ``{"task_id", "goal", "axtree", "url", "last_action_error", "open_pages_urls",
  "clickable"}``: str values, ``open_pages_urls`` a list of str, ``clickable`` the list of element ids (str)
  shown in the tree that BrowserGym marks clickable; the tree is flattened by
  ``browsergym.utils.obs.flatten_axtree_to_str`` (lines like ``[13] button 'no'``; the number in brackets is
  the element id ``bid`` actions refer to) with :data:`AXTREE_OPTIONS`.

Every element an action can target is in the text: BrowserGym's defaults (``skip_generic=True``, no
clickable tag) drop ``generic`` nodes without properties, which is how MiniWoB++'s click-link and any page
of clickable ``<span>`` / ``<div>`` elements lose their targets (only their ``StaticText`` children, without
an id, remain). We keep generic nodes and tag clickable ones (``[13] generic, clickable`` over
``StaticText 'ornare'``), the clickable tag coming from BrowserGym's ``extra_element_properties``, as
AgentLab's GenericAgent does with ``extract_clickable_tag`` (``make_obs_preprocessor`` in
``agentlab/agents/dynamic_prompting.py``; BrowserGym's ``demo_agent`` keeps the defaults and so cannot click
such links). The cost on MiniWoB++ pages is measured by ``benchmarks/web_obs_tokens.py``.

Benchmarks subclass it (:mod:`coevo.envs.miniwob`, :mod:`coevo.envs.webarena_lite`). One gym env (one
headless Chromium) is kept per task and relaunched by BrowserGym at every reset; all calls must come from the
thread that created the env (Playwright's sync API).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from typing_extensions import Self

#: the agent's action space: BrowserGym high-level actions (``noop`` is always included by BrowserGym)
WEB_ACTION_NAMES = (
    "click",
    "fill",
    "select_option",
    "press",
    "scroll",
    "goto",
    "send_msg_to_user",
    "report_infeasible",
    "noop",
)


#: accessibility-tree roles left out of the text: BrowserGym's defaults plus ``InlineTextBox`` (each repeats
#: its parent's text; dropping them shortens MiniWoB++ trees by about a third)
IGNORED_ROLES = ("LineBreak", "InlineTextBox")

#: keyword arguments of ``flatten_axtree_to_str`` besides the tree, the element properties and the ignored
#: roles: keep ``generic`` nodes (clickable spans and divs have that role) and tag clickable elements
AXTREE_OPTIONS: dict[str, Any] = {"skip_generic": False, "with_clickable": True}


class WebEnvError(RuntimeError):
    """The browser or the task failed outside of an action (launch, navigation, task set-up, crash)."""


class TaskEvaluationError(RuntimeError):
    """The task's evaluator failed (e.g. an LLM judge without an API key): the episode has no reward.

    Raised by :meth:`WebEnv.step` when BrowserGym's ``task.validate`` raises; the cause is chained. The
    browser itself is fine, so this is not a :class:`WebEnvError`.
    """


def web_action_set(names: Sequence[str] | None = None) -> Any:
    """The BrowserGym ``HighLevelActionSet`` of ``names`` (default :data:`WEB_ACTION_NAMES`), one action per
    step; BrowserGym always adds ``noop``.

    Its ``describe()`` gives the signatures, descriptions and examples used in the agent's system prompt;
    its ``to_python_code`` is the env's action mapping, which rejects any other action name (the error
    lands in ``last_action_error``).

    Raises:
        ValueError: an empty list or a name not in :data:`WEB_ACTION_NAMES` (named).
    """
    from browsergym.core.action import functions
    from browsergym.core.action.highlevel import HighLevelActionSet

    chosen = list(WEB_ACTION_NAMES if names is None else names)
    unknown = sorted(set(chosen) - set(WEB_ACTION_NAMES))
    if unknown or not chosen:
        raise ValueError(f"actions: unknown {unknown or 'empty list'}; allowed: {list(WEB_ACTION_NAMES)}")
    custom = [getattr(functions, name) for name in dict.fromkeys(chosen) if name != "noop"]
    return HighLevelActionSet(subsets=["custom"], custom_actions=custom, multiaction=False, strict=False)


def action_names(action_set: Any) -> tuple[str, ...]:
    """The action names of a BrowserGym ``HighLevelActionSet`` (``noop`` first), in its order."""
    return tuple(action_set.action_set)


def goal_text(raw_obs: dict[str, Any]) -> str:
    """The text parts of BrowserGym's ``goal_object`` joined by newlines (images are skipped)."""
    parts = [m.get("text", "") for m in raw_obs.get("goal_object") or () if m.get("type") == "text"]
    return "\n".join(p for p in parts if p) or str(raw_obs.get("goal") or "")


_BID_LINE = re.compile(r"^\s*\[([^\]]+)\] ")


def flatten_observation(
    raw: dict[str, Any], ignored_roles: Sequence[str] = IGNORED_ROLES, options: dict[str, Any] | None = None
) -> dict[str, Any]:
    """``{"axtree": str, "clickable": [bid, ...]}`` of a raw BrowserGym observation.

    ``axtree`` is ``flatten_axtree_to_str(raw["axtree_object"], extra_properties=raw["extra_element_properties"],
    ignored_roles=..., **options)`` (default :data:`AXTREE_OPTIONS`); ``clickable`` lists, in tree order, the
    ids shown in that text whose element BrowserGym marks clickable (empty for a page without one).
    """
    from browsergym.utils.obs import flatten_axtree_to_str

    props = raw.get("extra_element_properties") or {}
    text = flatten_axtree_to_str(
        raw["axtree_object"],
        extra_properties=props,
        ignored_roles=list(ignored_roles),
        **(AXTREE_OPTIONS if options is None else options),
    )
    shown = [m.group(1) for m in map(_BID_LINE.match, text.splitlines()) if m]
    return {"axtree": text, "clickable": [b for b in shown if (props.get(b) or {}).get("clickable")]}


class WebEnv:
    """A BrowserGym benchmark as a text environment.

    Args:
        benchmark: BrowserGym benchmark prefix (``"miniwob"``, ``"webarenalite"``); the gym id of a task is
            ``browsergym/<benchmark>.<task>``.
        headless: run Chromium headless (BrowserGym warns that headful mode changes task difficulty).
        timeout_ms: Playwright timeout per action (ms); ``None`` keeps the task's default.
        gym_kwargs: extra keyword arguments for ``gym.make`` (e.g. ``task_kwargs``).
        actions: the browser actions offered (subset of :data:`WEB_ACTION_NAMES`; default all). The same set
            is the env's action mapping, the agent's prompt and the agent's parser (:attr:`action_names`).

    Raises:
        ValueError: for an empty ``benchmark``, a non-positive ``timeout_ms`` or an unknown action.
    """

    def __init__(
        self,
        benchmark: str,
        *,
        headless: bool = True,
        timeout_ms: int | None = None,
        gym_kwargs: dict[str, Any] | None = None,
        actions: Sequence[str] | None = None,
    ) -> None:
        if not benchmark or not isinstance(benchmark, str):
            raise ValueError(f"benchmark must be a non-empty string, got {benchmark!r}")
        if timeout_ms is not None and timeout_ms <= 0:
            raise ValueError(f"timeout_ms must be > 0, got {timeout_ms}")
        self.benchmark = benchmark
        self.headless = headless
        self.timeout_ms = timeout_ms
        self.gym_kwargs = dict(gym_kwargs or {})
        self.ignored_roles = [*IGNORED_ROLES]
        self.action_set = web_action_set(actions)
        self._env: Any = None
        self._env_task: str | None = None
        self.task_id: str | None = None
        #: BrowserGym's raw observation after the last reset / step (``None`` before the first)
        self.raw_obs: dict[str, Any] | None = None

    @property
    def action_names(self) -> tuple[str, ...]:
        """Names of the actions this env executes (``noop`` included)."""
        return action_names(self.action_set)

    # -- hooks for subclasses -------------------------------------------------------------------------
    def check_task(self, task: str) -> None:
        """Raise ``ValueError`` naming ``task`` when the benchmark does not have it (overridden)."""
        if not task or not isinstance(task, str):
            raise ValueError(f"task must be a non-empty string, got {task!r}")

    def prepare(self) -> None:
        """Import / configure the benchmark before the first launch (overridden; default: nothing to do)."""

    # -- gym plumbing ----------------------------------------------------------------------------------
    def gym_id(self, task: str) -> str:
        return f"browsergym/{self.benchmark}.{task}"

    def _make(self, task: str) -> Any:
        import gymnasium as gym

        kwargs = dict(self.gym_kwargs)
        kwargs.setdefault("headless", self.headless)
        if self.timeout_ms is not None:
            kwargs.setdefault("timeout", self.timeout_ms)
        kwargs.setdefault("action_mapping", self.action_set.to_python_code)
        return gym.make(self.gym_id(task), **kwargs)

    def _observation(self, raw: dict[str, Any]) -> dict[str, Any]:
        self.raw_obs = raw
        return {
            "task_id": self.task_id,
            "goal": goal_text(raw),
            **flatten_observation(raw, self.ignored_roles),
            "url": str(raw.get("url") or ""),
            "last_action_error": str(raw.get("last_action_error") or ""),
            "open_pages_urls": [str(u) for u in raw.get("open_pages_urls") or ()],
        }

    # -- public API ------------------------------------------------------------------------------------
    def reset(self, task: str, seed: int) -> dict[str, Any]:
        """Start ``task`` with ``seed`` (int >= 0) in a fresh browser; return the first observation.

        Raises:
            ValueError: unknown task or bad seed.
            WebEnvError: the browser could not start or the task could not be set up.
        """
        task = str(task)
        self.check_task(task)
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ValueError(f"seed must be an int >= 0, got {seed!r}")
        self.prepare()
        import playwright.sync_api

        if self._env is not None and self._env_task != task:
            self.close()
        self.task_id = f"{task}:{seed}"
        try:
            if self._env is None:
                self._env = self._make(task)
                self._env_task = task
            raw, _info = self._env.reset(seed=seed)
        except (playwright.sync_api.Error, TimeoutError, AssertionError) as exc:
            self.close()
            raise WebEnvError(f"{self.gym_id(task)} reset(seed={seed}) failed: {type(exc).__name__}: {exc}") from exc
        self._guard_evaluator()
        return self._observation(raw)

    def _guard_evaluator(self) -> None:
        """Wrap the new task's ``validate`` so that an evaluator failure surfaces as TaskEvaluationError."""
        task = getattr(self._env.unwrapped, "task", None)
        validate = getattr(task, "validate", None)
        if validate is None or getattr(validate, "_coevo_guarded", False):
            return

        def guarded(page: Any, chat_messages: Any) -> Any:
            try:
                return validate(page, chat_messages)
            except Exception as exc:  # any evaluator error: the episode gets no reward
                raise TaskEvaluationError(
                    f"{self.task_id}: the task's evaluator failed: {type(exc).__name__}: {exc}"
                ) from exc

        guarded._coevo_guarded = True  # type: ignore[attr-defined]
        task.validate = guarded

    def step(self, action: str) -> tuple[dict[str, Any], float, bool, dict[str, Any]]:
        """Execute one high-level action string.

        Returns:
            ``(obs, reward, done, info)``: reward as the task defines it (MiniWoB++: 1.0 when the raw reward
            is > 0, else 0.0), ``done`` = terminated or truncated, ``info`` BrowserGym's step info.
            A failing action is not an exception: its error is in ``obs["last_action_error"]``.

        Raises:
            RuntimeError: when called before :meth:`reset`.
            WebEnvError: the browser itself failed (crash, closed page).
            TaskEvaluationError: the task's evaluator raised (e.g. an LLM judge without its API key); the
                episode has no reward.
        """
        if self._env is None:
            raise RuntimeError("WebEnv.step() called before reset()")
        import playwright.sync_api

        try:
            raw, reward, terminated, truncated, info = self._env.step(action)
        except TaskEvaluationError:
            raise
        except (playwright.sync_api.Error, TimeoutError) as exc:
            raise WebEnvError(f"{self.task_id}: step({action!r}) failed: {type(exc).__name__}: {exc}") from exc
        return self._observation(raw), float(reward), bool(terminated or truncated), dict(info)

    def close(self) -> None:
        """Close the browser (idempotent)."""
        env, self._env, self._env_task = self._env, None, None
        if env is not None:
            env.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
