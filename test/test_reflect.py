"""Reflection (``decoding/reflect.py``): the search picks the model's most probable candidate that passes the plan
checker; a plan that passes is untouched (tokens and forwards); rounds are bounded; nothing starts past the deadline.
The crafted cases run the real block loop and runner over a logits source that writes chosen logits (the tiny-random
model's tokenizer and grammar, no trained weights)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from wamdiff_ros import format as fmt
from wamdiff_ros.decoding import reflect as reflect_module
from wamdiff_ros.decoding.block import decode_blocks
from wamdiff_ros.decoding.engine import DecoderEngine
from wamdiff_ros.decoding.graphs import GraphRunner
from wamdiff_ros.decoding.reflect import reflect, search
from wamdiff_ros.decoding.settings import DecodeSettings
from wamdiff_ros.plan_check import AnswerCheck
from wamdiff_ros.planner import EgoState, Planner

SPEED = 10.0
GOOD = np.stack([SPEED * fmt.WAYPOINT_DT_S * np.arange(1, 9), np.zeros(8)], axis=1)  # x = 5, 10, ... 40


def char_tokens(text: str) -> list[int]:
    return [ord(c) for c in text]


def test_search_takes_the_most_probable_candidate_that_passes():
    tokens = char_tokens("15")
    cand_t = [[ord("1"), ord("2"), ord("3")], [ord("5"), ord("0"), ord("9")]]
    cand_p = [[0.6, 0.3, 0.1], [0.9, 0.08, 0.02]]
    # "15" fails; "25" (0.3 * 0.9) beats "10" (0.6 * 0.08) and passes
    assert search(tokens, [0, 1], cand_t, cand_p, lambda t: int("".join(map(chr, t))) >= 20) == char_tokens("25")
    # a stricter test: "35" (0.1 * 0.9 = 0.09) comes after "25" and "10" but before "20" (0.3 * 0.08 = 0.024)
    assert search(tokens, [0, 1], cand_t, cand_p, lambda t: int("".join(map(chr, t))) >= 30) == char_tokens("35")
    assert search(tokens, [0, 1], cand_t, cand_p, lambda t: False) is None
    # ties go to the more significant position: both changes cost the same here
    even = [[0.5, 0.5], [0.5, 0.5]]
    assert search(tokens, [0, 1], [[ord("1"), ord("2")], [ord("5"), ord("6")]], even, lambda t: True) == \
        char_tokens("25")


def test_search_changes_the_most_significant_character_first():
    """x = 27.85 should be 37.85: the tens digit's second candidate is unlikely (0.05), while the decimals' are nearly
    even. Ranked, the tens digit is tried before the decimals' many combinations use up the trials."""
    tokens = char_tokens("2785")
    digits = [ord(c) for c in "0123456789"]
    cand_t = [[ord("2"), ord("3")] + [d for d in digits if d not in (ord("2"), ord("3"))]] + \
        [[t] + [d for d in digits if d != t] for t in tokens[1:]]
    cand_p = [[0.9, 0.05] + [0.05 / 8] * 8, [0.95] + [0.05 / 9] * 9] + [[0.12] + [0.88 / 9] * 9] * 2
    wanted = lambda t: t[0] == ord("3")  # noqa: E731
    assert search(tokens, [0, 1, 2, 3], cand_t, cand_p, wanted, ranks=[0, 1, 2, 3], max_trials=20) == \
        char_tokens("3785")
    assert search(tokens, [0, 1, 2, 3], cand_t, cand_p, wanted, max_trials=20) is None  # unranked: the decimals


@pytest.fixture(scope="module")
def tiny():
    return Planner.from_pretrained("tiny-random")


