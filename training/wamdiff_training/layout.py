"""Training sequences in the layouts the decoder runs, and one batched forward over them (anchors §1).

Diffusion (BD3-LM): ``prompt ⊕ clean answer ⊕ noisy answer``. The clean and noisy copies share block ids and
positions. Prompt and clean copy attend exactly as the decoder's prefill and commits do; noisy block b sees the
prompt, the clean blocks before b and itself (both ways), exactly as a denoising step of block b does. Prediction
is in place: the logit at a noisy [MASK] predicts that position's clean token.
AR: ``prompt ⊕ answer``, causal, the logit at i-1 predicts token i.
Every layout carries ``scored`` / ``labels`` aligned with the answer (row j of the forward's logits predicts answer
token j), so the shift lives here once and callers never shift.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from wamdiff_ros.decoding import masks
from wamdiff_ros.inputs import PromptInputs

IGNORE = -100
IN_PLACE, NEXT_TOKEN = "in_place", "next_token"  # DecodeMeta.prediction's names


@dataclass(frozen=True, slots=True)
class NoiseConfig:
    """Per-block mask rate t ~ stratified U[t_min, t_max) over a batch: 0..1 for BD3-LM training, 0.1..0.5 for
    distillation (anchors §1)."""

    t_min: float = 0.0
    t_max: float = 1.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.t_min <= self.t_max <= 1.0:
            raise ValueError(f"mask rates need 0 <= t_min <= t_max <= 1, got {self.t_min}..{self.t_max}")


@dataclass(slots=True)
class Layout:
    """One training sequence of S tokens for an answer of n tokens."""

    input_ids: torch.Tensor  # (S,)
    mm_token_type_ids: torch.Tensor  # (S,) int32, 1 at image tokens
    block_ids: torch.Tensor  # (S,) the decoder's block id of each token (a noisy token has its clean twin's)
    visible: torch.Tensor  # (S, S) bool: the query row attends to the key column
    position_of: torch.Tensor  # (S,) index into prompt ⊕ answer whose (M-RoPE) position the token takes
    scored: torch.Tensor  # (n,) sequence index whose logit predicts answer token j
    labels: torch.Tensor  # (n,) answer token j where the loss applies, IGNORE elsewhere
    answer: torch.Tensor  # (n,) the clean answer, ending with EOS
    prompt_len: int
    prediction: str  # IN_PLACE or NEXT_TOKEN
    pixel_values: torch.Tensor | None = None
    image_grid_thw: torch.Tensor | None = None
    mask_token_id: int | None = None

    @property
    def length(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def answer_len(self) -> int:
        return int(self.answer.shape[0])

    @property
    def stream_len(self) -> int:
        """prompt ⊕ clean answer: the plain sequence the positions come from."""
        return self.prompt_len + self.answer_len

    def prompt_inputs(self) -> PromptInputs:
        cut = self.prompt_len
        return PromptInputs(self.input_ids[None, :cut], self.mm_token_type_ids[None, :cut], self.pixel_values,
                            self.image_grid_thw)

    def sequence_labels(self) -> torch.Tensor:
        """(S,) the label of each position's logit (IGNORE where none): shifted for NEXT_TOKEN, in place else."""
        out = torch.full_like(self.input_ids, IGNORE)
        out[self.scored] = self.labels
        return out


def pad_to_blocks(answer: torch.Tensor, block_size: int, pad_id: int) -> torch.Tensor:
    """Pad to a whole number of blocks with ``pad_id`` (eos/pad = ``<|im_end|>``): the decoder's last block holds B
    tokens, so training the positions after EOS to stay EOS matches what it sees."""
    extra = -answer.shape[0] % block_size
    return torch.cat([answer, answer.new_full((extra,), pad_id)])


def sample_mask_rates(num_blocks: int, noise: NoiseConfig, generator: torch.Generator | None = None) -> torch.Tensor:
    """One rate per block, one per stratum of [t_min, t_max) split ``num_blocks`` ways, strata shuffled."""
    strata = torch.randperm(num_blocks, generator=generator).float()
    u = torch.rand(num_blocks, generator=generator)
    return noise.t_min + (noise.t_max - noise.t_min) * (strata + u) / num_blocks


