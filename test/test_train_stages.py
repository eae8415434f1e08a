"""The three training stages' losses: block adaptation (+ curriculum, label switch), block-wise distillation
(teacher scoring rule, on-policy states against the real decoder), cross-scale distillation (AR alignment)."""

import copy
import dataclasses
import math
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import yaml

try:
    import wamdiff_training  # noqa: F401
except ImportError:  # not installed: use the checkout's training/ folder
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "training"))

from wamdiff_ros import format as fmt
from wamdiff_ros.bench.reference import FullSequenceBackend
from wamdiff_ros.decoding.host import decode_blocks_host
from wamdiff_ros.decoding.settings import DecodeSettings
from wamdiff_ros.inputs import encode_prompt
from wamdiff_ros.model import DecodeMeta, tiny_random
from wamdiff_training import config as cfg
from wamdiff_training import layout as lay
from wamdiff_training import losses
from wamdiff_training.data import Sample, encode_answer
from wamdiff_training.stages import adapt, cross_scale, distill
from wamdiff_training.stages.common import NoisyState, Rollout, prompt_inputs, rollout_states

LOGIT_TOL = 1e-4  # fp32 training forward vs the reference decoder; observed ~1e-6
CONFIGS = Path(__file__).resolve().parents[1] / "training" / "configs"


def _sample(bundle, name: str, answer: str, image=None) -> Sample:
    prompt = encode_prompt(bundle, fmt.plan_prompt(fmt.Command.LEFT, (6.2, 0.1), (0.3, -0.2)), image)
    return Sample(name, "plan", prompt.input_ids[0], prompt.mm_token_type_ids[0], prompt.pixel_values,
                  prompt.image_grid_thw, encode_answer(bundle, answer))


@pytest.fixture(scope="module")
def samples(tiny_bundle, road_image):
    rng = np.random.default_rng(0)
    return [_sample(tiny_bundle, "img", fmt.format_waypoints(rng.uniform(-20, 40, (8, 2))), road_image[::2, ::2]),
            _sample(tiny_bundle, "text", "car:120,340,560,780")]


def _ids(bundle) -> dict:
    return {"mask_token_id": bundle.mask_token_id, "pad_id": bundle.eos_token_id}


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _split_seed(n: int = 2) -> int:
    """A seed whose first draw puts sample 0 on-policy and sample 1 randomly masked (at on_policy = 0.5)."""
    return next(s for s in range(100) if (torch.rand(n, generator=_gen(s)) < 0.5).tolist() == [True, False])


# -- Stage I ---------------------------------------------------------------------------------------------------------


def test_adapt_loss_is_masked_cross_entropy_on_the_hand_built_layout(tiny_bundle, samples):
    noise = lay.NoiseConfig(0.2, 0.8)
    stage = adapt.AdaptStage(8, **_ids(tiny_bundle), noise=noise, generator=_gen(3))
    loss, metrics = stage.loss(tiny_bundle.model, samples, 0)
    answers = [lay.pad_to_blocks(s.answer_ids, 8, tiny_bundle.eos_token_id) for s in samples]
    masked = lay.sample_masked([len(a) for a in answers], 8, noise, _gen(3))
    by_hand = [lay.diffusion_layout(prompt_inputs(s), a, m, 8, tiny_bundle.mask_token_id, 8)
               for s, a, m in zip(samples, answers, masked)]
    with torch.no_grad():
        out = lay.forward_layouts(tiny_bundle.model, by_hand, pad_id=tiny_bundle.eos_token_id)
    assert float(loss.detach()) == pytest.approx(float(losses.masked_cross_entropy(out.logits, out.labels)), abs=1e-6)
    assert metrics["weight"] == sum(int(m.sum()) for m in masked)
    assert 0 <= metrics["accuracy"] <= 1 and 0 < metrics["masked_share"] <= 1


def test_adapt_gradient_comes_only_from_masked_noisy_positions(samples):
    bundle = tiny_random(seed=3)
    stage = adapt.AdaptStage(8, **_ids(bundle), generator=_gen(1))
    seen = []

    def keep(module, args, out) -> None:  # the final hidden states, every position's
        out.retain_grad()
        seen.append(out)

    handle = bundle.model.model.language_model.norm.register_forward_hook(keep)
    try:
        loss, _ = stage.loss(bundle.model, samples[:1], 0)
        loss.backward()
    finally:
        handle.remove()
    stage.generator = _gen(1)  # the generator moved on: rebuild the masks it drew
    layout = stage.layouts(samples[:1])[0]
    grad = seen[0].grad[0, :layout.length].abs().sum(-1)
    loss_rows = layout.scored[layout.labels != lay.IGNORE]
    assert bool((grad[loss_rows] > 0).all())
    rest = torch.ones(layout.length, dtype=torch.bool)
    rest[loss_rows] = False  # the prompt, the clean copy and the unmasked noisy tokens
    assert float(grad[rest].max()) == 0.0


