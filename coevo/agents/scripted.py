"""A policy that replays predetermined outputs: a test double for *the model only*.

Use it to drive the real agent loop against a real browser when the point of a test is the loop, the
environment or the trajectory record, not the model's skill. Everything around it (BrowserGym, Chromium,
MiniWoB++ pages, LangGraph) stays real.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from coevo.backends.base import Completion, Message, Policy, PolicyError, SamplingParams

#: a script item: a fixed output, or a function of the conversation (e.g. one that reads the axtree)
ScriptItem = str | Callable[[list[Message]], str]


class ScriptedPolicy(Policy):
    """Answers each conversation with the next item of a script.

    Args:
        script: one item (used for every call) or a sequence consumed in order across all conversations of
            all calls; a callable item receives the conversation and returns the output text.
        repeat_last: when the sequence is used up, keep answering with its last item instead of raising.

    Token counts are whitespace word counts (a stand-in; there is no tokenizer).

    Raises:
        ValueError: for an empty script.
        PolicyError: (from :meth:`generate`) when the script is used up and ``repeat_last`` is False.
    """

    model_id = "scripted"

    def __init__(self, script: ScriptItem | Sequence[ScriptItem], *, repeat_last: bool = False) -> None:
        items = [script] if isinstance(script, str) or callable(script) else list(script)
        if not items:
            raise ValueError("script is empty")
        self.items = items
        self.repeat_last = repeat_last or len(items) == 1
        self.calls = 0
        self.conversations: list[list[Message]] = []

    def generate(self, conversations: list[list[Message]], params: SamplingParams) -> list[Completion]:
        out = []
        for conversation in conversations:
            if self.calls >= len(self.items) and not self.repeat_last:
                raise PolicyError(f"script used up after {len(self.items)} outputs")
            item = self.items[min(self.calls, len(self.items) - 1)]
            self.calls += 1
            self.conversations.append(conversation)
            text = item(conversation) if callable(item) else item
            prompt_words = sum(len(m["content"].split()) for m in conversation)
            out.append(Completion(text=text, prompt_tokens=prompt_words, completion_tokens=len(text.split())))
        return out
