"""Worked examples shipped with coevo (importable as plug-ins: ``plugins: [coevo.examples.prompt_evolver]``)."""