class _Runner(torch.nn.Module):
    """The engine's protocol: ``runner(fn)`` runs ``fn(hf_model)`` as its forward (so DDP / FSDP2 hooks fire)."""

    def __init__(self, model) -> None:
        super().__init__()
        self.model = model

    def forward(self, fn):
        return fn(self.model)


def test_stages_run_through_the_engines_runner(tiny_bundle, samples):
    teacher = distill.DiffusionTeacher(tiny_random(seed=1).model, 4, 4, tiny_bundle.eos_token_id)
    for make in (lambda: adapt.AdaptStage(8, **_ids(tiny_bundle), generator=_gen(0)),
                 lambda: distill.DistillStage(teacher, 8, **_ids(tiny_bundle), rollout=Rollout(max_steps=2),
                                              generator=_gen(_split_seed()))):
        with torch.no_grad():
            plain, _ = make().loss(tiny_bundle.model, samples, 0)
            wrapped, _ = make().loss(_Runner(tiny_bundle.model), samples, 0)
        assert float(wrapped) == float(plain)


def test_stages_save_block_diffusion_metadata(tiny_bundle):
    base = DecodeMeta(prediction="next_token", trained_block_size=1, prompt_attention="causal")
    meta = adapt.AdaptStage(8, **_ids(tiny_bundle)).decode_meta(base)
    assert (meta.prediction, meta.trained_block_size, meta.prompt_attention) == ("in_place", 8, "block_causal")
    assert meta.prompt_block_size == 8
    causal = adapt.AdaptStage(16, **_ids(tiny_bundle), prompt_attention="causal")
    assert causal.prompt_block_size == 1 and causal.decode_meta(base).prompt_attention == "causal"
    teacher = distill.DiffusionTeacher(tiny_random(seed=1).model, 8, 8)
    for stage in (distill.DistillStage(teacher, 32, **_ids(tiny_bundle)),
                  cross_scale.CrossScaleStage(teacher, 32, **_ids(tiny_bundle))):
        meta = stage.decode_meta(base)
        assert (meta.prediction, meta.trained_block_size, meta.prompt_attention) == ("in_place", 32, "block_causal")
    assert cross_scale.CrossScaleStage(teacher, 32, **_ids(tiny_bundle)).name == "cross-scale"
    with pytest.raises(ValueError):
        adapt.AdaptStage(8, **_ids(tiny_bundle), prompt_attention="sideways")


def test_curriculum_plan_initialises_each_phase_from_its_predecessor(tmp_path):
    plan = adapt.curriculum(steps_per_stage=[10, 20, 30, 40, 50])
    assert [p.block_size for p in plan] == [1, 4, 8, 16, 32] and len(plan) == 5
    assert [p.steps for p in plan] == [10, 20, 30, 40, 50]
    assert [p.init_from for p in plan] == [None, 0, 1, 2, 3]
    assert plan.init_for(plan[0], tmp_path, "ar-ckpt") == "ar-ckpt"
    (tmp_path / "b04" / "checkpoints").mkdir(parents=True)
    (tmp_path / "b04" / "checkpoints" / "latest").write_text("step-000020\n")
    assert plan.init_for(plan[2], tmp_path, "ar-ckpt") == str(tmp_path / "b04" / "checkpoints" / "step-000020")
    assert plan.overrides(plan[2], tmp_path, "ar-ckpt") == [
        "adapt.block_size=8", "train.steps=30", f"model.init={tmp_path / 'b04' / 'checkpoints' / 'step-000020'}",
        f"out.dir={tmp_path / 'b08'}"]
    assert [p.steps for p in adapt.curriculum((1, 4), 7)] == [7, 7]
    bad_plans = (dict(block_sizes=(4, 1)), dict(block_sizes=(0, 4)),
                 dict(block_sizes=(1, 4), steps_per_stage=[1, 2, 3]))
    for bad in bad_plans:
        with pytest.raises(ValueError):
            adapt.curriculum(**bad)


