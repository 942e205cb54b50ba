"""grain pipelines (determinism, checkpointable state, layouts) and the DAPO-Math loader."""

import json
import pathlib

import numpy as np
import pytest

from fp4rl.rl import data, tokenizer
from fp4rl.rl.math_file import load_math_rows
from fp4rl.rl.task import TaskConfig, make_problem
from fp4rl.rl.verifier import reward

FIXTURE = pathlib.Path(__file__).parent / "fixtures" / "dapo_math_sample.jsonl"
TASK = TaskConfig(min_ops=1, max_ops=3, operators="+-*")
CFG = data.DataConfig(batch_size=4, max_len=64, shuffle_seed=5, task_seed=11, num_problems=64)


def _prompt_iter(cfg=CFG):
    records = data.problem_records(TASK, cfg.task_seed, cfg.num_problems)
    return data.iterate(data.prompt_batches(records, cfg), cfg)


def _assert_batches_equal(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.keys() == y.keys()
        for k in x:
            np.testing.assert_array_equal(x[k], y[k])


def test_state_save_and_restore():
    it = _prompt_iter()
    first = [next(it) for _ in range(3)]
    state = it.get_state()
    more = [next(it) for _ in range(20)]  # 23 batches of 4 > 64 problems: crosses an epoch
    fresh = _prompt_iter()
    fresh.set_state(state)
    _assert_batches_equal([next(fresh) for _ in range(20)], more)
    # ...and the state is plain data a checkpoint can store (JSON round trip).
    fresh = _prompt_iter()
    fresh.set_state(json.loads(json.dumps(state)))
    _assert_batches_equal([next(fresh)], more[:1])
    _assert_batches_equal([next(_prompt_iter())], first[:1])


def test_batches_are_read_by_position_as_the_iterator_reads_them():
    """The RL trainer reads prompt batches by position (no iterator state): position i is the
    iterator's i-th batch, across epochs (a new permutation each)."""
    batches = data.prompt_batches(data.problem_records(TASK, CFG.task_seed, CFG.num_problems), CFG)
    it = _prompt_iter()
    _assert_batches_equal([batches[i] for i in range(40)], [next(it) for _ in range(40)])  # 16 batches an epoch
    assert sorted(np.concatenate([batches[i]["index_B"] for i in range(16, 32)])) == list(range(64))
    assert not np.array_equal(batches[16]["index_B"], batches[0]["index_B"])


def test_each_step_owns_max_gen_batches_positions():
    assert [data.step_batch_index(step, b, 3) for step in range(3) for b in range(3)] == list(range(9))
    assert data.step_batch_index(5, 0, 1) == 5
    with pytest.raises(ValueError, match="generation batch 2 is outside the step's max_gen_batches=2"):
        data.step_batch_index(0, 2, 2)
    with pytest.raises(ValueError, match="step=-1 must be >= 0"):
        data.step_batch_index(-1, 0, 2)


def test_record_depends_only_on_seed_and_index():
    recs = data.problem_records(TASK, 11, 64)
    for i in (0, 17, 63):
        p = make_problem(i, 11, TASK)
        expected = {"prompt": p.prompt, "answer": p.answer, "index": i, "solution": p.solution}
        assert recs[i] == expected
    # A batch row is the problem named by its index, whatever the shuffle put it there.
    batch = next(_prompt_iter())
    texts = tokenizer.decode_batch(batch["prompt_ids_BxT"])
    for text, ans, idx in zip(texts, batch["answer_B"], batch["index_B"]):
        p = make_problem(int(idx), 11, TASK)
        assert text == p.prompt + data.PROMPT_SEPARATOR and ans == p.answer


def test_shuffle_seed_changes_order_not_content():
    def epoch(seed):
        cfg = data.DataConfig(batch_size=4, max_len=64, shuffle_seed=seed, task_seed=11,
                              num_problems=64, num_epochs=1)
        return np.concatenate([b["index_B"] for b in _prompt_iter(cfg)])

    a, b = epoch(5), epoch(6)
    assert len(a) == 64 and sorted(a) == sorted(b) == list(range(64))
    assert not np.array_equal(a, b)
    np.testing.assert_array_equal(a, epoch(5))


def test_prompt_batch_layout():
    batch = next(_prompt_iter())
    ids, mask = batch["prompt_ids_BxT"], batch["prompt_mask_BxT"]
    assert ids.shape == mask.shape == (4, 64) and ids.dtype == np.int32
    assert batch["answer_B"].dtype == np.int64
    assert np.all(mask[:, -1])  # left-padded: every prompt ends in the last column
    first = mask.argmax(1)
    assert np.all(ids[np.arange(4), first] == tokenizer.BOS)
    assert np.all(ids[:, -1] == tokenizer.encode(data.PROMPT_SEPARATOR)[0])
    np.testing.assert_array_equal(ids[~mask], tokenizer.PAD)


def test_sft_batch_layout():
    cfg = data.DataConfig(batch_size=3, max_len=128, num_problems=16)
    batch = data.sft_batches(data.problem_records(TASK, 0, 16), cfg)[0]
    ids, mask, loss_mask = batch["ids_BxT"], batch["mask_BxT"], batch["loss_mask_BxT"]
    for row, m, lm, idx in zip(ids, mask, loss_mask, batch["index_B"]):
        p = make_problem(int(idx), 0, TASK)
        prompt, solution = tokenizer.decode(row).split(data.PROMPT_SEPARATOR, 1)
        assert (prompt, solution) == (p.prompt, p.solution)
        assert reward(solution, p.answer) == 1.0
        # loss on exactly the solution tokens and EOS, not on the prompt or padding.
        target = row[lm]
        assert tokenizer.decode(target) == solution and target[-1] == tokenizer.EOS
        assert m[0] and not lm[0] and np.all(lm <= m)


def test_too_long_prompt_raises_instead_of_truncating():
    cfg = data.DataConfig(batch_size=2, max_len=8, num_problems=4)
    with pytest.raises(ValueError, match="max_len=8|length=8"):
        next(_prompt_iter(cfg))


def test_dapo_fixture_loads():
    rows = load_math_rows(FIXTURE)
    assert rows.num_read == 8
    assert rows.answers == (34, -3, 12, 100, 2025)
    assert rows.dropped == {"not_integer": 2, "answer_out_of_int64": 0, "bad_prompt": 0,
                            "unencodable": 1, "too_long": 0}
    assert rows.num_read == len(rows.prompts) + sum(rows.dropped.values())
    assert rows.prompts[1].startswith("Solve the following math problem")
    assert "$7 - 10$" in rows.prompts[1]
    # The same verifier scores the real schema's ground truths.
    assert all(reward(f"Answer: \\boxed{{{a}}}", a) == 1.0 for a in rows.answers)
    # ...and the rows feed the same prompt pipeline.
    cfg = data.DataConfig(batch_size=2, max_len=512, num_problems=4)
    batch = next(data.iterate(data.prompt_batches(data.file_records(rows), cfg), cfg))
    texts = tokenizer.decode_batch(batch["prompt_ids_BxT"])
    for text, ans, idx in zip(texts, batch["answer_B"], batch["index_B"]):
        assert text == rows.prompts[idx] + data.PROMPT_SEPARATOR and ans == rows.answers[idx]
    short = load_math_rows(FIXTURE, max_prompt_chars=260)  # fixture prompts: 255..316 chars
    assert short.answers == (-3, 100) and short.dropped["too_long"] == 3


def test_flat_schema_and_configurable_columns(tmp_path):
    path = tmp_path / "flat.jsonl"
    lines = [{"question": "1+1?", "final": 2, "solution": "x"},
             {"question": "half?", "final": "0.5", "solution": "7"}]
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n\n")
    rows = load_math_rows(path, prompt_key="question", answer_key="final")
    assert rows.prompts == ("1+1?",) and rows.answers == (2,) and rows.dropped["not_integer"] == 1
    # Default answer columns: "solution" is found when there is no reward_model.
    assert load_math_rows(path, prompt_key="question").answers == (7,)  # "x" is dropped
    with pytest.raises(KeyError, match="lacks prompt_key='prompt'"):
        load_math_rows(path)
    with pytest.raises(ValueError, match="must end in"):
        load_math_rows(tmp_path / "rows.csv")


def test_parquet_needs_pyarrow(tmp_path):
    # Without pyarrow (this venv) the error path is tested; with it, the round trip.
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match="needs pyarrow"):
            load_math_rows(tmp_path / "rows.parquet")
        return
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [json.loads(line) for line in FIXTURE.read_text().splitlines()]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "rows.parquet")
    assert load_math_rows(tmp_path / "rows.parquet").answers == load_math_rows(FIXTURE).answers


@pytest.mark.parametrize("bad_line, match", [
    ('{"prompt": "1+1?", "answer": ', r":2: malformed row, not JSON"),
    ('[1, 2]', r":2: malformed row, a JSON list instead of an object"),
    ('{"question": "1+1?", "answer": 2}', r":2: malformed row, it lacks prompt_key='prompt'"),
])
def test_a_malformed_row_fails_the_load_naming_file_and_line(tmp_path, bad_line, match):
    """The policy of math_file: a malformed row is an error, not a silently smaller data set."""
    path = tmp_path / "rows.jsonl"
    path.write_text('{"prompt": "2+2?", "answer": 4}\n' + bad_line + '\n\n{"prompt": "3+3?", "answer": 6}\n')
    with pytest.raises((ValueError, KeyError), match=f"{path}{match}"):
        load_math_rows(path)
