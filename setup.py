"""Package layout for setuptools (the project metadata is in pyproject.toml).

pyproject.toml cannot combine package discovery with mapping folders from outside the package, so the
layout lives here: the ``coevo`` packages as found, plus the repository's top-level ``heuristics/`` and
``skills/`` folders shipped as package data under ``coevo/_shipped/`` (found at run time by
:mod:`coevo.resources`). Byte-code caches are left out.
"""

from setuptools import find_packages, setup

#: package name inside the wheel -> source folder in the repository
SHIPPED = {"coevo._shipped.heuristics": "heuristics", "coevo._shipped.skills": "skills"}

setup(
    packages=[*find_packages(include=["coevo", "coevo.*"]), *SHIPPED],
    package_dir=SHIPPED,
    # the sampler test's prompt sets (coevo.sampler_test.promptset) are data of a coevo package
    package_data={**{package: ["**/*"] for package in SHIPPED}, "coevo.sampler_test": ["sampler-test-v*.json"]},
    exclude_package_data={"": ["*.pyc", "*.pyo"]},
    # only the package data above goes into the wheel (MANIFEST.in shapes the sdist alone)
    include_package_data=False,
)
