"""The decode step's static buffers (issue 61): ``GraphRunner``'s step allocates nothing that scales with block x
vocabulary, and it answers exactly what the step of df7de97 answered (a masked copy of the logits and a softmax
made per step): the same tokens and the same confidences, bit for bit, on tiny-random (float32 and bfloat16),
wamdiff-tiny and the WAM-Diff2-layout folder with Qwen's 151,936-row vocabulary; the host loop agrees too. The
candidates option (``GraphRunner(candidates=k)``) keeps each position's top-k from the step that fixed it."""

import math

import numpy as np
import pytest
import torch
from conftest import scaled_tiny
from torch.profiler import ProfilerActivity, profile

from wamdiff_ros import format as fmt
from wamdiff_ros.bench.fixture import VOCAB_ROWS, write_fixture
from wamdiff_ros.decoding.ar import decode_ar, decode_ar_host
from wamdiff_ros.decoding.block import decode_blocks
from wamdiff_ros.decoding.engine import DecoderEngine, _linear_into
from wamdiff_ros.decoding.graphs import GraphRunner
from wamdiff_ros.decoding.host import CachedBackend, decode_blocks_host
from wamdiff_ros.decoding.settings import DecodeSettings
from wamdiff_ros.inputs import encode_prompt
from wamdiff_ros.model import load, tiny_random
from wamdiff_ros.planner import Planner


class TodaysRunner(GraphRunner):
    """The runner with df7de97's prediction: per step a masked copy of the logits and a softmax over it."""

    def _predict(self, logits, refused, no_mask=True, rows=None):
        if refused is not None:
            scores = logits.masked_fill(refused, float("-inf"))
        elif no_mask:
            scores = logits.index_fill(-1, self._no_mask, float("-inf"))
        else:
            scores = logits
        return torch.softmax(scores.float(), dim=-1).max(-1)


@pytest.fixture(scope="module")
def wam_bundle(tmp_path_factory):
    return load(str(write_fixture(tmp_path_factory.mktemp("wam") / "wam_diff2-small", "wam_diff2")))


def _bundle(name, wam_bundle):
    if name == "wam_diff2-small":
        return wam_bundle
    if name == "tiny-random-bf16":
        return tiny_random(dtype=torch.bfloat16)
    return scaled_tiny() if name == "tiny-random" else load(name)


def _prompt(bundle, image, command=fmt.Command.LEFT):
    return encode_prompt(bundle, fmt.plan_prompt(command, (6.2, 0.1), (0.3, -0.2)), image[::2, ::2])


def _capacity(prompt, settings):
    return 16 * math.ceil((prompt.length + settings.max_new_tokens + settings.block_size) / 16)


def _decode(runner_class, bundle, prompt, settings, grammar=None, **kwargs):
    engine = DecoderEngine(bundle.model, _capacity(prompt, settings))
    runner = runner_class(engine, bundle.mask_token_id, max_block=settings.block_size, check_every=1, **kwargs)
    runner.set_grammar(grammar)
    engine.prefill(prompt, bundle.meta.prompt_block_size)
    return decode_blocks(runner, settings, bundle.eos_token_id, ignore_eos=True)


@pytest.mark.parametrize("model", ["tiny-random", "tiny-random-bf16", "wamdiff-tiny", "wam_diff2-small"])
def test_the_step_answers_todays_tokens_and_confidences(model, wam_bundle, road_image):
    bundle = _bundle(model, wam_bundle)
    real_vocab = model == "wam_diff2-small"
    prompt = _prompt(bundle, road_image)
    cases = [DecodeSettings(block_size=32, steps=8, threshold=0.9, max_new_tokens=48, constrain=False)]
    if not real_vocab:  # the fixture's 151,936 columns cost seconds per block on this CPU
        cases.append(DecodeSettings(block_size=8, steps=3, schedule="static", max_new_tokens=40, constrain=False))
    for settings in cases:
        new = _decode(GraphRunner, bundle, prompt, settings)
        today = _decode(TodaysRunner, bundle, prompt, settings)
        assert new.tokens == today.tokens and new.confidence == today.confidence  # bit for bit
        assert new.steps_per_block == today.steps_per_block and new.forward_calls == today.forward_calls
        engine = DecoderEngine(bundle.model, _capacity(prompt, settings))
        engine.prefill(prompt, bundle.meta.prompt_block_size)
        host = decode_blocks_host(CachedBackend(engine), settings, bundle.mask_token_id, bundle.eos_token_id,
                                  ignore_eos=True)
        assert new.tokens == host.tokens
        np.testing.assert_allclose(new.confidence, host.confidence, rtol=0, atol=1e-6)
    if real_vocab:
        assert bundle.model.get_output_embeddings().weight.shape[0] == VOCAB_ROWS