class Crafted:
    """A logits source over the runner's engine: answer position i prefers ``first[i]`` (probability ``p1``), then
    ``second[i]`` when given (``p2``); the rest of the vocabulary shares what is left."""

    def __init__(self, engine: DecoderEngine, vocab: int, first: list[int], second: dict[int, int], p1: float = 0.6,
                 p2: float = 0.35) -> None:
        self.engine, self.vocab = engine, vocab
        rest = (1.0 - p1) / (vocab - 1)
        self.table = torch.full((len(first), vocab), math.log(rest))
        for i, t in enumerate(first):
            self.table[i, t] = math.log(p1)
            if i in second:
                self.table[i, second[i]] = math.log(p2)
                self.table[i, :][[j for j in range(vocab) if j not in (t, second[i])]] = \
                    math.log((1.0 - p1 - p2) / (vocab - 2))
        self.calls = 0

    def __call__(self, tokens: torch.Tensor, n_clean: int = 0, out: torch.Tensor | None = None) -> torch.Tensor:
        self.calls += 1
        start = self.engine.length + n_clean  # answer index of the block's first query (the cache holds no prompt)
        n = tokens.shape[0] - n_clean
        rows = torch.arange(start, start + n).clamp(max=self.table.shape[0] - 1)
        logits = self.table.index_select(0, rows).to(self.engine.dtype)
        if out is None:
            return logits
        out.copy_(logits)
        return out


def crafted_runner(tiny, answer: str, second: dict[int, int], settings: DecodeSettings, p2: float = 0.35):
    bundle = tiny.bundle
    vocab = bundle.model.get_output_embeddings().weight.shape[0]
    ids = [bundle.tokenizer.convert_tokens_to_ids(c) for c in answer] + [bundle.eos_token_id]
    ids += [bundle.eos_token_id] * (settings.max_new_tokens - len(ids))
    engine = DecoderEngine(bundle.model, 256, "sdpa")
    runner = GraphRunner(engine, bundle.mask_token_id, max_block=settings.block_size, check_every=1,
                         use_graphs=False, candidates=4)
    runner.set_grammar(tiny._grammar)
    source = Crafted(engine, vocab, ids, second, p2=p2)
    engine.run_planned = source
    engine.plan = lambda *a, **k: None  # nothing to plan: the source needs no attention metadata
    return runner, source, ids


def check_for(tiny, velocity=(SPEED, 0.0)) -> AnswerCheck:
    return AnswerCheck(tiny._text_of, tiny.bundle.eos_token_id, velocity)


SETTINGS = DecodeSettings(block_size=32, steps=32, threshold=0.5, max_new_tokens=128)


def test_reflection_picks_the_second_candidate_when_the_first_steps_back(tiny):
    """Waypoint 5's tens digit: the model's first choice writes x = 15.00 (behind waypoint 4 at 20.00), its second
    25.00. The draft steps back; reflection fixes the second as an anchor; no forward is spent on it."""
    good = fmt.format_waypoints(GOOD)
    position = good.index("025.00") + 1  # the tens digit of waypoint 5's x
    drafted = good[:position] + "1" + good[position + 1:]
    tok = tiny.bundle.tokenizer
    runner, source, _ = crafted_runner(tiny, drafted, {position: tok.convert_tokens_to_ids("2")}, SETTINGS)
    plain = decode_blocks(runner, SETTINGS, tiny.bundle.eos_token_id)
    text = tok.decode([t for t in plain.tokens if t != tiny.bundle.eos_token_id])
    assert text == drafted and check_for(tiny).failing(plain.tokens)[0] == 4

    runner, source, _ = crafted_runner(tiny, drafted, {position: tok.convert_tokens_to_ids("2")}, SETTINGS)
    result = decode_blocks(runner, SETTINGS, tiny.bundle.eos_token_id, check=check_for(tiny), rounds=2)
    text = tok.decode([t for t in result.tokens if t != tiny.bundle.eos_token_id])
    assert text == good
    assert result.reflection.edited == [4] and result.reflection.searched == 1
    assert result.reflection.extra_forwards == 0 and result.forward_calls == plain.forward_calls
    # the second candidate's probability under the grammar (the digits share the rest): below the first's
    assert 0.35 <= result.confidence[position] < plain.confidence[position]


