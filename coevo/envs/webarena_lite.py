"""WebArena-Lite through BrowserGym (``browsergym-webarenalite``) against the user's own deployment.

WebArena (Zhou et al., ICLR 2024) runs realistic self-hosted sites; WebArena-Lite (Liu et al. 2024,
"VisualAgentBench") is its 165-task human-verified subset: shopping 45, shopping_admin 35, gitlab 30, map 26,
reddit 19 and 10 multi-site tasks. Rewards come from the task's evaluators (string / URL / page-content
match), 1.0 for success.

Site URLs come from environment variables, as BrowserGym expects: ``WA_SHOPPING``, ``WA_SHOPPING_ADMIN``,
``WA_REDDIT``, ``WA_GITLAB``, ``WA_MAP``, ``WA_WIKIPEDIA``, ``WA_HOMEPAGE`` (``WA_FULL_RESET`` optional).
:func:`check_webarena_config` checks the variables the chosen tasks need *before* anything is imported or
launched and names each missing one. BrowserGym itself asserts that all seven are set; sites none of the
chosen tasks visits, when unset, are given an unresolvable RFC 2606 host ``http://<site>.unconfigured.invalid``
so that a user who deploys, say, only the shopping site can run the shopping tasks.

LLM-judged tasks: 40 of the 165 tasks may call an OpenAI chat model as judge (``fuzzy_match`` in their
``eval``: ``llm_fuzzy_match`` / ``llm_ua_match`` of ``browsergym.webarenalite.helper_functions``, which need
``OPENAI_API_KEY``): 35 score the answer, 4 (528, 641, 645, 657) a page element, and task 491 (reference
``N/A``) calls it when the answer is not exactly ``N/A``. :attr:`WebArenaLiteTask.needs_judge` marks them,
read from the task configs shipped in the package (no import, no network).

NLTK: the evaluators tokenize with NLTK's ``punkt_tab``, and importing ``browsergym.webarenalite`` *downloads*
it when missing. :func:`check_nltk_data` looks for it on NLTK's search path (``NLTK_DATA`` first) and coevo
imports the package only after it is found, so a run never downloads or waits on the network.

Task ids are WebArena's original ids (``old_task_id`` in the Lite file, the number in the gym id
``browsergym/webarenalite.<id>``).
"""

from __future__ import annotations

import importlib.util
import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from coevo.envs.browser import ensure_browser_env
from coevo.envs.web import WebEnv

#: site name -> environment variable holding its base URL (BrowserGym's ``WA_<SITE>`` convention)
SITE_ENV_VARS: dict[str, str] = {
    "shopping": "WA_SHOPPING",
    "shopping_admin": "WA_SHOPPING_ADMIN",
    "reddit": "WA_REDDIT",
    "gitlab": "WA_GITLAB",
    "map": "WA_MAP",
    "wikipedia": "WA_WIKIPEDIA",
    "homepage": "WA_HOMEPAGE",
}


class WebArenaConfigError(RuntimeError):
    """The WebArena-Lite deployment is not configured for the chosen tasks (the message names the variables)."""


@dataclass(frozen=True)
class WebArenaLiteTask:
    """One WebArena-Lite task.

    Attributes:
        task_id: WebArena's original task id (the gym id suffix).
        lite_id: index in WebArena-Lite (0-164).
        sites: sites the task visits (keys of :data:`SITE_ENV_VARS`).
        intent: the goal text with ``__SITE__`` URL placeholders unresolved.
        require_login: whether BrowserGym logs in before the task starts.
        needs_judge: whether an evaluator may call the LLM judge (``fuzzy_match`` in ``eval``).
    """

    task_id: int
    lite_id: int
    sites: tuple[str, ...]
    intent: str
    require_login: bool
    needs_judge: bool = False


#: the environment variable the WebArena LLM judge reads (``webarena.llms.providers.openai_utils``)
JUDGE_KEY_ENV = "OPENAI_API_KEY"


