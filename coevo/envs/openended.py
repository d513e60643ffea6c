"""Any site: BrowserGym's open-ended task (a start URL and a goal) with a reward the user chooses.

BrowserGym's ``OpenEndedTask`` (``browsergym.core.task``; gym id ``browsergym/openended``) opens ``start_url``
and gives the agent ``goal``, but never rewards anything: it is meant for a human in the loop. Learning
(ES, Trace2Skill) needs a reward, so :class:`RewardedOpenEndedTask` adds one of four documented rules
(:class:`OpenEndedReward`), evaluated after every action:

* ``answer_contains: TEXT``: 1.0 when the agent's message to the user (``send_msg_to_user``) contains TEXT
  (case-insensitive); the episode ends with the first message, whatever it says;
* ``url_contains: TEXT``: 1.0 when the active page's URL contains TEXT; the episode ends on success;
* ``page_contains: TEXT``: 1.0 when the page's visible text (``document.body.innerText``) contains TEXT
  (case-insensitive); the episode ends on success;
* ``judge: "package.module:function"``: the user's own evaluator, called as
  ``function(page, chat_messages, goal) -> float`` with the Playwright page, BrowserGym's chat messages
  (dicts with ``role`` and ``message``) and the goal; a value > 0 is a success and ends the episode. If it
  raises, the episode is recorded as an evaluation error (no reward), never as a crash.

In every case a message to the user (or ``report_infeasible``) ends the episode. The task is registered as
``browsergym/coevo.openended``; :class:`OpenEndedEnv` runs it like any other :class:`~coevo.envs.web.WebEnv`
(task name ``"openended"``; the seed only labels the episode: the page is the user's).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from pydantic import ConfigDict, Field, model_validator

from coevo.envs.browser import ensure_browser_env
from coevo.envs.web import WebEnv
from coevo.schema import ConfigModel

GYM_BENCHMARK = "coevo"
TASK_NAME = "openended"
REWARD_RULES = ("answer_contains", "url_contains", "page_contains", "judge")


def import_judge(ref: str) -> Callable[..., Any]:
    """The callable named by ``"package.module:function"``.

    Raises:
        ValueError: malformed reference, import failure or a non-callable attribute (named).
    """
    mod, sep, attr = ref.partition(":")
    if not sep or not mod or not attr:
        raise ValueError(f"judge: {ref!r} must read 'package.module:function'")
    try:
        fn = getattr(importlib.import_module(mod), attr)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"judge: cannot import {ref!r} ({exc})") from None
    if not callable(fn):
        raise ValueError(f"judge: {ref!r} is not callable")  # noqa: TRY004 - a config value error, named
    return fn


class OpenEndedReward(ConfigModel):
    """Exactly one reward rule (module docstring)."""

    model_config = ConfigDict(extra="forbid")
    answer_contains: str | None = Field(None, min_length=1, description="the agent's answer contains this text")
    url_contains: str | None = Field(None, min_length=1, description="the page URL contains this text")
    page_contains: str | None = Field(None, min_length=1, description="the page's visible text contains this")
    judge: str | None = Field(None, description="'package.module:function(page, chat_messages, goal) -> float'")

    @model_validator(mode="after")
    def _one(self) -> OpenEndedReward:
        given = [r for r in REWARD_RULES if getattr(self, r) is not None]
        if len(given) != 1:
            raise ValueError(f"reward: give exactly one of {list(REWARD_RULES)}, got {given or 'none'}")
        if self.judge is not None:
            import_judge(self.judge)
        return self


class OpenEndedSpec(ConfigModel):
    """``start_url`` + ``goal`` + ``reward`` of an open-ended episode."""

    model_config = ConfigDict(extra="forbid")
    start_url: str = Field(description="page the episode starts on (http://, https:// or file://)")
    goal: str = Field(min_length=1, description="the task, as the agent reads it")
    reward: OpenEndedReward = Field(description="how an episode is scored (one rule)")

    @model_validator(mode="after")
    def _url(self) -> OpenEndedSpec:
        if not self.start_url.startswith(("http://", "https://", "file://")):
            raise ValueError(f"start_url: {self.start_url!r} must start with http://, https:// or file://")
        return self


def _rewarded_task_class() -> type:
    """Build (once) the BrowserGym task class; imports BrowserGym lazily."""
    from browsergym.core.task import OpenEndedTask

    class RewardedOpenEndedTask(OpenEndedTask):
        """BrowserGym's open-ended task with a reward rule (``reward``: an :class:`OpenEndedReward` dict)."""

        @classmethod
        def get_task_id(cls) -> str:
            return f"{GYM_BENCHMARK}.{TASK_NAME}"

        def __init__(self, seed: int, start_url: str, goal: str, reward: dict[str, Any]) -> None:
            super().__init__(seed, start_url=start_url, goal=goal)
            self.rule = OpenEndedReward.model_validate(reward)
            self._judge = import_judge(self.rule.judge) if self.rule.judge else None

        def validate(self, page: Any, chat_messages: list[dict[str, Any]]) -> tuple[float, bool, str, dict]:
            # BrowserGym's chat opens with an assistant greeting and the goal as a user message: answers follow
            first_user = next((i for i, m in enumerate(chat_messages) if m.get("role") == "user"), -1)
            after = chat_messages[first_user + 1 :]
            answers = [m["message"] for m in after if m.get("role") == "assistant"]
            stopped = bool(answers) or any(m.get("role") == "infeasible" for m in after)
            r = self.rule
            if r.answer_contains is not None:
                ok = bool(answers) and r.answer_contains.lower() in str(answers[-1]).lower()
            elif r.url_contains is not None:
                ok = r.url_contains in page.url
            elif r.page_contains is not None:
                ok = (
                    r.page_contains.lower()
                    in page.evaluate("() => document.body ? document.body.innerText : ''").lower()
                )
            else:
                ok = float(self._judge(page, chat_messages, self.goal)) > 0
            return (
                (1.0 if ok else 0.0),
                bool(ok or stopped),
                "",
                {"rule": next(k for k in REWARD_RULES if getattr(r, k) is not None)},
            )

    return RewardedOpenEndedTask


