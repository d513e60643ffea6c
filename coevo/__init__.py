"""coevo: co-evolution of LLM agents in parameter space (evolution strategies) and context space
(heuristic programs, Agent Skills), over one shared trajectory store."""

__version__ = "0.1.0"
