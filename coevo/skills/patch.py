"""Trace2Skill skill patches: the JSON format, its pydantic models, and a robust parser for LLM output.

A patch (Trace2Skill, arXiv 2603.25158, step 3: each lesson batch proposes a patch against a frozen snapshot
of the skill) is a JSON object ``{"reasoning": str, "edits": [edit, ...], "changelog": str}``. Each edit has an
``op``; ``file`` is relative to the skill folder and defaults to ``SKILL.md``:

========================  ==========================================================================
op                        fields
========================  ==========================================================================
``insert_after``          ``anchor`` (exact text, unique in the file), ``content``
``insert_before``         ``anchor``, ``content``
``append_to_section``     ``section`` (heading, ``"## Tips"`` or ``"Tips"``), ``content``
``replace_in_section``    ``section``, ``old`` (exact text, unique in the section), ``new``
``add_section``           ``heading`` (``"## New"``; a bare title gets level 2), ``content``,
                          optional ``after_section`` (default: end of file)
``delete_section``        ``section``
``create``                ``file`` (new file), ``content``
``delete_file``           ``file`` (not SKILL.md)
========================  ==========================================================================

Inserted text goes in as whole lines: ``insert_after`` puts it on the lines after the line where the anchor
ends, ``insert_before`` on the lines before the line where the anchor starts.

Parsing never raises: invalid JSON yields an empty patch and a rejection with the reason; an invalid edit is
rejected on its own while the valid ones are kept.
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, Literal, NamedTuple

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from coevo.skills.markdown import split_heading_ref
from coevo.skills.spec import SKILL_FILE

_FILE = Field(
    default=SKILL_FILE,
    validation_alias=AliasChoices("file", "path", "target_file"),
    description="file relative to the skill folder",
)
_NONEMPTY = Field(min_length=1)


class _EditBase(BaseModel):
    """Common fields: the target file and an optional per-edit reason (kept for the changelog)."""

    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)
    file: str = _FILE
    reason: str = ""

    def target(self) -> tuple[str, str, str]:
        """``(file, kind, key)`` naming what the edit touches; used to detect merge conflicts."""
        return (self.file, "file", self.file)


class _AnchorEdit(_EditBase):
    """An edit at an ``anchor`` line (the subclass declares ``op``, ``anchor`` and ``content``, in that order,
    so that its fields keep the order of its dump)."""

    def target(self) -> tuple[str, str, str]:
        return (self.file, "anchor", self.anchor.strip())


class InsertAfter(_AnchorEdit):
    op: Literal["insert_after"]
    anchor: str = _NONEMPTY
    content: str = _NONEMPTY


class InsertBefore(_AnchorEdit):
    op: Literal["insert_before"]
    anchor: str = _NONEMPTY
    content: str = _NONEMPTY


class _SectionEdit(_EditBase):
    section: str = Field(min_length=1, validation_alias=AliasChoices("section", "heading"))

    def target(self) -> tuple[str, str, str]:
        return (self.file, "section", split_heading_ref(self.section)[1])


class AppendToSection(_SectionEdit):
    op: Literal["append_to_section"]
    content: str = _NONEMPTY


class ReplaceInSection(_SectionEdit):
    op: Literal["replace_in_section"]
    old: str = Field(min_length=1, validation_alias=AliasChoices("old", "old_text", "find"))
    new: str = Field(validation_alias=AliasChoices("new", "new_text", "replace"))


class AddSection(_EditBase):
    op: Literal["add_section"]
    heading: str = Field(min_length=1, validation_alias=AliasChoices("heading", "section", "title"))
    content: str = ""
    after_section: str | None = None

    def target(self) -> tuple[str, str, str]:
        return (self.file, "section", split_heading_ref(self.heading)[1])


class DeleteSection(_SectionEdit):
    op: Literal["delete_section"]


class CreateFile(_EditBase):
    op: Literal["create"]
    file: str = Field(min_length=1, validation_alias=AliasChoices("file", "path", "target_file"))
    content: str


class DeleteFile(_EditBase):
    op: Literal["delete_file"]
    file: str = Field(min_length=1, validation_alias=AliasChoices("file", "path", "target_file"))


Edit = Annotated[
    InsertAfter
    | InsertBefore
    | AppendToSection
    | ReplaceInSection
    | AddSection
    | DeleteSection
    | CreateFile
    | DeleteFile,
    Field(discriminator="op"),
]
EDIT_OPS = (
    "insert_after",
    "insert_before",
    "append_to_section",
    "replace_in_section",
    "add_section",
    "delete_section",
    "create",
    "delete_file",
)
_EDIT_ADAPTER: TypeAdapter[Edit] = TypeAdapter(Edit)


class Patch(BaseModel):
    """A Trace2Skill patch: why, what, and a one-paragraph changelog.

    Attributes:
        reasoning: the proposer's reasoning (observed failures the edits address).
        edits: ordered edits, applied in order.
        changelog: short human-readable summary of the change.
    """

    model_config = ConfigDict(extra="ignore")
    reasoning: str = ""
    edits: list[Edit] = Field(default_factory=list)
    changelog: str = ""


class Rejection(NamedTuple):
    """An edit (or raw edit / text) that was not applied, and why."""

    op: Any
    reason: str


def parse_edit(raw: Any) -> Edit:
    """Validate one raw edit (a dict from JSON).

    Raises:
        ValueError: unknown ``op`` or missing/invalid fields (the message names them).
    """
    if not isinstance(raw, dict):
        # ValueError, not TypeError: this is bad model output, reported like every other invalid edit
        raise ValueError(f"invalid edit: expected a JSON object, got {type(raw).__name__}")  # noqa: TRY004
    op = raw.get("op")
    if not isinstance(op, str) or op.strip().lower() not in EDIT_OPS:
        raise ValueError(f"invalid edit: unknown op {op!r}; ops are {', '.join(EDIT_OPS)}")
    raw = {**raw, "op": op.strip().lower()}
    try:
        return _EDIT_ADAPTER.validate_python(raw)
    except ValidationError as exc:

        def loc(e: Any) -> str:  # drop the discriminator tag pydantic puts first
            parts = [str(x) for x in e["loc"]]
            return ".".join(parts[1:] if parts[:1] == [raw["op"]] else parts) or "edit"

        details = "; ".join(f"{loc(e)}: {e['msg']}" for e in exc.errors())
        raise ValueError(f"invalid {raw['op']} edit: {details}") from None


_FENCE_RE = re.compile(r"```[a-zA-Z0-9_-]*[ \t]*\n(.*?)```", re.DOTALL)


def _json_objects(text: str):
    """Candidate JSON objects in ``text``: fenced blocks first, then the whole text, then every ``{`` start."""
    decoder = json.JSONDecoder()
    candidates = [m.group(1) for m in _FENCE_RE.finditer(text)] + [text]
    for cand in candidates:
        try:
            obj = json.loads(cand.strip())
        except ValueError:
            continue  # not JSON: try the next candidate
        yield obj
    for i, ch in enumerate(text):
        if ch == "{":
            try:
                obj, _ = decoder.raw_decode(text, i)
            except ValueError:
                continue
            yield obj


def extract_patch_json(text: str) -> dict[str, Any]:
    """Find the patch object in LLM output (fenced or bare, with prose around it).

    The first JSON object that has an ``edits`` key wins; a top-level list is read as a list of edits.

    Raises:
        ValueError: no such JSON object (the message says what was found instead).
    """
    if not isinstance(text, str) or not text.strip():
        raise ValueError("empty model output: expected a JSON object with reasoning, edits, changelog")
    text = text.replace("\x00", "")
    seen_other = False
    for obj in _json_objects(text):
        if isinstance(obj, dict) and "edits" in obj:
            return obj
        if isinstance(obj, list) and obj and all(isinstance(e, dict) and "op" in e for e in obj):
            return {"edits": obj}
        seen_other = True
    if seen_other:
        raise ValueError("JSON found but no object with an 'edits' list")
    raise ValueError("no valid JSON object found in the model output")


def parse_patch(text: str | dict[str, Any]) -> tuple[Patch, list[Rejection]]:
    """Parse a patch from LLM output (or an already decoded dict). Never raises.

    Returns:
        ``(patch, rejections)``: the patch holds the valid edits; each invalid edit, or the whole text when
        no patch JSON could be read, is a :class:`Rejection` with the reason.
    """
    if isinstance(text, dict):
        data = text
    else:
        try:
            data = extract_patch_json(text)
        except ValueError as exc:
            snippet = text[:200] if isinstance(text, str) else repr(text)
            return Patch(), [Rejection(snippet, f"invalid patch JSON: {exc}")]
    rejections: list[Rejection] = []
    raw_edits = data.get("edits")
    if not isinstance(raw_edits, list):
        rejections.append(Rejection(raw_edits, "'edits' must be a list of edit objects"))
        raw_edits = []
    edits = []
    examples = _format_example_edits()
    for raw in raw_edits:
        try:
            edit = parse_edit(raw)
        except ValueError as exc:
            rejections.append(Rejection(raw, str(exc)))
            continue
        if edit_to_dict(edit) in examples:
            rejections.append(Rejection(raw, "edit copied from the format example in the prompt, not a real edit"))
            continue
        edits.append(edit)
    reasoning, changelog = data.get("reasoning", ""), data.get("changelog", "")
    patch = Patch(
        reasoning=reasoning if isinstance(reasoning, str) else json.dumps(reasoning),
        edits=edits,
        changelog=changelog if isinstance(changelog, str) else json.dumps(changelog),
    )
    return patch, rejections


def edit_to_dict(edit: Edit) -> dict[str, Any]:
    """JSON-ready dict of an edit (defaults included, so equal edits give equal dicts)."""
    return edit.model_dump(mode="json")


def _format_example_edits() -> list[dict[str, Any]]:
    """The example edits of :data:`PATCH_FORMAT_HELP`: a small model may echo them verbatim."""
    data = json.loads(PATCH_FORMAT_HELP[PATCH_FORMAT_HELP.index("{") : PATCH_FORMAT_HELP.rindex("}") + 1])
    return [edit_to_dict(parse_edit(e)) for e in data["edits"]]


PATCH_FORMAT_HELP = """Answer with one JSON object (a ```json fence is fine):
{"reasoning": "which observed failures or successes the edits address",
 "edits": [
   {"op": "insert_after", "anchor": "exact existing text", "content": "new lines"},
   {"op": "insert_before", "anchor": "exact existing text", "content": "new lines"},
   {"op": "append_to_section", "section": "## Heading", "content": "new lines"},
   {"op": "replace_in_section", "section": "## Heading", "old": "exact old text", "new": "new text"},
   {"op": "add_section", "heading": "## New heading", "content": "section text", "after_section": "## Heading"},
   {"op": "delete_section", "section": "## Heading"},
   {"op": "create", "file": "references/new-file.md", "content": "file text"},
   {"op": "delete_file", "file": "references/old-file.md"}],
 "changelog": "one-line summary"}
Edits apply to SKILL.md unless "file" names another file of the skill. Anchors and old text must be copied
exactly and occur once. Keep edits minimal and additive, and never change the front-matter name or
description."""