_TASK_CLASS: type | None = None


def register_openended() -> type:
    """Register ``browsergym/coevo.openended`` with gymnasium (idempotent); returns the task class."""
    global _TASK_CLASS
    if _TASK_CLASS is None:
        import gymnasium as gym
        from browsergym.core.registration import register_task

        _TASK_CLASS = _rewarded_task_class()
        if f"browsergym/{GYM_BENCHMARK}.{TASK_NAME}" not in gym.registry:
            register_task(_TASK_CLASS.get_task_id(), _TASK_CLASS)
    return _TASK_CLASS


class OpenEndedEnv(WebEnv):
    """An open-ended episode on the user's own site (module docstring).

    Args:
        spec: :class:`OpenEndedSpec` (or its dict): ``start_url``, ``goal``, ``reward``.
        setup_browser: call :func:`coevo.envs.browser.ensure_browser_env` first.
        **kwargs: :class:`~coevo.envs.web.WebEnv` options (``headless``, ``timeout_ms``, ``actions``).

    Raises:
        pydantic.ValidationError: an invalid spec (field named).
    """

    def __init__(self, spec: OpenEndedSpec | dict[str, Any], *, setup_browser: bool = True, **kwargs: Any) -> None:
        self.spec = spec if isinstance(spec, OpenEndedSpec) else OpenEndedSpec.model_validate(spec)
        if setup_browser:
            ensure_browser_env()
        gym_kwargs = dict(kwargs.pop("gym_kwargs", None) or {})
        gym_kwargs["task_kwargs"] = {
            "start_url": self.spec.start_url,
            "goal": self.spec.goal,
            "reward": self.spec.reward.model_dump(),
        }
        super().__init__(GYM_BENCHMARK, gym_kwargs=gym_kwargs, **kwargs)

    def check_task(self, task: str) -> None:
        super().check_task(task)
        if task != TASK_NAME:
            raise ValueError(f"an open-ended env runs the task {TASK_NAME!r}, got {task!r}")

    def prepare(self) -> None:
        register_openended()