@pytest.mark.parametrize("model", ["tiny-random", "wamdiff-tiny"])
def test_the_step_under_the_grammar_answers_todays_tokens(model, road_image):
    bundle = _bundle(model, None)
    planner = Planner(bundle, DecodeSettings(block_size=16, steps=4, max_new_tokens=112))
    assert planner._grammar is not None
    for command in (fmt.Command.LEFT, fmt.Command.FOLLOW):
        prompt = _prompt(bundle, road_image, command)
        new = _decode(GraphRunner, bundle, prompt, planner.settings, planner._grammar)
        today = _decode(TodaysRunner, bundle, prompt, planner.settings, planner._grammar)
        assert new.tokens == today.tokens and new.confidence == today.confidence


def test_predictions_equal_the_softmax_max_bit_for_bit_with_ties(wam_bundle):
    """``_predict`` on made-up logits: ties everywhere, rows all equal, grammar masks, the AR step's no exclusion;
    chunked (151,936 = 1187 x 128 columns) and plain (540, no chunk width divides it)."""
    gen = torch.Generator().manual_seed(0)
    for bundle in (wam_bundle, load("wamdiff-tiny")):
        runner = GraphRunner(DecoderEngine(bundle.model, 64), bundle.mask_token_id, max_block=32, candidates=4)
        vocab = runner.vocab
        assert (runner._chunk == 128) == (vocab == VOCAB_ROWS)
        no_mask = torch.tensor([bundle.mask_token_id])
        runner._scratch()
        for trial in range(12):
            n = int(torch.randint(1, 33, (1,), generator=gen))
            x = torch.randn(n, vocab, generator=gen) * (0.01 + 10 * float(torch.rand(1, generator=gen)))
            if trial % 3 == 0:
                x = (2 * x).round() / 2  # many exact ties
            if trial % 4 == 0:
                x[:] = x[:, :1]  # a whole row tied
            refused = torch.rand(n, vocab, generator=gen) > 0.3
            refused[:, 0] = False
            for masked, kwargs in ((x.index_fill(-1, no_mask, float("-inf")), {"refused": None}),
                                   (x.masked_fill(refused, float("-inf")), {"refused": refused}),
                                   (x, {"refused": None, "no_mask": False})):
                want = torch.softmax(masked, -1).max(-1)
                logits = x.clone()
                p, pred = runner._predict(logits, **kwargs)
                assert torch.equal(p, want.values) and torch.equal(pred, want.indices), trial
                some = torch.randperm(n, generator=gen)[: max(1, n // 3)].sort().values.tolist()
                runner._probs.zero_()  # only the rows asked for are computed
                p, pred = runner._predict(x.clone(), **kwargs, rows=some)
                assert torch.equal(p[some], want.values[some]) and torch.equal(pred[some], want.indices[some])
                runner._predict(x.clone(), **kwargs)
                assert torch.equal(logits, x)  # the logits keep their values ([MASK] column put back)
                softmax = torch.softmax(masked, -1)
                runner._top_candidates(n)
                tokens, probs = runner._cand_tokens[:n], runner._cand_probs[:n]
                assert torch.equal(probs, softmax.topk(4, -1).values)
                assert torch.equal(tokens[:, 0], pred) and torch.equal(softmax.gather(1, tokens), probs)
                assert (probs[:, 1:] <= probs[:, :-1]).all()


def _step_allocations(runner, steps: int) -> list[int]:
    """Bytes each op the steps ran allocated itself (CPU), from the profiler's memory records."""
    with torch.inference_mode(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        for _ in range(steps):
            runner.step()
    return [e.self_cpu_memory_usage for e in prof.events() if e.self_cpu_memory_usage > 0]


@pytest.mark.parametrize("constrained", [False, True], ids=["free", "grammar"])
def test_the_step_allocates_nothing_of_block_by_vocabulary(wam_bundle, road_image, constrained):
    bundle, n = wam_bundle, 32
    engine = DecoderEngine(bundle.model, 1024)
    prompt = _prompt(bundle, road_image)
    engine.prefill(prompt, bundle.meta.prompt_block_size)
    grammar = None
    if constrained:  # any per-position mask: the step's grammar ops at the real vocabulary
        grammar = torch.rand(n, bundle.model.get_output_embeddings().weight.shape[0]) > 0.5
        grammar[:, 0] = True
    full = n * VOCAB_ROWS * 4  # one (n, V) float32: 19.4 MB
    for runner_class, at_most in ((TodaysRunner, None), (GraphRunner, full // 20)):
        runner = runner_class(engine, bundle.mask_token_id, max_block=n, check_every=1)
        runner.set_grammar(grammar)
        runner.set_unmask("threshold", 8, 0.9)
        engine.length = prompt.length
        with torch.inference_mode():
            runner.start_block(n)
            runner.step()  # warm
        buffers = {runner._logits.data_ptr(), runner._probs.data_ptr()}
        allocated = _step_allocations(runner, 3)
        if at_most is None:  # df7de97's step: a (n, V) copy and a softmax per step, and the LM head's logits
            assert max(allocated) >= full
            continue
        # the layers' activations and attention (a few hundred KB a step here); no op makes even a vocabulary row
        assert sum(allocated) <= 3 * at_most and max(allocated) < VOCAB_ROWS, (sum(allocated), max(allocated))
        assert {runner._logits.data_ptr(), runner._probs.data_ptr()} == buffers
        with torch.inference_mode():
            assert runner.step().data_ptr() == runner._logits.data_ptr()  # the step's logits are the static buffer


def test_the_ar_step_answers_todays_tokens(road_image):
    """The AR graph's step (eager here) through the same prediction, no [MASK] exclusion: df7de97's answer bit for
    bit, and the host loop's tokens (its eager attention rounds differently from the graph-safe one)."""
    bundle = scaled_tiny()
    prompt = _prompt(bundle, road_image)
    answers = []
    for runner_class in (GraphRunner, TodaysRunner):
        runner = runner_class(DecoderEngine(bundle.model, 256), bundle.mask_token_id, max_block=8)
        answers.append(decode_ar(runner, runner.engine.prefill(prompt, 1), 30, bundle.eos_token_id, ignore_eos=True))
    new, today = answers
    assert new.tokens == today.tokens and new.confidence == today.confidence
    engine = DecoderEngine(bundle.model, 256)
    host = decode_ar_host(engine, engine.prefill(prompt, 1), 30, bundle.eos_token_id, ignore_eos=True)
    assert new.tokens == host.tokens
    np.testing.assert_allclose(new.confidence, host.confidence, rtol=0, atol=1e-5)


@pytest.mark.parametrize("schedule", ["threshold", "static"])
def test_candidates_are_the_top_k_of_the_step_that_fixed_each_token(road_image, schedule):
    bundle = scaled_tiny()
    prompt = _prompt(bundle, road_image)
    settings = DecodeSettings(block_size=16, steps=6, threshold=0.9, schedule=schedule, max_new_tokens=16,
                              constrain=False)
    plain = _decode(GraphRunner, bundle, prompt, settings)
    engine = DecoderEngine(bundle.model, _capacity(prompt, settings))
    runner = GraphRunner(engine, bundle.mask_token_id, max_block=16, check_every=1, candidates=3)
    engine.prefill(prompt, bundle.meta.prompt_block_size)
    runner.set_unmask(settings.schedule, settings.steps, settings.threshold)
    with torch.inference_mode():
        runner.start_block(16)
        conf_per_step = []
        for _ in range(settings.steps):
            runner.step()
            conf_per_step.append(runner._prob[:16].clone())
        tokens, conf = runner.finish_block()
        cand, probs = runner.block_candidates()
    assert tokens.tolist() == plain.tokens  # candidates change nothing
    assert cand.shape == probs.shape == (16, 3) and cand.dtype == torch.long and probs.dtype == torch.float32
    assert torch.equal(cand[:, 0], tokens)  # candidate 0 is the token the block answers
    assert torch.equal(probs[:, 0], conf)  # with the probability it was fixed at
    assert (probs[:, 1:] <= probs[:, :-1]).all() and (probs >= 0).all() and (probs.sum(-1) <= 1 + 1e-6).all()
    assert len(set(cand[0].tolist())) == 3
    left = runner._masked[:16]
    if left.any():  # leftovers: the last step's candidates
        assert torch.equal(probs[left, 0], conf_per_step[-1][left])
    with pytest.raises(RuntimeError, match="candidates > 0"):
        GraphRunner(engine, bundle.mask_token_id, max_block=16).block_candidates()


def test_the_lm_head_into_a_buffer_is_f_linear_bit_for_bit(wam_bundle):
    """``run_planned(out=)``'s LM head: on the CPU 8192 vocabulary columns per matmul, written in place; the same
    logits as ``F.linear`` for any number of rows (the AR step's one included)."""
    head = wam_bundle.model.lm_head
    gen = torch.Generator().manual_seed(1)
    for n in (1, 2, 3, 5, 17, 32):
        x = torch.randn(n, head.weight.shape[1], generator=gen)
        out = torch.full((32, head.weight.shape[0]), float("nan"))
        with torch.inference_mode():
            got = _linear_into(out[:n], x, head)
            want = torch.nn.functional.linear(x, head.weight, head.bias)
        assert got.data_ptr() == out.data_ptr() and torch.equal(got, want), n


def test_the_prefill_computes_logits_for_the_last_position_only(wam_bundle, road_image):
    bundle = wam_bundle
    prompt = _prompt(bundle, road_image)
    rows = []
    hook = bundle.model.lm_head.register_forward_hook(lambda module, args, out: rows.append(out.shape[:-1]))
    try:
        logits = DecoderEngine(bundle.model, 1024).prefill(prompt, bundle.meta.prompt_block_size)
    finally:
        hook.remove()
    assert prompt.length > 100 and rows == [torch.Size([1, 1])] and logits.shape == (VOCAB_ROWS,)