def test_label_switch_scores_the_same_answer_tokens_both_ways(tiny_bundle, samples):
    switch = adapt.measure_label_switch(tiny_bundle.model, samples, tiny_bundle.mask_token_id,
                                        tiny_bundle.eos_token_id)
    assert switch.tokens == sum(len(s.answer_ids) for s in samples)
    values = (switch.shifted_loss, switch.in_place_loss, switch.shifted_accuracy, switch.in_place_accuracy)
    assert all(math.isfinite(v) for v in values)
    assert switch.cost == pytest.approx(switch.in_place_loss - switch.shifted_loss)
    s = samples[1]  # the shifted side by hand: a plain causal forward, logit i-1 -> token i
    ids = torch.cat([s.prompt_ids, s.answer_ids])[None]
    with torch.no_grad():
        logits = tiny_bundle.model(input_ids=ids, mm_token_type_ids=torch.zeros_like(ids, dtype=torch.int32)).logits
    targets = torch.cat([torch.full_like(s.prompt_ids, lay.IGNORE), s.answer_ids])[None]
    one = adapt.measure_label_switch(tiny_bundle.model, [s], tiny_bundle.mask_token_id, tiny_bundle.eos_token_id)
    assert one.shifted_loss == pytest.approx(float(losses.shifted_cross_entropy(logits, targets)), abs=1e-5)


def test_ar_in_place_weight_adds_stage_one_b1_loss_to_the_unchanged_next_token_loss(tiny_bundle, samples):
    """ar.in_place_weight: one forward over the B = 1 in-place layout gives the plain AR loss (its clean copy) plus
    the weighted loss Stage I's B = 1 phase trains (every token masked: B = 1 masks a block with rate t < 1, so the
    all-masked layout is measured against the label switch's in-place side)."""
    from wamdiff_training.stages.ar import ArStage

    def stage(weight: float) -> ArStage:
        return ArStage(cfg.from_dict({"data": {"train": ["x.json"]}, "ar": {"in_place_weight": weight}}), tiny_bundle)

    with torch.no_grad():
        plain, plain_metrics = stage(0.0).loss(_Runner(tiny_bundle.model), samples, 0)
        joint, metrics = stage(0.5).loss(_Runner(tiny_bundle.model), samples, 0)
    switch = adapt.measure_label_switch(tiny_bundle.model, samples, **_ids(tiny_bundle))
    assert metrics["next_token_loss"] == pytest.approx(float(plain), abs=1e-5)
    assert metrics["accuracy"] == plain_metrics["accuracy"] and metrics["weight"] == plain_metrics["weight"]
    assert metrics["in_place_loss"] == pytest.approx(switch.in_place_loss, abs=1e-5)
    assert metrics["in_place_accuracy"] == pytest.approx(switch.in_place_accuracy)
    assert float(joint) == pytest.approx(float(plain) + 0.5 * switch.in_place_loss, abs=1e-5)
    model = copy.deepcopy(tiny_bundle.model)
    loss, _ = stage(1.0).loss(_Runner(model), samples, 0)
    loss.backward()  # the in-place term reaches the [MASK] embedding, which next-token training never sees
    mask_grad = model.get_input_embeddings().weight.grad[tiny_bundle.mask_token_id]
    assert float(mask_grad.abs().sum()) > 0
    with pytest.raises(cfg.ConfigError, match=r"ar\.in_place_weight: must be finite and >= 0"):
        stage(-1.0)


# -- Stage II: states and the teacher ----------------------------------------------------------------------------------


def test_teacher_scores_a_large_block_state_under_its_own_blocks_with_clean_context(tiny_bundle, samples):
    teacher_model, student_block, teacher_block = tiny_random(seed=1).model, 16, 4
    sample = samples[0]
    prompt = prompt_inputs(sample)
    answer = lay.pad_to_blocks(sample.answer_ids, student_block, tiny_bundle.eos_token_id)
    noisy = answer.clone()
    g = _gen(0)
    noisy[torch.rand(len(answer), generator=g) < 0.4] = tiny_bundle.mask_token_id
    wrong = (torch.rand(len(answer), generator=g) < 0.3) & (noisy != tiny_bundle.mask_token_id)
    noisy[wrong] = answer.roll(1)[wrong]  # committed tokens that are not the ground truth (as on-policy)
    state = NoisyState(prompt, answer, noisy, tiny_bundle.mask_token_id)
    teacher = distill.DiffusionTeacher(teacher_model, teacher_block, prompt_block_size=teacher_block)
    got = teacher.logits([state])
    reference = FullSequenceBackend(teacher_model, prompt, teacher_block, teacher_block)
    rejected = 0.0
    for start in range(0, 2 * student_block, teacher_block):
        stop = start + teacher_block
        want = reference.logits(torch.cat([answer[:start], noisy[start:stop]]))[-teacher_block:]
        assert (want - got[start:stop]).abs().max().item() < LOGIT_TOL, start
        first = start - start % student_block  # the other rule: the student's noisy tokens before, in its block
        other = reference.logits(torch.cat([answer[:first], noisy[first:stop]]))[-teacher_block:]
        rejected = max(rejected, (other - got[start:stop]).abs().max().item())
    assert rejected > 1e-3  # the two rules differ, so the check above tells them apart


