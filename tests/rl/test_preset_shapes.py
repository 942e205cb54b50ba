"""Every RL and warm-up preset's fixed shapes hold its task: no prompt is cut, no worked solution is
truncated in the warm-up, and a right answer of any length is never shaped as overlong (a right
answer inside the overlong buffer would be penalised for being right)."""

from __future__ import annotations

import pytest

from fp4rl import configs
from fp4rl.rl import data, evaluation, tokenizer
from fp4rl.rl.task import make_problem

PROBLEMS = 3000  # per preset: the longest of 3000 draws is within a token or two of the maximum


def _problems(task, seed):
    return [make_problem(i, seed, task) for i in range(PROBLEMS)]


# smoke: a machinery check sized for seconds on CPU, whose model solves nothing; its 48-token budget
# and 8-token buffer overlap its longest answers (42 tokens) by design of its size, not of a result.
RESEARCH_PRESETS = sorted(set(configs.RL_PRESETS) - {"smoke"})


@pytest.mark.parametrize("preset", RESEARCH_PRESETS)
def test_rl_prompts_fit_and_right_answers_are_never_overlong(preset):
    config = configs.RL_PRESETS[preset]
    problems = _problems(config.task, config.task_seed)
    longest_prompt = max(len(data.encode_prompt(p.prompt)) for p in problems)
    assert longest_prompt <= config.prompt_len, (preset, longest_prompt)
    longest_answer = max(len(tokenizer.encode(p.solution, eos=True)) for p in problems)
    assert longest_answer <= config.max_new_tokens - config.overlong_buffer, (preset, longest_answer)


@pytest.mark.parametrize("preset", sorted(configs.SFT_PRESETS))
def test_warm_up_sequences_fit_and_its_accuracy_table_fits_its_prompts(preset):
    config = configs.SFT_PRESETS[preset]
    problems = _problems(config.task, config.task_seed)
    longest = max(len(data.encode_prompt(p.prompt)) + len(tokenizer.encode(p.solution, eos=True)) for p in problems)
    assert longest <= config.max_len, (preset, longest)
    held_out = _problems(config.eval_task, config.eval_task_seed)
    width = evaluation.fitting_prompt_len(held_out)
    assert width % 16 == 0 and width >= max(len(data.encode_prompt(p.prompt)) for p in held_out)


def test_the_accuracy_table_width_keeps_the_short_bands_and_grows_for_long_prompts():
    short = _problems(configs.RL_TASK, 1_000_003)[:50]
    assert evaluation.fitting_prompt_len(short) == 48
    long_prompt = make_problem(0, 0, configs.LONG_TASK.__class__(min_ops=8, max_ops=8, digits=3, num_distractors=4))
    assert len(data.encode_prompt(long_prompt.prompt)) > 48
    width = evaluation.fitting_prompt_len([long_prompt])
    assert width >= len(data.encode_prompt(long_prompt.prompt)) and width % 16 == 0