def _needs_judge(evaluation: dict[str, Any]) -> bool:
    """Whether a WebArena ``eval`` block uses ``fuzzy_match`` (reference answers or program_html contents)."""
    if "fuzzy_match" in (evaluation.get("reference_answers") or {}):
        return True
    return any("fuzzy_match" in (t.get("required_contents") or {}) for t in evaluation.get("program_html") or ())


def _lite_json_path() -> Path:
    spec = importlib.util.find_spec("browsergym.webarenalite")
    if spec is None or not spec.submodule_search_locations:
        raise WebArenaConfigError(
            "the `browsergym-webarenalite` package is not installed (bash scripts/install.sh --dev installs it)"
        )
    return Path(spec.submodule_search_locations[0]) / "test_webarena_lite.raw.json"


@lru_cache(maxsize=1)
def webarena_lite_tasks() -> tuple[WebArenaLiteTask, ...]:
    """All 165 tasks, read from the package's JSON file without importing the package.

    (Importing ``browsergym.webarenalite`` downloads NLTK data when absent; this function never does.)
    """
    rows = json.loads(_lite_json_path().read_text())
    return tuple(
        WebArenaLiteTask(
            task_id=int(r["old_task_id"]),
            lite_id=int(r["task_id"]),
            sites=tuple(r["sites"]),
            intent=str(r["intent"]),
            require_login=bool(r.get("require_login", False)),
            needs_judge=_needs_judge(r.get("eval") or {}),
        )
        for r in rows
    )


def select_webarena_lite_tasks(
    task_ids: Iterable[int] | None = None, sites: Iterable[str] | None = None
) -> list[WebArenaLiteTask]:
    """Tasks by original id and / or site.

    Args:
        task_ids: keep only these ids (each must exist).
        sites: keep only tasks all of whose sites are in this set (``["shopping"]`` excludes multi-site tasks).

    Raises:
        ValueError: an unknown id or site name (named in the message), or an empty selection.
    """
    tasks = list(webarena_lite_tasks())
    if task_ids is not None:
        ids = [int(t) for t in task_ids]
        by_id = {t.task_id: t for t in tasks}
        unknown = [i for i in ids if i not in by_id]
        if unknown:
            raise ValueError(f"task_ids: unknown WebArena-Lite task ids {unknown}")
        tasks = [by_id[i] for i in dict.fromkeys(ids)]
    if sites is not None:
        wanted = set(sites)
        known = [s for s in SITE_ENV_VARS if s != "homepage"]
        unknown_sites = sorted(wanted - set(known))
        if unknown_sites:
            raise ValueError(f"sites: unknown site(s) {unknown_sites}; known: {known}")
        tasks = [t for t in tasks if set(t.sites) <= wanted]
    if not tasks:
        raise ValueError(f"no WebArena-Lite task matches task_ids={task_ids!r} sites={sites!r}")
    return tasks


def check_webarena_config(
    tasks: Iterable[WebArenaLiteTask], environ: Mapping[str, str] | None = None, *, homepage: bool = False
) -> dict[str, str]:
    """Check that every site the tasks visit has its URL variable set.

    Args:
        tasks: the tasks to run.
        environ: where to look (default ``os.environ``).
        homepage: also require ``WA_HOMEPAGE`` (needed for BrowserGym's homepage hint).

    Returns:
        ``{variable: url}`` for the required variables.

    Raises:
        WebArenaConfigError: naming every missing (or empty) variable and the tasks that need it.
    """
    env = os.environ if environ is None else environ
    needed: dict[str, list[int]] = {}
    for task in tasks:
        for site in task.sites:
            needed.setdefault(SITE_ENV_VARS[site], []).append(task.task_id)
    if homepage:
        needed.setdefault(SITE_ENV_VARS["homepage"], [])
    missing = [var for var in needed if not env.get(var, "").strip()]
    if missing:
        lines = [
            f"  {var} (needed by tasks {needed[var][:8]}{' ...' if len(needed[var]) > 8 else ''})" for var in missing
        ]
        raise WebArenaConfigError(
            "WebArena-Lite site URL not configured; set the environment variable(s) to your deployment's base URL:\n"
            + "\n".join(lines)
        )
    return {var: env[var].strip() for var in needed}


