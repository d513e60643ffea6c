"""Markdown structure used by skill patches: headings, sections and file references.

Headings come from a CommonMark parser (markdown-it-py), so ``#`` lines inside fenced code blocks are never
taken for headings. Line numbers are 0-based and refer to the text passed in.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from urllib.parse import unquote

from markdown_it import MarkdownIt


@dataclass(frozen=True)
class Heading:
    """One heading.

    Attributes:
        level: 1-6 (number of ``#``; setext ``===`` is 1, ``---`` is 2).
        title: heading text without the ``#`` marks, stripped.
        line: 0-based line of the heading.
        end_line: first line after the heading (setext headings span two lines).
    """

    level: int
    title: str
    line: int
    end_line: int


@dataclass(frozen=True)
class Section:
    """A heading and the lines it owns.

    Attributes:
        heading: the heading.
        own_end: first line after the section's own text (the next heading of any level, or end of text).
        end: first line after the whole section including subsections (the next heading of the same or a
            higher level, or end of text).
    """

    heading: Heading
    own_end: int
    end: int


@lru_cache(maxsize=1)
def _parser() -> MarkdownIt:
    return MarkdownIt("commonmark")


def headings(text: str) -> list[Heading]:
    """All headings of ``text`` in document order."""
    tokens = _parser().parse(text)
    out = []
    for i, tok in enumerate(tokens):
        if tok.type == "heading_open" and tok.map is not None:
            inline = tokens[i + 1]
            out.append(
                Heading(level=int(tok.tag[1]), title=inline.content.strip(), line=tok.map[0], end_line=tok.map[1])
            )
    return out


def sections(text: str) -> list[Section]:
    """Every heading with the extent of its section."""
    hs = headings(text)
    n_lines = len(text.splitlines())
    out = []
    for i, h in enumerate(hs):
        own_end = hs[i + 1].line if i + 1 < len(hs) else n_lines
        end = next((g.line for g in hs[i + 1 :] if g.level <= h.level), n_lines)
        out.append(Section(heading=h, own_end=own_end, end=end))
    return out


def split_heading_ref(ref: str) -> tuple[int | None, str]:
    """``"## Tips"`` -> ``(2, "tips")``; ``"Tips"`` -> ``(None, "tips")``. Titles compare case-insensitively
    with inner whitespace collapsed."""
    ref = ref.strip()
    m = re.match(r"^(#{1,6})\s+(.*)$", ref)
    level = len(m.group(1)) if m else None
    title = m.group(2) if m else ref
    return level, normalize_title(title)


def normalize_title(title: str) -> str:
    """Case-folded title with trailing ``#`` marks removed and whitespace collapsed."""
    title = re.sub(r"\s+#+\s*$", "", title.strip())
    return " ".join(title.split()).casefold()


def find_sections(text: str, ref: str) -> list[Section]:
    """Sections whose heading matches ``ref`` (``"## Title"`` matches level and title, ``"Title"`` any level)."""
    level, title = split_heading_ref(ref)
    return [
        s
        for s in sections(text)
        if normalize_title(s.heading.title) == title and (level is None or s.heading.level == level)
    ]


_LINK_TARGET_RE = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")
_BARE_PATH_RE = re.compile(r"(?<![\w./-])((?:scripts|references|assets)/[\w./-]*[\w-])")


def _inline_tokens(text: str):
    for tok in _parser().parse(text):
        if tok.type == "inline":
            yield from tok.children or []


def referenced_paths(text: str) -> list[str]:
    """Relative file paths a Markdown text refers to, in order of appearance, without duplicates.

    Counted: link and image targets that are not URLs (no ``scheme:``) and not in-page anchors (``#...``),
    with any ``#fragment`` / ``?query`` removed; and paths under ``scripts/``, ``references/`` or ``assets/``
    written in plain text or inline code. Fenced and indented code blocks are ignored.
    """
    found: list[str] = []
    for tok in _inline_tokens(text):
        if tok.type in ("link_open", "image"):
            target = str(tok.attrs.get("href" if tok.type == "link_open" else "src") or "")
            target = unquote(re.split(r"[#?]", target, maxsplit=1)[0])
            if target and not _LINK_TARGET_RE.match(target):
                found.append(target)
        elif tok.type in ("text", "code_inline"):
            found.extend(_BARE_PATH_RE.findall(tok.content))
    seen: set[str] = set()
    return [p for p in found if not (p in seen or seen.add(p))]
