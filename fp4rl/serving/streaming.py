"""Streamed answers sent as they are decoded: which of a choice's tokens are final so far.

The engine hands a streamed request its rows' results after every decode chunk
(`Engine.run_batch`'s on_chunk). A token can be sent once nothing decoded later can change what
the non-streamed answer says about it: its text, its log-probs, whether it is kept. Tokens and
log-probs never change once decoded; only a stop string can, by cutting the text before it. A stop
string not seen yet must end past the text decoded so far, so it starts at or after the horizon,
len(text) - len(longest stop string) + 1; a token whose text starts before the horizon and ends at
or before it is final. A stop string already seen ends the choice when no unseen one could start before it (it
starts at or before the horizon); otherwise the tokens before the horizon go and the rest waits.
So a choice's events are those of its final choice (`protocol.make_choice` on the whole row)
whatever the chunking (tests/serving/test_server.py compares them).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from fp4rl.serving.engine import RowResult
from fp4rl.serving.protocol import Choice, make_choice


class Events(Protocol):
    """A response format's chunks (`protocol.Stream`, `chat.ChatStream`)."""

    def head(self, index: int, choice: Choice) -> list[dict]: ...

    def tokens(self, index: int, choice: Choice, start: int, stop: int) -> list[dict]: ...

    def finish(self, index: int, choice: Choice) -> list[dict]: ...

    def usage_chunk(self, prompt_tokens: int, choices: Sequence[Choice]) -> dict | None: ...


class ChoiceStream:
    """One choice's events as its row's results arrive. `update` returns the events of what became
    final: the head on the first call, then tokens, then the finish; `choice` is set once final."""

    def __init__(self, index: int, events: Events, piece: Callable[[int], str], stop: Sequence[str], top: bool):
        self.index, self.events, self.piece, self.stop, self.top = index, events, piece, tuple(stop), top
        self.sent, self.started = 0, False
        self.choice: Choice | None = None

    def update(self, result: RowResult) -> list[dict]:
        if self.choice is not None:
            return []
        choice = make_choice(result, self.piece, self.stop, self.top)
        out = [] if self.started else self.events.head(self.index, choice)
        self.started = True
        count, final = self._final(result, choice)
        out += self.events.tokens(self.index, choice, self.sent, count)
        self.sent = count
        if final:
            out += self.events.finish(self.index, choice)
            self.choice = choice
        return out

    def _final(self, result: RowResult, choice: Choice) -> tuple[int, bool]:
        """(how many of the choice's tokens are final, whether the choice is): module docstring."""
        if result.finish_reason is not None:  # the row has stopped: this is the whole row's choice
            return len(choice.token_ids), True
        decoded = sum(len(self.piece(t)) for t in result.token_ids)
        horizon = decoded - max(map(len, self.stop), default=1) + 1
        if choice.finish_reason == "stop" and len(choice.text) <= horizon:  # cut by a stop string, for good
            return len(choice.token_ids), True
        count, start = 0, 0
        for piece in choice.pieces:
            end = start + len(piece)
            # an empty piece at the horizon is not final either: a stop string starting there would cut it
            if end > horizon or start >= horizon:
                break
            count, start = count + 1, end
        return count, False
