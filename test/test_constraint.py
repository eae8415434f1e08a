"""The planning grammar constraint on its own: any unmasking order, any logits, any tokenizer -> a parse."""

import numpy as np
import pytest
import torch

from wamdiff_ros import format as fmt
from wamdiff_ros.decoding.constraint import WaypointConstraint
from wamdiff_ros.decoding.unmask import tokens_per_step, unmask_top_k
from wamdiff_ros.errors import DecodeSettingsError
from wamdiff_ros.tiny import tiny_tokenizer


class MergingVocab:
    """A vocabulary shaped like Qwen's around numbers: multi-character tokens that straddle numbers (",-", "5,"),
    a few words, and an EOS. Only ``decode`` and ``len`` are used by the constraint."""

    def __init__(self) -> None:
        self.pieces = list("0123456789.,-") + [",-", ".0", "00", "5,", "-1", "12", " 1", "car", "a", "<|im_end|>"]

    def __len__(self) -> int:
        return len(self.pieces)

    def decode(self, ids: list[int]) -> str:
        return "".join(self.pieces[i] for i in ids)


def _decode(constraint, vocab: int, eos: int, block: int, steps: int, max_new: int, seed: int) -> list[int]:
    """Block decoding driven by random logits: static top-k picks, vetted by the constraint."""
    gen = torch.Generator().manual_seed(seed)
    tokens: list[int] = []
    states = constraint.start_state
    mask_id = vocab  # outside the vocabulary: never a grammar token
    while len(tokens) < max_new:
        n = min(block, max_new - len(tokens))
        view = constraint.fresh_view(states, n, len(tokens))
        current = torch.full((n,), mask_id)
        masked = torch.ones(n, dtype=torch.bool)
        for k in tokens_per_step(n, steps):
            logits = torch.randn(n, vocab + 1, generator=gen) * 4
            p, prediction, grammar_logits = view.decide(logits)
            select, after = view.choose(unmask_top_k(p, masked, k))
            assert select.any() and after.feasible  # the kept fixes still leave a way to a complete answer
            current = torch.where(select, prediction, current)
            masked &= ~select
            view = after
        if masked.any():
            current, _ = view.fill(current, grammar_logits)
        tokens += current.tolist()
        states = constraint.advance(states, current.tolist())
        if eos in current.tolist():
            break
    return tokens


@pytest.mark.parametrize("version", fmt.FORMAT_VERSIONS)
@pytest.mark.parametrize("block, steps", [(1, 1), (4, 2), (8, 8), (32, 4), (32, 1), (128, 3)])
def test_random_logits_always_parse_tiny_tokenizer(block, steps, version):
    tok = tiny_tokenizer()
    eos = tok.convert_tokens_to_ids(fmt.CHAT_END)
    constraint = WaypointConstraint(tok, eos, 128, format_version=version)
    for seed in range(5):
        tokens = _decode(constraint, len(tok), eos, block, steps, 128, seed)
        text = tok.decode(tokens)
        parsed = fmt.parse_waypoints(text)
        assert parsed.valid, (parsed.reason, text)
        assert eos in tokens
        if version == 3:  # every number in its version's width, whatever order the positions were filled in
            assert fmt.waypoint_text_version(text) == version, text


@pytest.mark.parametrize("version", fmt.FORMAT_VERSIONS)
@pytest.mark.parametrize("block, steps", [(4, 4), (16, 2), (32, 4)])
def test_random_logits_always_parse_with_merged_number_tokens(block, steps, version):
    vocab = MergingVocab()
    eos = len(vocab) - 1
    constraint = WaypointConstraint(vocab, eos, 128, format_version=version)
    for seed in range(5):
        tokens = _decode(constraint, len(vocab), eos, block, steps, 128, seed)
        text = vocab.decode(tokens[: tokens.index(eos)])
        assert fmt.parse_waypoints(text).valid
        assert version == 1 or fmt.waypoint_text_version(text) == version
    # tokens outside the grammar never get a signature; merged numeric pieces do
    assert constraint.token_sig[vocab.pieces.index("car")] < 0 and constraint.token_sig[vocab.pieces.index(" 1")] < 0
    assert constraint.token_sig[vocab.pieces.index(",-")] >= 0 and constraint.token_sig[vocab.pieces.index("5,")] >= 0


@pytest.mark.parametrize("version, width", [(1, 4), (3, 6)])  # "0.00" / "000.00" and "a00.00"
def test_budget_is_respected_and_too_small_a_budget_is_refused(version, width):
    tok = tiny_tokenizer()
    eos = tok.convert_tokens_to_ids(fmt.CHAT_END)
    shortest = 16 * width + 15 + 1  # 16 numbers, commas, EOS
    constraint = WaypointConstraint(tok, eos, shortest, format_version=version)
    tokens = _decode(constraint, len(tok), eos, 32, 4, shortest, seed=1)
    assert len(tokens) == shortest and fmt.parse_waypoints(tok.decode(tokens)).valid
    with pytest.raises(DecodeSettingsError, match=f"needs at least {shortest}"):
        WaypointConstraint(tok, eos, shortest - 1, format_version=version)


@pytest.mark.parametrize("version", [2, 4])  # 2: the fixed-width y without bins, no longer written or read
def test_unknown_format_version_is_refused(version):
    tok = tiny_tokenizer()
    with pytest.raises(ValueError, match=f"format version {version}"):
        WaypointConstraint(tok, tok.convert_tokens_to_ids(fmt.CHAT_END), 128, format_version=version)


def test_eos_only_after_sixteen_numbers_and_then_only_eos():
    tok = tiny_tokenizer()
    eos = tok.convert_tokens_to_ids(fmt.CHAT_END)
    constraint = WaypointConstraint(tok, eos, 128)
    answer = tok.encode(fmt.format_waypoints(np.arange(16).reshape(8, 2)), add_special_tokens=False)
    states = constraint.advance(constraint.start_state, answer[:-1])
    view = constraint.fresh_view(states, 3, len(answer) - 1)
    logits = torch.zeros(3, constraint.vocab)
    logits[:, eos] = -5.0  # EOS is unlikely, yet the grammar forces it after the last digit
    _, prediction, _ = view.decide(logits)
    assert prediction[1:].tolist() == [eos, eos]
    assert tok.decode([prediction[0].item()]).isdigit()
