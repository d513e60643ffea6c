"""Agentic GRPO with TRL: token sequences of multi-turn episodes (template deltas, env mask), settings, and one GRPO
step on a tiny random Qwen2 end to end (weights move, trajectories and evaluations land in the store)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytest.importorskip("trl")

from coevo.backends.base import SamplingParams
from coevo.backends.models import load_tokenizer
from coevo.envs.sudoku import SudokuEpisode, puzzles
from coevo.rl.grpo import GRPOBaseline, GRPOSettings, load_settings, stop_token_ids
from coevo.rl.tokens import ChatTokens, run_token_episodes
from coevo.rollouts.sudoku import SudokuRollout
from coevo.store import TrajectoryStore

ROOT = Path(__file__).resolve().parents[1]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_chat_tokens_reproduce_the_chat_template(tiny_model_dir):
    tok = load_tokenizer(tiny_model_dir)
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    chat = ChatTokens(tok, [im_end])
    conv = [{"role": "system", "content": "rules"}, {"role": "user", "content": "board one"}]
    ids = chat.prompt_ids(conv)
    r1 = chat.encode("set 1 2 3") + [im_end]  # a reply that ended with the stop token
    r2 = chat.encode("set 2 2")  # a reply cut by the length limit
    seq = ids + r1 + chat.between(r1, "board two") + r2 + chat.between(r2, "board three")
    full = conv + [
        {"role": "assistant", "content": "set 1 2 3"},
        {"role": "user", "content": "board two"},
        {"role": "assistant", "content": "set 2 2"},
        {"role": "user", "content": "board three"},
    ]
    assert tok.decode(seq) == tok.apply_chat_template(full, tokenize=False, add_generation_prompt=True)


def test_token_episodes_mask_environment_tokens(tiny_model_dir):
    from coevo.backends.hf import HFPolicy

    pol = HFPolicy(tiny_model_dir)
    tok = load_tokenizer(tiny_model_dir)
    eps = [SudokuEpisode(p) for p in puzzles(4, 2, "train", 3, 0)]
    params = SamplingParams(max_new_tokens=5, temperature=1.0, seed=1)
    trajs = run_token_episodes(pol.model, tok, eps, lambda turn: params, stop_ids=stop_token_ids(pol.model, tok))
    for tr, ep in zip(trajs, eps):
        assert len(tr.env_mask) == len(tr.completion_ids) and len(tr.turns) == ep.turns == 6
        assert sum(tr.env_mask) == sum(t.completion_tokens for t in tr.turns)  # every generated token, all turns
        assert tr.env_mask[0] == 1 and tr.env_mask[-1] == 1  # starts and ends with a reply
        runs = "".join(map(str, tr.env_mask)).replace("01", "0|1").split("|")
        assert len(runs) == 6  # six replies, each followed (except the last) by environment tokens
        assert ep.observation().split("Turns left")[0] in tok.decode(tr.prompt_ids + tr.completion_ids) or ep.done
    # the same seed gives the same episodes
    again = run_token_episodes(
        pol.model,
        tok,
        [SudokuEpisode(p) for p in puzzles(4, 2, "train", 3, 0)],
        lambda turn: params,
        stop_ids=stop_token_ids(pol.model, tok),
    )
    assert [t.completion_ids for t in again] == [t.completion_ids for t in trajs]


def test_settings_refuse_board_context_and_count_episodes():
    with pytest.raises(Exception, match="history"):
        GRPOSettings(rollout={"type": "sudoku", "context": "board"})
    with pytest.raises(Exception, match="task pool"):
        GRPOSettings(rollout={"type": "countdown"})
    s = GRPOSettings(rollout={"type": "sudoku", "context": "history"}, steps=3, prompts_per_step=2, num_generations=4)
    assert s.episodes() == 24 and s.micro() == 4
    assert (
        GRPOSettings(
            rollout={"type": "sudoku", "context": "history"}, prompts_per_step=2, num_generations=4, micro_batch=1
        ).micro()
        == 1
    )
    with pytest.raises(Exception, match="micro_batch 3 must divide"):
        GRPOSettings(
            rollout={"type": "sudoku", "context": "history"}, prompts_per_step=2, num_generations=4, micro_batch=3
        )


class ParityEpisode(SudokuEpisode):
    """Reward 1 when the first reply has an even number of characters: a reward a random model earns about half
    the time, so groups have non-zero spread and GRPO has a gradient."""

    def reward(self):
        return 1.0 if self._first is not None and len(self._first) % 2 == 0 else 0.0

    def step(self, text):
        if not hasattr(self, "_first") or self._first is None:
            self._first = text
        return super().step(text)

    _first = None


class ParityRollout(SudokuRollout):
    def episode(self, puzzle):
        return ParityEpisode(puzzle, self.config.max_turns, self.config.list_empty, self.config.hints)


def parity_settings(model_dir, test_puzzles: int = 1, **overrides) -> GRPOSettings:
    """One step of 2 prompts x G 4 on the ParityRollout (4x4, H* 1, sampled at temperature 1), seed 0."""
    fields = {
        "model": str(model_dir),
        "steps": 1,
        "prompts_per_step": 2,
        "num_generations": 4,
        "learning_rate": 1e-2,
        "seed": 0,
        "rollout": {
            "type": "test_grpo:ParityRollout",
            "size": 4,
            "horizon": 1,
            "context": "history",
            "train_pool": 4,
            "puzzles_per_member": 2,
            "test_puzzles": test_puzzles,
            "max_new_tokens": 6,
            "temperature": 1.0,
            "top_k": 0,
            "top_p": 1.0,
        },
    }
    return GRPOSettings(**{**fields, **overrides})


def test_one_grpo_step_on_tiny_qwen2(tiny_model_dir, tmp_path):
    settings = parity_settings(tiny_model_dir, test_puzzles=2)
    with TrajectoryStore(tmp_path / "store.sqlite") as store:
        grpo = GRPOBaseline(settings, tmp_path / "trl", store, run_id="g")
        before = {n: p.detach().clone() for n, p in grpo.policy.model.named_parameters()}
        summary = grpo.run()
        after = dict(grpo.policy.model.named_parameters())
        trajs = list(store.iter_trajectories())
    assert summary["episodes"] == settings.episodes() == 8 and summary["steps"] == 1
    assert [e["step"] for e in summary["evaluations"]] == [0, 1]
    rewards = [t.reward for t in trajs if t.meta["split"] == "train"]
    assert len(rewards) == 8 and 0 < sum(rewards) < 8  # both outcomes occur, so advantages are non-zero
    assert any(not torch.equal(before[n], after[n]) for n in before)  # the optimizer step moved the weights
    train = [t for t in trajs if t.meta["split"] == "train"]
    assert {t.meta["group"] for t in train} == {0, 1} and all(t.evolver == "grpo" and t.generation == 0 for t in train)
    assert all(len(t.steps) == t.llm_calls == 3 for t in train)  # 3 x H* turns each (random replies)
    test = [t for t in trajs if t.meta["split"] == "test"]
    assert len(test) == 4 and {t.meta["grpo_step"] for t in test} == {0, 1} and all(t.member is None for t in test)


@pytest.mark.parametrize("name", sorted(p.name for p in (ROOT / "configs/longhorizon").glob("*grpo*.yaml")))
def test_grpo_configs_validate(name):
    s = load_settings(ROOT / "configs/longhorizon" / name, ["steps=2"])
    assert s.steps == 2 and s.rollout["context"] == "history"


def test_eval_callback_evaluates_every_k_steps_but_not_the_last():
    from types import SimpleNamespace

    from coevo.rl.grpo import eval_callback

    seen = []
    fake = SimpleNamespace(settings=SimpleNamespace(steps=6), evaluate=seen.append)
    cb = eval_callback(fake, 2)
    for step in range(1, 7):
        cb.on_step_end(None, SimpleNamespace(global_step=step), None)
    assert seen == [2, 4]  # step 6 is the final evaluation run() does itself


def test_micro_batches_and_checkpointing_leave_the_step_unchanged(tiny_model_dir, tmp_path):
    """One step in micro-batches of 1 with gradient checkpointing moves the weights as one step over whole groups:
    the same episodes (the rollout's seeds), the same per-sequence losses averaged, the same AdamW update."""

    def one_step(name, **memory):
        settings = parity_settings(tiny_model_dir, eval_at_start=False, **memory)
        grpo = GRPOBaseline(settings, tmp_path / name, None)
        summary = grpo.run()
        return summary, {n: p.detach().clone() for n, p in grpo.policy.model.named_parameters()}

    whole, w_whole = one_step("whole")
    micro, w_micro = one_step("micro", micro_batch=1, gradient_checkpointing=True)
    assert whole["train_reward"] == micro["train_reward"] and 0 < whole["train_reward"] < 1
    moved = [n for n in w_whole if not torch.equal(w_whole[n], w_micro[n])]
    assert moved == [] or all(torch.allclose(w_whole[n], w_micro[n], atol=1e-5, rtol=1e-4) for n in moved)


def test_bf16_run_trains_float32_masters_and_samples_a_stochastically_rounded_copy(tiny_model_dir, tmp_path):
    """dtype bfloat16 is mixed precision: TRL steps float32 masters (a 1e-6 AdamW step that bf16 weights would
    round away moves them), and the bf16 sampling copy is each master rounded to one of its two bf16 neighbours,
    the same copy for the same step, with some entries rounded up past round-to-nearest (the step stays visible)."""
    settings = parity_settings(tiny_model_dir, dtype="bfloat16", learning_rate=1e-6, eval_at_start=False)
    grpo = GRPOBaseline(settings, tmp_path / "trl", None)
    assert grpo.policy.model.dtype == torch.bfloat16 and grpo.train_model.dtype == torch.float32
    before = {n: p.detach().clone() for n, p in grpo.train_model.named_parameters()}
    start = {n: p.detach().clone() for n, p in grpo.policy.model.named_parameters()}
    # the masters start as the bf16 model (the float32 tiny checkpoint rounded to nearest, as ES loads it) ...
    assert all(torch.equal(before[n], start[n].float()) for n in start)
    grpo.sync(0)  # ... so the copy of the unchanged masters is that bf16 model, bit for bit
    assert all(torch.equal(start[n], p) for n, p in grpo.policy.model.named_parameters())
    summary = grpo.run()
    assert 0 < summary["train_reward"] < 1  # non-zero advantages
    masters = {n: p.detach().clone() for n, p in grpo.train_model.named_parameters()}
    delta = torch.cat([(masters[n] - before[n]).abs().flatten() for n in masters])
    assert 0 < float(delta.max()) <= 1.5e-6  # AdamW's first step: at most lr per entry
    # a round-to-nearest bf16 copy of the masters would not see the step in most entries
    nearest_same = sum(int((masters[n].bfloat16() == before[n].bfloat16()).sum()) for n in masters)
    assert nearest_same > 0.9 * delta.numel()
    copy = {n: p.detach().clone() for n, p in grpo.policy.model.named_parameters()}
    up_past_nearest = 0
    for n, m in masters.items():
        lo, c = m.bfloat16(), copy[n]
        neighbour = torch.nextafter(
            lo, torch.where(m > lo.float(), torch.tensor(float("inf")), -torch.tensor(float("inf"))).bfloat16()
        )
        assert bool(((c == lo) | (c == neighbour)).all()), n
        up_past_nearest += int((c != lo).sum())
    assert up_past_nearest > 0
    grpo.sync(1)  # the same step: the same copy
    assert all(torch.equal(copy[n], p) for n, p in grpo.policy.model.named_parameters())
    grpo.sync(2)  # another step key: other random bits
    assert any(not torch.equal(copy[n], p) for n, p in grpo.policy.model.named_parameters())
