"""Agents: the LangGraph web agent, its action parser and prompts, and a scripted test-double policy."""