def sample_masked(
    answer_lens: Sequence[int], block_size: int, noise: NoiseConfig, generator: torch.Generator | None = None
) -> list[torch.Tensor]:
    """Bool (n,) per answer: each token masked w.p. its block's rate; a block that drew no mask gets one uniformly
    chosen position masked (every block contributes to the loss)."""
    counts = [-(-n // block_size) for n in answer_lens]
    rates = sample_mask_rates(sum(counts), noise, generator).split(counts)
    out = []
    for n, block_rates in zip(answer_lens, rates):
        masked = torch.rand(n, generator=generator) < block_rates.repeat_interleave(block_size)[:n]
        for start in range(0, n, block_size):
            part = masked[start:start + block_size]
            if not bool(part.any()):
                part[int(torch.randint(part.shape[0], (1,), generator=generator))] = True
        out.append(masked)
    return out


def bd3_visibility(stream_ids: torch.Tensor, noisy_ids: torch.Tensor) -> torch.Tensor:
    """(S, S) visibility of ``stream ⊕ noisy`` composed from the one rule (``masks.visible``) on block ids:
    stream (prompt ⊕ clean) queries: the rule itself, no noisy key; noisy queries of block b: stream keys with id
    < b (the rule with query id b - 1) and noisy keys of block b (the rule both ways)."""
    own = masks.visible(noisy_ids, noisy_ids)
    top = torch.cat([masks.visible(stream_ids, stream_ids), own.new_zeros(len(stream_ids), len(noisy_ids))], 1)
    bottom = torch.cat([masks.visible(noisy_ids - 1, stream_ids), own & own.T], 1)
    return torch.cat([top, bottom], 0)


def _check_answer(answer: torch.Tensor, mask_token_id: int | None) -> None:
    if answer.ndim != 1 or answer.shape[0] == 0:
        raise ValueError(f"answer must be a non-empty 1-D token tensor, got shape {tuple(answer.shape)}")
    if mask_token_id is not None and bool((answer == mask_token_id).any()):
        raise ValueError("the clean answer contains the [MASK] token")


def diffusion_layout(
    prompt: PromptInputs,
    answer: torch.Tensor,
    masked: torch.Tensor,
    block_size: int,
    mask_token_id: int,
    prompt_block_size: int = 1,
) -> Layout:
    """``prompt ⊕ clean ⊕ noisy`` where the noisy copy has [MASK] at ``masked``; the loss is on masked tokens only.
    ``prompt_block_size`` must be the decoder's (``DecodeMeta.prompt_block_size``)."""
    _check_answer(answer, mask_token_id)
    if masked.shape != answer.shape or masked.dtype != torch.bool:
        raise ValueError(f"masked must be a bool tensor shaped like the answer {tuple(answer.shape)}")
    if block_size < 1:
        raise ValueError(f"block_size {block_size} must be >= 1")
    device = prompt.input_ids.device
    answer, masked = answer.to(device), masked.to(device)
    length, n = prompt.length, answer.shape[0]
    ids = masks.block_ids(length, n, block_size, prompt_block_size).to(device)
    noisy = torch.where(masked, torch.full_like(answer, mask_token_id), answer)
    index = torch.arange(length + n, device=device)
    return Layout(
        input_ids=torch.cat([prompt.input_ids[0], answer, noisy]),
        mm_token_type_ids=torch.cat([prompt.mm_token_type_ids[0], prompt.mm_token_type_ids.new_zeros(2 * n)]),
        block_ids=torch.cat([ids, ids[length:]]),
        visible=bd3_visibility(ids, ids[length:]),
        position_of=torch.cat([index, index[length:]]),
        scored=index[length:] + n,
        labels=torch.where(masked, answer, torch.full_like(answer, IGNORE)),
        answer=answer,
        prompt_len=length,
        prediction=IN_PLACE,
        pixel_values=prompt.pixel_values,
        image_grid_thw=prompt.image_grid_thw,
        mask_token_id=mask_token_id,
    )


def in_place_ar_layout(
    prompt: PromptInputs, answer: torch.Tensor, mask_token_id: int, prompt_block_size: int = 1
) -> Layout:
    """B = 1 with every noisy token masked: token i is predicted in place from the clean prefix, the step between
    next-token AR and block diffusion."""
    return diffusion_layout(prompt, answer, torch.ones_like(answer, dtype=torch.bool), 1, mask_token_id,
                            prompt_block_size)


def ar_layout(prompt: PromptInputs, answer: torch.Tensor, prompt_block_size: int = 1) -> Layout:
    """``prompt ⊕ answer``, causal answer; the logit at i-1 predicts token i, loss on every answer token."""
    _check_answer(answer, None)
    device = prompt.input_ids.device
    answer = answer.to(device)
    length, n = prompt.length, answer.shape[0]
    ids = masks.block_ids(length, n, 1, prompt_block_size).to(device)
    index = torch.arange(length + n, device=device)
    return Layout(
        input_ids=torch.cat([prompt.input_ids[0], answer]),
        mm_token_type_ids=torch.cat([prompt.mm_token_type_ids[0], prompt.mm_token_type_ids.new_zeros(n)]),
        block_ids=ids,
        visible=masks.visible(ids, ids),
        position_of=index,
        scored=index[length - 1:-1],
        labels=answer.clone(),
        answer=answer,
        prompt_len=length,
        prediction=NEXT_TOKEN,
        pixel_values=prompt.pixel_values,
        image_grid_thw=prompt.image_grid_thw,
    )


def diffusion_batch(
    prompts: Sequence[PromptInputs],
    answers: Sequence[torch.Tensor],
    block_size: int,
    mask_token_id: int,
    prompt_block_size: int = 1,
    noise: NoiseConfig = NoiseConfig(),
    generator: torch.Generator | None = None,
) -> list[Layout]:
    """Diffusion layouts for a batch, mask rates stratified over all of its blocks."""
    masked = sample_masked([len(a) for a in answers], block_size, noise, generator)
    return [diffusion_layout(p, a, m, block_size, mask_token_id, prompt_block_size)
            for p, a, m in zip(prompts, answers, masked)]


# -- forward ---------------------------------------------------------------------------------------------------------


@dataclass(slots=True)
class LayoutLogits:
    """Logits of a batch of layouts, flattened over their answers in layout order."""

    logits: torch.Tensor  # (N, V): row j predicts labels[j] (noisy copy in place, or the AR shift)
    labels: torch.Tensor  # (N,)
    lengths: tuple[int, ...]  # answer length per layout
    clean: torch.Tensor | None = None  # (N, V) at the clean copy (the answer itself for an AR layout)
    next_token: torch.Tensor | None = None  # (N, V) row j: the logit before answer token j in prompt ⊕ clean

    def split(self) -> list[torch.Tensor]:
        return list(self.logits.split(self.lengths))


def position_ids(model, layout: Layout) -> torch.Tensor:
    """(3, S) M-RoPE positions: the model's own rope index of prompt ⊕ clean answer, gathered by ``position_of``."""
    device = model.lm_head.weight.device
    cut = layout.stream_len
    grid = None if layout.image_grid_thw is None else layout.image_grid_thw.to(device)
    base, _ = model.model.get_rope_index(
        layout.input_ids[None, :cut].to(device), layout.mm_token_type_ids[None, :cut].to(device), image_grid_thw=grid
    )
    return base[:, 0, layout.position_of.to(device)]


def forward_layouts(model, layouts: Sequence[Layout], with_clean: bool = False, pad_id: int = 0,
                    with_next_token: bool = False) -> LayoutLogits:
    """One Qwen3-VL forward over right-padded layouts with their explicit 4-D additive masks and positions
    (padding keys hidden; a padding query sees only itself so no softmax row is empty). Gradients flow; wrap a
    teacher in ``torch.no_grad``. ``with_next_token``: also the shifted logits over ``prompt ⊕ clean`` (row j from
    the token before answer token j); for a B = 1 layout with a causal prompt they are an AR layout's logits."""
    if not layouts:
        raise ValueError("no layouts to forward")
    if pad_id == model.config.image_token_id:
        raise ValueError("pad_id must not be the image token")
    device, dtype = model.lm_head.weight.device, model.dtype
    batch, width = len(layouts), max(layout.length for layout in layouts)
    ids = torch.full((batch, width), pad_id, dtype=torch.long, device=device)
    types = torch.zeros((batch, width), dtype=torch.int32, device=device)
    positions = torch.zeros((3, batch, width), dtype=torch.long, device=device)
    visible = torch.eye(width, dtype=torch.bool).repeat(batch, 1, 1)  # masks.additive builds on the CPU
    for i, layout in enumerate(layouts):
        s = layout.length
        ids[i, :s] = layout.input_ids
        types[i, :s] = layout.mm_token_type_ids
        positions[:, i, :s] = position_ids(model, layout)
        visible[i, :s, :s] = layout.visible.cpu()
    mask = masks.additive(visible, dtype)[0, 0][:, None].to(device)
    kwargs = {}
    images = [layout for layout in layouts if layout.pixel_values is not None]
    if images:
        kwargs["pixel_values"] = torch.cat([x.pixel_values for x in images]).to(device=device, dtype=dtype)
        kwargs["image_grid_thw"] = torch.cat([x.image_grid_thw for x in images]).to(device)
    hidden = model.model(
        input_ids=ids, attention_mask=mask, position_ids=positions, mm_token_type_ids=types, **kwargs
    ).last_hidden_state
    rows = torch.cat([torch.full((x.answer_len,), i, device=device) for i, x in enumerate(layouts)])
    scored = torch.cat([x.scored.to(device) for x in layouts])
    clean = None
    if with_clean:
        clean_cols = torch.cat([torch.arange(x.prompt_len, x.stream_len, device=device) for x in layouts])
        clean = model.lm_head(hidden[rows, clean_cols])
    next_token = None
    if with_next_token:
        shifted_cols = torch.cat([torch.arange(x.prompt_len - 1, x.stream_len - 1, device=device) for x in layouts])
        next_token = model.lm_head(hidden[rows, shifted_cols])
    return LayoutLogits(
        logits=model.lm_head(hidden[rows, scored]),
        labels=torch.cat([x.labels.to(device) for x in layouts]),
        lengths=tuple(x.answer_len for x in layouts),
        clean=clean,
        next_token=next_token,
    )


def ar_aligned_logits(ar_model: torch.nn.Module, pairs: Sequence[tuple[PromptInputs, torch.Tensor]],
                      prompt_block_size: int = 1, pad_id: int = 0) -> torch.Tensor:
    """(N, V): row j of each answer holds the AR logit at position j-1 given ``prompt ⊕ answer[:j]``, i.e. the AR
    prediction of answer token j (``ar_layout`` owns the shift); the alignment of ``overlap.ar_aligned_overlap`` and
    of the AR teacher in cross-scale distillation."""
    layouts = [ar_layout(prompt, answer, prompt_block_size) for prompt, answer in pairs]
    return forward_layouts(ar_model, layouts, pad_id=pad_id).logits
