"""The multi-turn rollout: picture -> answer -> env step -> feedback and next picture, repeated.

Every live episode of a turn goes to the engines in one batch. Each turn's prompt is built from
token pieces by the prompter of the episode's task (vlm.chat.ChatPrompter: its instruction and
picture size; a run of several tasks has one each), so the model's earlier answers re-enter the
context as the exact ids it sampled. An episode ends when the env says so, at `max_turns`, or with
stop reason `length` when the next prompt plus an answer would not fit `max_input_length` (a
picture is never cut). What the trainer needs comes out of `Episode.sequences()`: token ids, a loss mask
that is 1 exactly on sampled tokens, the sampling log-probs and the pictures.
"""
from __future__ import annotations

import math
import random
from collections.abc import Hashable
from dataclasses import dataclass, field, replace

import numpy as np

from envs.registry import get_environment
from inference.requests import GenRequest, GenResult, Sampling
from settings import Config
from vlm.forward import TrainSeq


@dataclass
class Task:
    episode_id: str
    group: int                  # GRPO group: the index of the prompt (task row) in the batch
    init_state: dict | None = None  # Environment.init_state of the row
    seed: int | None = None
    env_id: str = field(kw_only=True)  # the row's task: which prompter asks


@dataclass
class Turn:
    prompt_ids: list[int]
    response_ids: list[int]
    logprobs: list[float]
    picture_turns: list[int]    # the turns whose pictures this prompt holds
    text: str
    feedback: str = ""
    valid_action: bool = True
    state: Hashable = None      # the env state the turn started from (Environment.state_key): GiGPO's anchor
    reward: float = 0.0         # what the env paid for this turn's action
    progress: float = 0.0       # how much nearer the goal its action took the env (Environment.progress)
    explored: bool = False      # a random action (generator.explore_revisits), not sampled


@dataclass
class Episode:
    episode_id: str
    group: int
    seed: int | None
    turns: list[Turn] = field(default_factory=list)
    images: list[np.ndarray] = field(default_factory=list)  # the picture shown at each turn
    reward: float = 0.0
    stop_reason: str = ""       # stop (the agent stopped) | truncated (max_turns) | length
    adapter_version: int = 0

    @property
    def solved(self) -> bool:
        return self.reward > 0

    @property
    def invalid_actions(self) -> int:
        return sum(not t.valid_action for t in self.turns)

    @property
    def generated_tokens(self) -> int:
        return sum(len(t.response_ids) for t in self.turns if not t.explored)

    def sequences(self) -> list[TrainSeq]:
        """Training sequences: a turn whose prompt extends the previous sequence joins it."""
        seqs: list[TrainSeq] = []
        for k, turn in enumerate(self.turns):
            cur = seqs[-1] if seqs else None
            if cur is not None and turn.prompt_ids[:len(cur.input_ids)] == cur.input_ids:
                extra = turn.prompt_ids[len(cur.input_ids):]
                cur.input_ids += extra + turn.response_ids
                cur.loss_mask += [0] * len(extra) + [1] * len(turn.response_ids)
                cur.logprobs += [0.0] * len(extra) + list(turn.logprobs)
                cur.images = [self.images[i] for i in turn.picture_turns]
                cur.turns.append(k)
            else:
                seqs.append(TrainSeq(self.episode_id, turn.prompt_ids + turn.response_ids,
                                     [0] * len(turn.prompt_ids) + [1] * len(turn.response_ids),
                                     [0.0] * len(turn.prompt_ids) + list(turn.logprobs),
                                     [self.images[i] for i in turn.picture_turns], [k]))
        return seqs