@pytest.mark.parametrize("schedule,steps", [("threshold", 8), ("static", 4)])
def test_on_policy_state_is_the_decoders_own_partially_denoised_block(scaled_bundle, samples, schedule, steps):
    bundle, block, k = scaled_bundle, 8, 3
    sample = samples[0]
    prompt = prompt_inputs(sample)
    answer = lay.pad_to_blocks(sample.answer_ids, block, bundle.eos_token_id)
    rollout = Rollout(threshold=0.9, schedule=schedule, steps=steps, max_steps=k)
    state = rollout_states(bundle.model, [prompt], [answer], block, bundle.mask_token_id, block, rollout,
                           lay.NoiseConfig(0.0, 0.0), bundle.eos_token_id)[0]
    assert state.on_policy and len(state.steps) == len(answer) // block
    settings = DecodeSettings(block_size=block, steps=steps, threshold=0.9, schedule=schedule,
                              max_new_tokens=block, constrain=False)
    own = several = 0
    for b in range(len(state.steps)):
        start = b * block
        backend = FullSequenceBackend(bundle.model, prompt, block, block)
        backend.committed = answer[:start].tolist()
        traces = []
        decode_blocks_host(backend, settings, bundle.mask_token_id, bundle.eos_token_id, ignore_eos=True,
                      on_step=traces.append)
        ran = int(state.steps[b])
        got = state.noisy[start:start + block]
        want = traces[ran - 1].block if ran else torch.full_like(got, bundle.mask_token_id)
        assert torch.equal(got, want.cpu()), (b, ran)
        assert bool((got == bundle.mask_token_id).any())  # never a finished block
        if ran < k:  # stopped early: the decoder's next step would have finished the block
            assert not bool((traces[ran].block == bundle.mask_token_id).any())
        fixed = got != bundle.mask_token_id
        own += int((got[fixed] != answer[start:start + block][fixed]).sum())
        several += int(fixed.sum()) > ran
    assert own > 0  # the committed tokens are the student's, not the ground truth
    assert several > 0  # some step fixed several tokens (the rule, not one token per step)


def test_on_policy_rollout_stops_at_the_drawn_mask_rate(scaled_bundle, samples):
    bundle, block = scaled_bundle, 8
    answer = lay.pad_to_blocks(samples[0].answer_ids, block, bundle.eos_token_id)
    state = rollout_states(bundle.model, [prompt_inputs(samples[0])], [answer], block, bundle.mask_token_id, block,
                           Rollout(max_steps=8), lay.NoiseConfig(0.5, 0.5), bundle.eos_token_id)[0]
    share = state.masked.view(-1, block).float().mean(-1)
    assert bool((share > 0).all())  # never finished
    # at the drawn rate, or stopped early because the next step would finish the block (then the decoder really
    # visits no state in between; the all-[MASK] one when it finishes a block in one step)
    assert bool(((share <= 0.5) | (state.steps < 8)).all())
    assert bool(((share <= 0.5) & (state.steps >= 1)).any())


# -- Stage II: the loss ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["jsd", "fkl", "rkl"])
def test_teacher_equal_to_student_gives_zero_loss_and_zero_gradient(samples, name):
    student = tiny_random(seed=5)
    teacher = distill.DiffusionTeacher(copy.deepcopy(student.model), 8, 8, student.eos_token_id)
    stage = distill.DistillStage(teacher, 8, **_ids(student), divergence=name, on_policy=0.5,
                                 rollout=Rollout(max_steps=2), generator=_gen(_split_seed()))
    loss, metrics = stage.loss(student.model, samples, 0)
    assert metrics["on_policy"] == 0.5 and metrics["weight"] > 0
    loss.backward()
    assert abs(float(loss.detach())) < 1e-6
    grads = [p.grad.abs().max().item() for p in student.model.parameters() if p.grad is not None]
    assert grads and max(grads) < 1e-5


