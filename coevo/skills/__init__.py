"""Agent Skills: the folder format and its validator, a library with progressive disclosure for agents,
Trace2Skill patches (parse, apply, merge) and skill versions in the trajectory store.

See docs/references.md §3 and the module docstrings: :mod:`~coevo.skills.spec`, :mod:`~coevo.skills.validate`,
:mod:`~coevo.skills.library`, :mod:`~coevo.skills.patch`, :mod:`~coevo.skills.apply`,
:mod:`~coevo.skills.merge`, :mod:`~coevo.skills.versions`.
"""

from coevo.resources import shipped_dir
from coevo.skills.apply import ApplyResult, EditRejected, apply_and_validate, apply_patch, skill_diff
from coevo.skills.library import SkillAccessError, SkillCall, SkillLibrary, parse_skill_call
from coevo.skills.merge import Conflict, MergeResult, merge_patches, programmatic_merge
from coevo.skills.patch import PATCH_FORMAT_HELP, Edit, Patch, Rejection, parse_patch
from coevo.skills.spec import Skill, SkillDocument, SkillFormatError, load_skill, write_skill
from coevo.skills.validate import Violation, validate_skill
from coevo.skills.versions import SKILL_ARTIFACT_KIND, materialize, write_skill_version

#: The starter skills: the repository's ``skills/`` folder, or its copy inside an installed wheel.
SHIPPED_SKILLS_DIR = shipped_dir("skills")

__all__ = [
    "PATCH_FORMAT_HELP",
    "SHIPPED_SKILLS_DIR",
    "SKILL_ARTIFACT_KIND",
    "ApplyResult",
    "Conflict",
    "Edit",
    "EditRejected",
    "MergeResult",
    "Patch",
    "Rejection",
    "Skill",
    "SkillAccessError",
    "SkillCall",
    "SkillDocument",
    "SkillFormatError",
    "SkillLibrary",
    "Violation",
    "apply_and_validate",
    "apply_patch",
    "load_skill",
    "materialize",
    "merge_patches",
    "parse_patch",
    "parse_skill_call",
    "programmatic_merge",
    "skill_diff",
    "validate_skill",
    "write_skill",
    "write_skill_version",
]