class RolloutRunner:
    """Runs episodes through a sampling client (`generate`) and an env pool (`env`); `prompters` maps
    each task's env_id to its ChatPrompter (rl.inputs.make_prompters)."""

    def __init__(self, generate, env, prompters: dict, max_turns: int, max_input_length: int,
                 context_window_turns: int = 0, context_pictures: int = 0):
        self.generate, self.env, self.prompters = generate, env, prompters
        self.max_turns, self.max_input_length = max_turns, max_input_length
        self.window, self.pictures = context_window_turns, context_pictures

    @classmethod
    def from_config(cls, cfg: Config, generate, prompters, env) -> "RolloutRunner":
        """The run's turn limit, input length and context window."""
        g = cfg.generator
        return cls(generate, env, prompters, g.max_turns, g.max_input_length, g.context_window_turns,
                   g.context_pictures)

    def run(self, tasks: list[Task], sampling: Sampling, expect_version: int, between_turns=None,
            explore: float = 0.0) -> list[Episode]:
        """Every task's episode, turn by turn (`between_turns()`, when given, is called before each turn:
        it may raise to stop the rollout, as a preemption does). `explore`: the chance that a turn
        starting from a state its episode has already been in plays a random action instead
        (generator.explore_revisits; training rollouts only)."""
        unknown = sorted({t.env_id for t in tasks} - set(self.prompters))
        if unknown:
            raise ValueError(f"tasks of {', '.join(unknown)}, but this runner prompts for {', '.join(self.prompters)}")
        prompter = {t.episode_id: self.prompters[t.env_id] for t in tasks}
        episodes = {t.episode_id: Episode(t.episode_id, t.group, t.seed, adapter_version=expect_version)
                    for t in tasks}
        starts = self.env.reset([t.episode_id for t in tasks], seeds=[t.seed for t in tasks],
                                init_states=[t.init_state for t in tasks], env_ids=[t.env_id for t in tasks])
        pieces, state, progress = {}, {}, {}  # episode id -> (user turn texts, answer ids); -> its env's state key, progress
        seen = {t.episode_id: set() for t in tasks}  # the states each episode's turns started from
        for s in starts:
            ep = episodes[s["episode_id"]]
            ep.images.append(s["image"])
            pieces[ep.episode_id] = ([""], [])
            state[ep.episode_id], progress[ep.episode_id] = s["state_key"], s["progress"]
        live = [t.episode_id for t in tasks]
        for turn in range(self.max_turns):
            if between_turns is not None:
                between_turns()
            asking = []
            for eid in live:
                users, answers = pieces[eid]
                ids, picture_turns = prompter[eid].prompt(users, answers, self.window, self.pictures)
                if len(ids) + sampling.max_new_tokens > self.max_input_length:
                    episodes[eid].stop_reason = "length"
                    continue
                asking.append((eid, ids, picture_turns))
            if not asking:
                break
            seeded = sampling if sampling.seed is None else replace(sampling, seed=sampling.seed * 131 + turn)
            results = self._random_moves(asking, state, seen, explore, random.Random(f"{seeded.seed}:{turn}"),
                                         prompter, expect_version)
            explored, sampled = set(results), [a for a in asking if a[0] not in results]
            if sampled:
                requests = [GenRequest(prompt_ids=ids, images=[episodes[eid].images[i] for i in picture_turns])
                            for eid, ids, picture_turns in sampled]
                results |= {a[0]: res for a, res in zip(sampled, self.generate(requests, seeded, expect_version))}
            for eid, ids, picture_turns in asking:
                res = results[eid]
                if res.adapter_version != expect_version:  # belt and braces: engines check too
                    raise RuntimeError(f"episode {eid} was sampled with adapter v{res.adapter_version}, "
                                       f"expected v{expect_version}")
                seen[eid].add(state[eid])
                episodes[eid].turns.append(Turn(ids, res.token_ids, res.logprobs, picture_turns, res.text,
                                                state=state[eid], explored=eid in explored))
            steps = self.env.step([a[0] for a in asking], [results[a[0]].text for a in asking])
            live = []
            for (eid, _, _), st in zip(asking, steps):
                ep = episodes[eid]
                ep.turns[-1].feedback = st["info"]["feedback"]
                ep.turns[-1].valid_action = st["info"]["valid_action"]
                ep.turns[-1].reward = st["reward"]
                ep.turns[-1].progress = st["progress"] - progress[eid]
                ep.reward += st["reward"]
                state[eid], progress[eid] = st["state_key"], st["progress"]
                if st["terminated"] or st["truncated"]:
                    ep.stop_reason = "stop" if st["terminated"] else "truncated"
                    continue
                ep.images.append(st["image"])
                users, answers = pieces[eid]
                answers.append(ep.turns[-1].response_ids)
                users.append(st["info"]["feedback"])
                live.append(eid)
            if not live:
                break
        self.env.close(list(episodes))
        return [episodes[t.episode_id] for t in tasks]

    def _random_moves(self, asking: list, state: dict, seen: dict, explore: float, rng: random.Random,
                      prompter: dict, version: int) -> dict[str, GenResult]:
        """{episode id: a random action as its answer} for the asking episodes back in a state they
        have been in, each with chance `explore`. Their log-probs are NaN: no engine sampled them, and
        the trainer takes its own as the old policy's (a ratio of 1), as if the policy had sampled them."""
        chosen = [eid for eid, _, _ in asking if explore and state[eid] in seen[eid] and rng.random() < explore]
        if not chosen:
            return {}
        texts = self.env.random_answers(chosen, [rng.getrandbits(32) for _ in chosen])
        out = {}
        for eid, text in zip(chosen, texts):
            ids = prompter[eid].answer_ids(text)
            out[eid] = GenResult(ids, [math.nan] * len(ids), text, "stop", version)
        return out


def rollout_tasks(rows: list[dict], step: int, samples_per_prompt: int) -> list[Task]:
    """`samples_per_prompt` episodes of each row, as its task; the row's index is the GRPO group."""
    return [task_of(row, f"s{step}-p{i}-n{k}", i) for i, row in enumerate(rows) for k in range(samples_per_prompt)]


def task_of(row: dict, episode_id: str, group: int) -> Task:
    """An episode of the row, as the row's own task (its env_id) starts it."""
    return Task(episode_id, group, get_environment(row["env_id"]).init_state(row), row["seed"], env_id=row["env_id"])


def training_sampling(cfg: Config, step: int) -> Sampling:
    """generator.sampling_params, seeded by the run's seed and the step."""
    p = cfg.generator.sampling_params
    return Sampling(max_new_tokens=p.max_generate_length, temperature=p.temperature, top_p=p.top_p,
                    seed=cfg.trainer.seed * 100_003 + step)
