"""Command line for skills: ``coevo skills validate DIR [DIR...]``.

``add_parser(subparsers)`` registers the ``skills`` command on the main ``coevo`` parser; the chosen
sub-command's handler is stored as ``args.func`` and returns the process exit code.
``python -m coevo.skills.cli skills validate DIR`` runs it without the main CLI.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from coevo.errors import EXIT_CHECK_FAILED, UsageError
from coevo.skills.validate import validate_paths


def run_validate(dirs: Sequence[str], out: TextIO | None = None) -> int:
    """Validate skill folders (or folders of skills) and print one line per violation.

    Each line reads ``FILE: FIELD: MESSAGE``; a closing line counts skills and violations. In a folder of
    skills, a subfolder without SKILL.md is reported (``.../SKILL.md: SKILL.md: missing ...``), not skipped
    (see :func:`coevo.skills.validate.validate_paths`).

    Returns:
        0 when every skill is valid, 3 (:data:`coevo.errors.EXIT_CHECK_FAILED`) when any violation was found
        (1 is left to bugs, as for every ``coevo`` command).

    Raises:
        UsageError: a DIR that is not a folder (the CLI's exit 2, as for any bad input).
    """
    missing = [d for d in dirs if not Path(d).is_dir()]
    if missing:  # bad input (exit 2 by the CLI), not a failed check
        raise UsageError(f"{missing[0]}: no such folder (give a skill folder or a folder of skills)")
    out = out or sys.stdout
    results = validate_paths(dirs)
    n_violations = 0
    for skill_dir, violations in results.items():
        for v in violations:
            print(str(v), file=out)
        n_violations += len(violations)
        if not violations:
            print(f"{skill_dir}: ok", file=out)
    n_bad = sum(1 for v in results.values() if v)
    print(f"{len(results)} skill(s) checked, {n_bad} invalid, {n_violations} violation(s)", file=out)
    return EXIT_CHECK_FAILED if n_violations else 0


def _cmd_validate(args: argparse.Namespace) -> int:
    return run_validate(args.dirs)


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``skills`` (with sub-command ``validate``) on the main CLI's subparsers.

    Returns:
        The ``skills`` parser.
    """
    parser = subparsers.add_parser("skills", help="Agent Skills tools", description="Agent Skills tools.")
    sub = parser.add_subparsers(dest="skills_command", required=True)
    validate = sub.add_parser(
        "validate",
        help="check skill folders against the Agent Skills specification",
        description="Check skill folders against the Agent Skills specification. Each DIR is a skill folder "
        "(holding SKILL.md) or a folder of skill folders, in which every non-hidden subfolder must "
        "hold SKILL.md (one without, e.g. with skill.md, is a violation). Exit status 3 on any "
        "violation.",
    )
    validate.add_argument("dirs", nargs="+", metavar="DIR", help="a skill folder or a folder of skills")
    validate.set_defaults(func=_cmd_validate)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` (e.g. ``["skills", "validate", "skills/"]``) and run the command; returns the exit code."""
    parser = argparse.ArgumentParser(prog="coevo")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