def _drop(logits: torch.Tensor, column: int) -> torch.Tensor:
    return torch.cat([logits[:, :column], logits[:, column + 1:]], 1)


def test_divergences_are_selectable_and_computed_on_the_masked_positions(tiny_bundle, samples):
    student, teacher_model = tiny_bundle.model, tiny_random(seed=2).model
    teacher = distill.DiffusionTeacher(teacher_model, 4, 4, tiny_bundle.eos_token_id)
    seed, mask = _split_seed(), tiny_bundle.mask_token_id
    fns = {"jsd": losses.jsd, "fkl": losses.forward_kl, "rkl": losses.reverse_kl}
    values = {}
    for name, fn in fns.items():
        stage = distill.DistillStage(teacher, 8, **_ids(tiny_bundle), divergence=name, ce_weight=0.5,
                                     rollout=Rollout(max_steps=2), generator=_gen(seed))
        with torch.no_grad():
            loss, metrics = stage.loss(student, samples, 0)
            stage.generator = _gen(seed)
            states = stage.states(student, samples)
            s = lay.forward_layouts(student, [x.layout(8, 8) for x in states], pad_id=tiny_bundle.eos_token_id)
            t = lay.forward_layouts(teacher_model, [x.layout(4, 4) for x in states], pad_id=tiny_bundle.eos_token_id)
        where = s.labels != lay.IGNORE
        assert torch.equal(where, torch.cat([x.masked for x in states]))
        div = float(fn(_drop(s.logits[where], mask), _drop(t.logits[where], mask)))
        ce = float(losses.masked_cross_entropy(s.logits, s.labels))
        assert metrics["divergence"] == pytest.approx(div, rel=1e-5) and metrics["ce"] == pytest.approx(ce, rel=1e-5)
        assert float(loss) == pytest.approx(div + 0.5 * ce, rel=1e-5)
        values[name] = div
    assert 0 < values["jsd"] <= math.log(2) and len({round(v, 6) for v in values.values()}) == 3
    with pytest.raises(ValueError):
        distill.DistillStage(teacher, 8, **_ids(tiny_bundle), divergence="wasserstein")


# -- Stage III ---------------------------------------------------------------------------------------------------------


def test_ar_teacher_is_aligned_at_i_minus_1(tiny_bundle, samples):
    ar_model = tiny_random(seed=4).model
    stage = cross_scale.CrossScaleStage(cross_scale.ARTeacher(ar_model, 1, tiny_bundle.eos_token_id), 8,
                                        **_ids(tiny_bundle), on_policy=0.0, generator=_gen(0))
    with torch.no_grad():
        loss, _ = stage.loss(tiny_bundle.model, samples, 0)
        stage.generator = _gen(0)
        states = stage.states(tiny_bundle.model, samples)
        got = stage.teacher_logits(states).split([len(x.answer) for x in states])
        student = lay.forward_layouts(tiny_bundle.model, [x.layout(8, 8) for x in states],
                                      pad_id=tiny_bundle.eos_token_id)
        aligned, shifted = [], []
        for state, rows, sample in zip(states, got, samples):
            length, n = state.prompt.length, len(state.answer)
            ids = torch.cat([state.prompt.input_ids[0], state.answer])[None]
            types = torch.cat([state.prompt.mm_token_type_ids[0], torch.zeros(n, dtype=torch.int32)])[None]
            plain = ar_model(input_ids=ids, mm_token_type_ids=types, pixel_values=sample.pixel_values,
                             image_grid_thw=sample.image_grid_thw).logits[0]
            assert (plain[length - 1:length + n - 1] - rows).abs().max().item() < LOGIT_TOL
            assert (plain[length:length + n] - rows).abs().max().item() > 1e-2  # one row later: not the teacher's
            aligned.append(plain[length - 1:length + n - 1])
            shifted.append(plain[length:length + n])
    where = student.labels != lay.IGNORE
    mask = tiny_bundle.mask_token_id
    want = float(losses.jsd(_drop(student.logits[where], mask), _drop(torch.cat(aligned)[where], mask)))
    off_by_one = float(losses.jsd(_drop(student.logits[where], mask), _drop(torch.cat(shifted)[where], mask)))
    assert float(loss) == pytest.approx(want, rel=1e-5) and off_by_one != pytest.approx(want, rel=1e-3)