def test_a_passing_plan_is_untouched(tiny):
    good = fmt.format_waypoints(GOOD)
    runner, source, _ = crafted_runner(tiny, good, {}, SETTINGS)
    plain = decode_blocks(runner, SETTINGS, tiny.bundle.eos_token_id)
    runner, source, _ = crafted_runner(tiny, good, {}, SETTINGS)
    result = decode_blocks(runner, SETTINGS, tiny.bundle.eos_token_id, check=check_for(tiny), rounds=2)
    assert result.tokens == plain.tokens and result.confidence == plain.confidence
    assert result.forward_calls == plain.forward_calls and source.calls == plain.forward_calls
    assert result.reflection.rounds == 0 and result.reflection.edited == []


def test_rounds_are_bounded_and_a_hopeless_plan_is_left_flagged(tiny):
    """Every candidate of waypoint 5 steps back (the rest of the vocabulary below the search's floor) and the model
    writes the same again when re-denoised: each round searches, re-denoises, fails; after ``rounds`` rounds the plan
    is what the model wrote."""
    good = fmt.format_waypoints(GOOD)
    position = good.index("025.00") + 1
    drafted = good[:position] + "0" + good[position + 1:]  # 5.00: far behind
    tok = tiny.bundle.tokenizer
    for rounds in (1, 2, 3):
        runner, source, _ = crafted_runner(tiny, drafted, {position: tok.convert_tokens_to_ids("1")}, SETTINGS,
                                           p2=0.4 - 1e-9)
        result = decode_blocks(runner, SETTINGS, tiny.bundle.eos_token_id, check=check_for(tiny), rounds=rounds)
        assert result.reflection.rounds == rounds
        assert result.reflection.extra_forwards > 0
        assert check_for(tiny).failing(result.tokens)  # still implausible: the caller flags it


def test_no_reflection_step_starts_past_the_deadline(tiny, monkeypatch):
    """A fake clock that reaches the deadline after a few readings: every step reflection starts begins before it,
    and a round cut there leaves the draft as it was (the anchor kept)."""
    good = fmt.format_waypoints(GOOD)
    position = good.index("025.00") + 1
    drafted = good[:position] + "0" + good[position + 1:]
    tok = tiny.bundle.tokenizer
    import wamdiff_ros.decoding.block as block_module

    for readings in (0, 1, 2, 4, 8):
        runner, source, _ = crafted_runner(tiny, drafted, {position: tok.convert_tokens_to_ids("1")}, SETTINGS,
                                           p2=0.4 - 1e-9)
        kept = []  # the draft as the block loop hands it to reflection
        monkeypatch.setattr(block_module, "reflect", lambda runner, draft, *a, **k: kept.append(draft) or
                            reflect_module.ReflectStats())
        decode_blocks(runner, SETTINGS, tiny.bundle.eos_token_id, check=check_for(tiny), rounds=2)
        monkeypatch.undo()
        draft, before = kept[0], list(kept[0].tokens)
        clock, now = itertools.count(), [0.0]

        def tick():
            now[0] = float(next(clock))
            return now[0]

        real_step = runner.step

        def step():
            assert now[0] < readings, "a reflection step started past the deadline"
            return real_step()

        monkeypatch.setattr(reflect_module.time, "perf_counter", tick)
        runner.step = step
        calls = runner.engine.forward_calls
        stats = reflect(runner, draft, check_for(tiny), rounds=2, steps=SETTINGS.steps, deadline=float(readings))
        monkeypatch.undo()
        assert stats.cut or stats.rounds == 2
        if readings == 0:
            assert stats.rounds == 0 and runner.engine.forward_calls == calls and draft.tokens == before


def test_the_planner_flags_and_counts(tiny, road_image):
    """Planner surfaces: the plan carries edited / implausible / reflection stats; implausible_action fallback turns
    a still-failing plan invalid with the checker's reason; AR decoding only checks."""
    ego = EgoState((SPEED, 0.0))
    plan = tiny.plan(road_image, ego, "follow")
    assert plan.stats.reflect_rounds <= tiny.settings.reflect_rounds
    assert plan.edited == bool(plan.edited_waypoints)
    strict = Planner(tiny.bundle, DecodeSettings(**{**_settings(tiny), "implausible_action": "fallback"}))
    out = strict.plan(road_image, ego, "follow")
    if out.implausible:
        assert not out.valid and out.reason == out.implausible
    ar = Planner(tiny.bundle, DecodeSettings(**{**_settings(tiny), "block_size": 1}))
    ar.decode_mode = "ar"
    answer = ar.plan(road_image, ego, "follow")
    assert not answer.edited and answer.stats.reflect_rounds == 0