def nltk_search_path(environ: Mapping[str, str] | None = None) -> list[str]:
    """NLTK's data folders: ``NLTK_DATA`` entries (``os.pathsep``-separated) first, then NLTK's defaults."""
    import nltk

    env = os.environ if environ is None else environ
    extra = [os.path.expanduser(p) for p in env.get("NLTK_DATA", "").split(os.pathsep) if p]
    # nltk.data.path also holds the NLTK_DATA entries read when nltk was imported: the current value wins
    stale = {os.path.expanduser(p) for p in getattr(nltk.data, "_paths_from_env", ()) if p}
    return list(dict.fromkeys(extra + [p for p in nltk.data.path if p not in stale]))


def check_nltk_data(environ: Mapping[str, str] | None = None) -> str:
    """Find NLTK's ``punkt_tab`` (needed by the WebArena-Lite evaluators) without downloading anything.

    Returns:
        Where it was found.

    Raises:
        WebArenaConfigError: not on the search path (:func:`nltk_search_path`); the message says how to
            provide it offline.
    """
    import nltk

    paths = nltk_search_path(environ)
    try:
        return str(nltk.data.find("tokenizers/punkt_tab", paths=paths))
    except LookupError:
        raise WebArenaConfigError(
            "NLTK data 'punkt_tab' (needed by the WebArena-Lite evaluators) is not installed; coevo never "
            "downloads it at run time. Install it with `python -m nltk.downloader -d DIR punkt_tab` (on a "
            "machine with network access, then copy DIR) and set NLTK_DATA=DIR. Searched: " + ", ".join(paths)
        ) from None


def _require_nltk_punkt() -> None:
    """Point NLTK at the found ``punkt_tab`` so that BrowserGym's import-time check finds it (no download)."""
    import nltk

    check_nltk_data()
    for path in reversed(nltk_search_path()):
        if path not in nltk.data.path:
            nltk.data.path.insert(0, path)


class WebArenaLiteEnv(WebEnv):
    """WebArena-Lite tasks against the user's deployment.

    Args:
        task_ids, sites: the task subset (see :func:`select_webarena_lite_tasks`; default all 165).
        homepage_hint: pass BrowserGym's ``with_homepage_hint`` (then ``WA_HOMEPAGE`` is required).
        setup_browser: call :func:`coevo.envs.browser.ensure_browser_env` first.
        **kwargs: :class:`~coevo.envs.web.WebEnv` options.

    Raises:
        WebArenaConfigError: a site variable the subset needs is unset (checked here, before any launch).
        ValueError: unknown task ids or sites.
    """

    def __init__(
        self,
        *,
        task_ids: Iterable[int] | None = None,
        sites: Iterable[str] | None = None,
        homepage_hint: bool = False,
        setup_browser: bool = True,
        **kwargs: Any,
    ) -> None:
        self.tasks = select_webarena_lite_tasks(task_ids, sites)
        self.homepage_hint = homepage_hint
        self.site_urls = check_webarena_config(self.tasks, homepage=homepage_hint)
        if setup_browser:
            ensure_browser_env()
        gym_kwargs = dict(kwargs.pop("gym_kwargs", None) or {})
        if homepage_hint:
            gym_kwargs.setdefault("task_kwargs", {})["with_homepage_hint"] = True
        super().__init__("webarenalite", gym_kwargs=gym_kwargs, **kwargs)
        self._ids = {str(t.task_id) for t in self.tasks}

    def check_task(self, task: str) -> None:
        super().check_task(task)
        if task not in self._ids:
            raise ValueError(f"task {task!r} is not in this WebArena-Lite subset ({len(self._ids)} tasks)")

    def prepare(self) -> None:
        """Re-check the variables, fill unused sites with ``.invalid`` hosts, then register the gym ids."""
        check_webarena_config(self.tasks, homepage=self.homepage_hint)
        for site, var in SITE_ENV_VARS.items():
            if not os.environ.get(var, "").strip():
                os.environ[var] = f"http://{site.replace('_', '-')}.unconfigured.invalid"
        _require_nltk_punkt()
        import browsergym.webarenalite  # noqa: F401 - registers browsergym/webarenalite.<id>
