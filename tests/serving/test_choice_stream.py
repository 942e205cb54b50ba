"""streaming.ChoiceStream on its own: under any chunking a streamed choice sends exactly the tokens
of its final choice, empty pieces and multi-character pieces included (a server's character
tokenizer has neither)."""

import random

from fp4rl.serving.engine import RowResult
from fp4rl.serving.protocol import make_choice
from fp4rl.serving.streaming import ChoiceStream

PIECES = {0: "c", 1: "x", 2: "", 3: "\n", 4: "ab", 5: "\nq"}  # 2: a special token decoded alone


class Counting:
    """Events that record which tokens were sent."""

    def head(self, index, choice):
        return []

    def tokens(self, index, choice, start, stop):
        return [("token", k) for k in range(start, stop)]

    def finish(self, index, choice):
        return [("finish",)]

    def usage_chunk(self, prompt_tokens, choices):
        return None


def _sent(ids, cuts, stop, finish):
    stream = ChoiceStream(0, Counting(), PIECES.__getitem__, stop, top=False)
    events = []
    for cut in cuts:
        partial = RowResult(tuple(ids[:cut]), (0.0,) * cut, cut, None)
        events += stream.update(partial)
    events += stream.update(RowResult(tuple(ids), (0.0,) * len(ids), len(ids), finish))
    return [e[1] for e in events if e[0] == "token"]


def test_an_empty_piece_at_the_horizon_waits_for_the_stop_string_that_drops_it():
    ids = [0, 1, 2, 3]  # "c", "x", "", "\n": the stop string "\n" starts where the empty piece is
    final = make_choice(RowResult(tuple(ids), (0.0,) * 4, 4, "length"), PIECES.__getitem__, ["\n"])
    assert len(final.token_ids) == 2
    assert _sent(ids, [3], ["\n"], "length") == [0, 1]


def test_streamed_tokens_are_the_final_choices_under_any_chunking():
    rng = random.Random(0)
    for _ in range(3000):
        ids = [rng.choice(list(PIECES)) for _ in range(rng.randint(1, 10))]
        stop = rng.choice([[], ["\n"], ["x\n", "ab"], ["q"]])
        finish = rng.choice(["length", "stop"])
        cuts = sorted(rng.sample(range(1, len(ids) + 1), rng.randint(0, len(ids))))
        final = make_choice(RowResult(tuple(ids), (0.0,) * len(ids), len(ids), finish), PIECES.__getitem__, stop)
        assert _sent(ids, cuts, stop, finish) == list(range(len(final.token_ids))), (ids, stop, cuts)