def _settings(planner) -> dict:
    import dataclasses

    return dataclasses.asdict(planner.settings)


def test_the_host_loop_reflects_the_free_width_format(tiny):
    """WAM-Diff2's free width (format 1) decodes on the host loop under the host grammar: the same repair there."""
    from wamdiff_ros.decoding.constraint import WaypointConstraint
    from wamdiff_ros.decoding.host import CachedBackend, decode_blocks_host

    bundle, tok = tiny.bundle, tiny.bundle.tokenizer
    good = fmt.format_waypoints(GOOD, version=1)
    position = good.index("25.00")  # the tens digit of waypoint 5's x
    drafted = good[:position] + "1" + good[position + 1:]
    settings = DecodeSettings(block_size=32, steps=32, threshold=0.5, max_new_tokens=96)
    vocab = bundle.model.get_output_embeddings().weight.shape[0]
    constraint = WaypointConstraint(tok, bundle.eos_token_id, settings.max_new_tokens, vocab, format_version=1)

    def run(check):
        ids = [tok.convert_tokens_to_ids(c) for c in drafted] + [bundle.eos_token_id]
        ids += [bundle.eos_token_id] * (settings.max_new_tokens - len(ids))
        engine = DecoderEngine(bundle.model, 256, "sdpa")
        source = Crafted(engine, vocab, ids, {position: tok.convert_tokens_to_ids("2")})

        def forward(block, commit=False):
            out = source(block)
            engine.forward_calls += 1
            engine.length += block.shape[0] if commit else 0
            return out

        def commit_and_step(clean, block):
            engine.length += clean.shape[0]
            engine.forward_calls += 1
            return source(block)

        engine.forward, engine.commit_and_step = forward, commit_and_step
        return decode_blocks_host(CachedBackend(engine), settings, bundle.mask_token_id, bundle.eos_token_id,
                                  constraint, check=check, rounds=2 if check else 0)

    plain = run(None)
    assert tok.decode(plain.tokens[:-1]) == drafted and plain.reflection is None
    result = run(check_for(tiny))
    assert tok.decode([t for t in result.tokens if t != bundle.eos_token_id]) == good
    assert result.reflection.edited == [4] and result.forward_calls == plain.forward_calls


def test_by_default_what_reflection_cannot_repair_is_the_fallback_and_unreflected_plans_are_only_flagged():
    """implausible_action defaults to fallback (measured, README Reflection). wamdiff-tiny from rest on the sample
    frame drafts x = 0, 0, 11, 12, 23, ... and reflection's two rounds leave a jump: the plan is invalid with the
    checker's reason. Without reflection, and in AR decoding, the same kind of plan is published flagged."""
    from wamdiff_ros.cli import load_rgb, sample_image_path

    assert DecodeSettings().implausible_action == "fallback"
    image, ego, route = load_rgb(sample_image_path()), EgoState((0.0, 0.0)), np.array([[10.0, 0.0], [30.0, 0.0]])
    plan = Planner.from_pretrained("wamdiff-tiny").plan(image, ego, "follow", route=route)
    assert plan.implausible and not plan.valid and plan.reason == plan.implausible
    drafted = Planner.from_pretrained("wamdiff-tiny", reflect=False).plan(image, ego, "follow", route=route)
    assert drafted.implausible and drafted.valid
    ar = Planner.from_pretrained("wamdiff-tiny", block_size=1)
    ar.decode_mode = "ar"
    answer = ar.plan(image, ego, "follow", route=route)
    assert answer.implausible and answer.valid and answer.stats.reflect_rounds == 0
