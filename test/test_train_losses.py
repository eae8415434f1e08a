"""Training losses against direct formulas on hand tensors, and the loss-position rule on real layouts."""

import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

try:
    import wamdiff_training  # noqa: F401
except ImportError:  # not installed: use the checkout's training/ folder
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "training"))

from wamdiff_ros.inputs import PromptInputs
from wamdiff_training import layout as lay
from wamdiff_training.losses import (
    forward_kl, jsd, masked_cross_entropy, reverse_kl, shifted_cross_entropy, token_accuracy,
)

IGNORE = lay.IGNORE
STUDENT = torch.tensor([[2.0, 0.5, -1.0, 0.0], [0.1, 0.2, 0.3, 0.4], [-3.0, 4.0, 1.0, 1.0]])
TEACHER = torch.tensor([[1.0, 1.0, 0.0, -2.0], [3.0, -1.0, 0.0, 0.5], [0.0, 0.0, 0.0, 0.0]])


def _p(logits, temperature=1.0):
    x = np.asarray(logits, dtype=np.float64) / temperature
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _kl(p, q):
    return (p * np.log(p / q)).sum(-1)


def _fake_prompt(length):
    ids = torch.arange(10, 10 + length)[None]
    return PromptInputs(ids, torch.zeros_like(ids, dtype=torch.int32), None, None)


def test_masked_cross_entropy_by_hand():
    labels = torch.tensor([0, IGNORE, 3])
    p = _p(STUDENT)
    want = -(np.log(p[0, 0]) + np.log(p[2, 3])) / 2
    assert masked_cross_entropy(STUDENT, labels).item() == pytest.approx(want, rel=1e-6)
    assert masked_cross_entropy(STUDENT, torch.full((3,), IGNORE)).item() == 0.0


def test_shifted_cross_entropy_is_the_next_token_loss():
    targets = torch.tensor([IGNORE, 1, 2])  # token-aligned: logit 0 predicts token 1, logit 1 predicts token 2
    p = _p(STUDENT)
    want = -(np.log(p[0, 1]) + np.log(p[1, 2])) / 2
    assert shifted_cross_entropy(STUDENT, targets).item() == pytest.approx(want, rel=1e-6)
    batched = shifted_cross_entropy(STUDENT[None].repeat(2, 1, 1), targets[None].repeat(2, 1))
    assert batched.item() == pytest.approx(want, rel=1e-6)


def test_ar_layout_labels_are_the_shifted_loss():
    layout = lay.ar_layout(_fake_prompt(4), torch.tensor([5, 6, 7]))
    logits = torch.randn(layout.length, 20, generator=torch.Generator().manual_seed(0))
    targets = layout.input_ids.clone()
    targets[:layout.prompt_len] = IGNORE
    a = shifted_cross_entropy(logits, targets)
    b = masked_cross_entropy(logits, layout.sequence_labels())
    c = masked_cross_entropy(logits[layout.scored], layout.labels)
    assert a.item() == pytest.approx(b.item(), rel=1e-6) and b.item() == pytest.approx(c.item(), rel=1e-6)


def test_loss_ignores_prompt_clean_and_unmasked_positions():
    answer = torch.arange(20, 33)
    masked = lay.sample_masked([13], 4, lay.NoiseConfig(0.2, 0.6), torch.Generator().manual_seed(1))[0]
    layout = lay.diffusion_layout(_fake_prompt(6), answer, masked, 4, 99)
    labels = layout.sequence_labels()
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(layout.length, 40, generator=gen, requires_grad=True)
    loss = masked_cross_entropy(logits, labels)
    loss.backward()
    unlabelled = labels == IGNORE
    assert int((~unlabelled).sum()) == int(masked.sum()) and bool(unlabelled[:6 + 13].all())
    assert logits.grad[unlabelled].abs().max().item() == 0.0
    assert logits.grad[~unlabelled].abs().min().item() > 0.0
    with torch.no_grad():
        noise = 100 * torch.randn(logits.shape, generator=gen) * unlabelled[:, None]
        assert masked_cross_entropy(logits + noise, labels).item() == loss.item()
        bumped = logits.clone()
        bumped[~unlabelled] += 5 * torch.randn(bumped[~unlabelled].shape, generator=gen)
        assert masked_cross_entropy(bumped, labels).item() != loss.item()
    # the same through the answer-aligned rows the forward returns
    assert masked_cross_entropy(logits[layout.scored], layout.labels).item() == pytest.approx(loss.item())