def test_cross_scale_takes_a_larger_teacher_of_either_kind(samples):
    student = tiny_random(seed=6, hidden=64, layers=2)
    big = tiny_random(seed=7, meta=DecodeMeta(trained_block_size=8))
    ar = tiny_random(seed=8, meta=DecodeMeta(prediction="next_token", trained_block_size=1, prompt_attention="causal"))
    assert isinstance(cross_scale.make_teacher(big, "auto", big.eos_token_id), distill.DiffusionTeacher)
    assert isinstance(cross_scale.make_teacher(ar, "auto", ar.eos_token_id), cross_scale.ARTeacher)
    for loaded, kind in ((ar, "diffusion"), (big, "ar"), (big, "sideways")):
        with pytest.raises(ValueError):
            cross_scale.make_teacher(loaded, kind, loaded.eos_token_id)
    for loaded in (big, ar):
        teacher = cross_scale.make_teacher(loaded, "auto", loaded.eos_token_id)
        stage = cross_scale.CrossScaleStage(teacher, 8, **_ids(student), rollout=Rollout(max_steps=2),
                                            generator=_gen(_split_seed()))
        loss, metrics = stage.loss(student.model, samples, 0)
        loss.backward()
        value = float(loss.detach())
        assert math.isfinite(value) and value > 0 and metrics["on_policy"] == 0.5
        assert all(p.grad is None for p in loaded.model.parameters())
    assert student.model.lm_head.weight.grad is not None


def _stage(kind: str, bundle):
    if kind == "adapt":
        return adapt.AdaptStage(8, **_ids(bundle))
    teacher = distill.DiffusionTeacher(tiny_random(seed=10).model, 4, 4, bundle.eos_token_id)
    make = distill.DistillStage if kind == "distill" else cross_scale.CrossScaleStage
    if kind == "cross-scale":
        teacher = cross_scale.ARTeacher(tiny_random(seed=11).model, 1, bundle.eos_token_id)
    return make(teacher, 8, **_ids(bundle), rollout=Rollout(max_steps=2))


@pytest.mark.parametrize("kind", ["adapt", "distill", "cross-scale"])
def test_a_few_steps_reduce_each_stages_loss_on_a_fixed_batch(samples, kind):
    bundle = tiny_random(seed=9)
    stage = _stage(kind, bundle)
    optimizer = torch.optim.Adam([p for p in bundle.model.parameters() if p.requires_grad], lr=3e-3)

    def run(train: bool) -> float:
        stage.generator = _gen(0)  # the same masks (and on/off-policy draws) every time: a fixed batch
        loss, _ = stage.loss(bundle.model, samples, 0)
        if train:
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        return float(loss.detach())

    before = run(False)
    for _ in range(8):
        run(True)
    assert run(False) < 0.8 * before


# -- configs -----------------------------------------------------------------------------------------------------------

SECTIONS = {"adapt": cfg.AdaptSection, "distill": cfg.DistillSection, "cross_scale": cfg.CrossScaleSection}
FACTORIES = {"adapt": adapt.from_config, "distill": distill.from_config, "cross_scale": cross_scale.from_config}


@pytest.mark.parametrize("name", ["tiny_adapt", "tiny_distill", "tiny_cross_scale", "paper_adapt_2b",
                                  "paper_distill_2b", "paper_cross_scale_8b_to_2b"])
def test_configs_parse_and_tiny_ones_build_their_stage(tiny_bundle, name):
    path = CONFIGS / f"{name}.yaml"
    raw = yaml.safe_load(path.read_text())
    key = next(k for k in SECTIONS if k in raw)
    section = getattr(cfg.from_dict(raw, str(path)), key)
    assert isinstance(section, SECTIONS[key])
    if name.startswith("tiny"):
        stage = FACTORIES[key](SimpleNamespace(**{key: section}), tiny_bundle)
        assert stage.decode_meta(tiny_bundle.meta).prediction == "in_place"
    if name == "tiny_cross_scale":  # the AR-teacher ablation from the same file
        ar = dataclasses.replace(section, teacher_kind="ar")
        assert isinstance(cross_scale.from_config(SimpleNamespace(cross_scale=ar), tiny_bundle).teacher,
                          cross_scale.ARTeacher)
