"""A decoding-progress counter for ``model.generate``: tokens decoded and rows finished, for a progress line.

transformers' ``generate(streamer=...)`` calls ``streamer.put(ids)`` once with the prompt ids (B, L), then
once per decoding step with that step's tokens (B,) (rows that have finished get the pad token), and
``streamer.end()`` when the batch is done. :class:`DecodeCounter` turns that into ``report(kind, n)`` calls:
``("batch", B)`` at the start, ``("tokens", k)`` per step (k rows still decoding), ``("rows", n)`` when n rows
finish (a stop token, or padding after a stop string), and the remaining rows at ``end()``. It holds no tensor
and changes nothing in the decoding (a streamer only observes).
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any


class DecodeCounter:
    """A ``generate`` streamer that counts (module docstring).

    Args:
        report: ``report(kind, n)``, kind "batch", "tokens" or "rows".
        rows: rows in the batch (B).
        finish_ids: token ids that end a row (EOS / stop ids and the pad id).
    """

    def __init__(self, report: Callable[[str, int], None], rows: int, finish_ids: Collection[int]) -> None:
        self.report = report
        self.rows = rows
        self.finish_ids = {int(i) for i in finish_ids if i is not None}
        self.done = [False] * rows
        self.steps = 0
        self._prompt_seen = False

    def put(self, value: Any) -> None:
        """The prompt ids (first call, (B, L)), then one token per row (B,) per decoding step."""
        if not self._prompt_seen:
            self._prompt_seen = True
            self.report("batch", self.rows)
            return
        tokens = [int(t) for t in value.reshape(-1).tolist()]
        running = [i for i, d in enumerate(self.done) if not d]
        self.steps += 1
        self.report("tokens", len(running))
        finished = [i for i in running if i < len(tokens) and tokens[i] in self.finish_ids]
        for i in finished:
            self.done[i] = True
        if finished:
            self.report("rows", len(finished))

    def end(self) -> None:
        """The batch is done: the rows still open stopped at max_new_tokens (or a stop string)."""
        left = sum(not d for d in self.done)
        self.done = [True] * self.rows
        if left:
            self.report("rows", left)