@pytest.mark.parametrize("temperature", [1.0, 2.0])
def test_divergences_match_direct_formulas(temperature):
    s, t = _p(STUDENT, temperature), _p(TEACHER, temperature)
    where = torch.tensor([True, False, True])
    pick = where.numpy()
    assert forward_kl(STUDENT, TEACHER, where, temperature).item() == pytest.approx(_kl(t, s)[pick].mean(), rel=1e-5)
    assert reverse_kl(STUDENT, TEACHER, where, temperature).item() == pytest.approx(_kl(s, t)[pick].mean(), rel=1e-5)
    for beta in (0.5, 0.2, 0.9):
        m = beta * t + (1 - beta) * s
        want = (beta * _kl(t, m) + (1 - beta) * _kl(s, m)).mean()
        assert jsd(STUDENT, TEACHER, None, beta, temperature).item() == pytest.approx(want, rel=1e-5)


def test_jsd_is_symmetric_zero_on_equal_inputs_and_bounded_by_ln2():
    assert jsd(STUDENT, TEACHER).item() == pytest.approx(jsd(TEACHER, STUDENT).item(), rel=1e-6)
    assert jsd(STUDENT, TEACHER, beta=0.2).item() != pytest.approx(jsd(TEACHER, STUDENT, beta=0.2).item(), rel=1e-3)
    for f in (jsd, forward_kl, reverse_kl):
        assert abs(f(STUDENT, STUDENT.clone()).item()) < 1e-6
    disjoint = torch.tensor([[60.0, -60.0, -60.0], [0.0, 0.0, -1e4]])
    swapped = torch.tensor([[-60.0, 60.0, -60.0], [-1e4, -1e4, 0.0]])
    value = jsd(disjoint, swapped).item()
    assert value <= math.log(2) + 1e-6 and value == pytest.approx(math.log(2), rel=1e-4)
    big = torch.randn(64, 50, generator=torch.Generator().manual_seed(0)) * 30
    assert jsd(big, big.flip(0)).item() <= math.log(2)


def test_divergences_detach_the_teacher_and_survive_masked_vocabulary():
    student = STUDENT.clone().requires_grad_(True)
    teacher = TEACHER.clone().requires_grad_(True)
    for f in (jsd, forward_kl, reverse_kl):
        student.grad = None
        f(student, teacher).backward()
        assert teacher.grad is None and student.grad.abs().sum() > 0
    held = TEACHER.clone()
    held[:, 3] = float("-inf")  # a token the teacher never predicts: 0 log 0 = 0, no nan
    t, s = _p(TEACHER[:, :3]), _p(STUDENT)[:, :3]
    assert forward_kl(STUDENT, held).item() == pytest.approx(_kl(t, s).mean(), rel=1e-5)
    assert math.isfinite(jsd(STUDENT, held).item())
    assert reverse_kl(STUDENT, held).item() == math.inf  # the student puts mass where the teacher has none
    assert jsd(STUDENT, TEACHER, torch.zeros(3, dtype=torch.bool)).item() == 0.0
    with pytest.raises(ValueError):
        jsd(STUDENT, TEACHER, beta=1.0)


def test_token_accuracy():
    labels = torch.tensor([0, IGNORE, 2])  # argmax rows: 0, 3, 1
    assert token_accuracy(STUDENT, labels) == 0.5
    assert math.isnan(token_accuracy(STUDENT, torch.full((3,), IGNORE)))
