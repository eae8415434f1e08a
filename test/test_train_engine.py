"""Tests for the training engine (``wamdiff_training.engine`` / ``.checkpoint`` / ``.config`` / ``.stages.ar`` /
``.cli``): 2-process FSDP2 and DDP runs reproduce the 1-process losses, a killed run resumes to the same weights
bit for bit (optimiser, schedule, sampler position and RNG restored), gradient accumulation equals one batch, the
warm-up + cosine schedule, the AR stage overfits and its checkpoint plans through ``Planner``, and bad configs /
damaged checkpoints are refused naming the field / file."""

from __future__ import annotations

import csv
import importlib.util
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

try:
    import wamdiff_training  # noqa: F401
except ImportError:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "training"))

from wamdiff_ros.cli import load_rgb
from wamdiff_ros.errors import CheckpointError
from wamdiff_ros.model import tiny_random
from wamdiff_ros.planner import EgoState, Planner
from wamdiff_training import checkpoint, cli
from wamdiff_training.config import ConfigError, from_dict, load_config
from wamdiff_training.data import SampleDataset, load_records
from wamdiff_training.engine import Runner, accumulate_gradients, build_optimizer, lr_factor, train
from wamdiff_training.stages import STAGES
from wamdiff_training.stages.ar import ArStage
from wamdiff_training.world.dataset import main as export

ROOT = Path(__file__).resolve().parents[1]
TORCHRUN = Path(sys.executable).with_name("torchrun")
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
LOSS_RTOL = 1e-5  # fp32, 1 vs 2 processes: same samples and sums, different padding and reduction order
STEPS, EVERY = 4, 2


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("train_engine") / "set"
    assert export(["generate", "--scenarios", "highway", "--episodes", "1", "--max-seconds", "3", "--out", str(out),
                   "--preview", "0", "--no-progress"]) == 0
    return out / "train.json"


def raw_config(data: Path, out: Path, **train) -> dict:
    return {"data": {"train": [str(data)]},
            "train": {"batch_size": 4, "steps": STEPS, "lr": 2e-3, "warmup": 2, "seed": 0, **train},
            "out": {"dir": str(out), "checkpoint_every": EVERY, "keep": 0, "tensorboard": False}}


def write_config(raw: dict, path: Path) -> Path:
    path.write_text(yaml.safe_dump(raw))
    return path


def logged(out: Path, column: str = "loss") -> list[float]:
    with (out / "metrics.csv").open() as f:
        return [float(row[column]) for row in csv.DictReader(f)]


def weights(out: Path, step: int = STEPS) -> dict[str, torch.Tensor]:
    return load_file(str(checkpoint.checkpoints_dir(out) / checkpoint.step_name(step) / "model.safetensors"))


def torchrun(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    cmd = [str(TORCHRUN), "--standalone", "--nproc-per-node", "2", "-m", "wamdiff_training.cli", *args,
           "--no-progress"]
    return subprocess.run(cmd, cwd=cwd, env=ENV, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def reference(data, tmp_path_factory) -> Path:
    """One process, global batch 4, no wrapping."""
    out = tmp_path_factory.mktemp("ref") / "run"
    train(from_dict(raw_config(data, out)), STAGES["ar"], "ar", progress=False)
    return out


@pytest.fixture(scope="module")
def fsdp2_run(data, tmp_path_factory) -> Path:
    """Two processes of batch 2 under FSDP2: the same 4 samples per step."""
    tmp = tmp_path_factory.mktemp("fsdp2")
    config = write_config(raw_config(data, tmp / "run", batch_size=2, wrap="fsdp2"), tmp / "fsdp2.yaml")
    done = torchrun(["ar", "--config", str(config)], tmp)
    assert done.returncode == 0, done.stderr[-3000:]
    return tmp / "run"


# -- schedule, accumulation ------------------------------------------------------------------------------------------


def test_lr_warmup_then_cosine(data, tmp_path):
    assert [lr_factor(s, 10, 4, 0.1) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert lr_factor(4, 10, 4, 0.1) == 1.0
    assert lr_factor(7, 10, 4, 0.1) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 3 / 6)))
    assert lr_factor(10, 10, 4, 0.1) == pytest.approx(0.1)
    assert lr_factor(0, 5, 0, 0.0) == 1.0 and lr_factor(5, 5, 0, 0.0) == pytest.approx(0.0)
    config = from_dict(raw_config(data, tmp_path, lr=1e-3, steps=10, warmup=4, min_lr_ratio=0.1, weight_decay=0.1))
    optimizer, scheduler = build_optimizer(torch.nn.Linear(3, 2), config)
    seen = []
    for _ in range(10):
        seen.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert seen == pytest.approx([1e-3 * lr_factor(s, 10, 4, 0.1) for s in range(10)], rel=1e-12)
    assert [(g["weight_decay"], len(g["params"])) for g in optimizer.param_groups] == [(0.1, 1), (0.0, 1)]


def test_gradient_accumulation_equals_one_batch(data):
    bundle = tiny_random()
    bundle.model.train()
    dataset = SampleDataset(load_records(data), bundle)
    samples = dataset.batch([0, 1, 2, 3])  # plan, detect, ask answers: unequal token counts
    stage, runner = ArStage(from_dict({"data": {"train": [str(data)]}}), bundle), Runner(bundle.model)

    def grads(micro_batches):
        runner.zero_grad(set_to_none=True)
        stats = accumulate_gradients(runner, stage, micro_batches, 0)
        return stats, {n: p.grad.clone() for n, p in runner.named_parameters() if p.grad is not None}

    one, g_one = grads([samples])
    two, g_two = grads([samples[:2], samples[2:]])
    assert two.weight == one.weight == sum(s.answer_ids.numel() for s in samples)
    assert two.loss == pytest.approx(one.loss, rel=1e-6)
    assert g_one.keys() == g_two.keys()
    for name in g_one:
        torch.testing.assert_close(g_two[name], g_one[name], rtol=1e-5, atol=1e-7, msg=name)
    # per-token, not per-micro-batch: the plain mean of the two micro-batch means is a different number
    halves = [grads([half])[0].loss for half in (samples[:2], samples[2:])]
    assert abs((halves[0] + halves[1]) / 2 - one.loss) > 1e-3


# -- distributed -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["fsdp2", "ddp"])
def test_two_processes_match_one(how, data, reference, fsdp2_run, tmp_path):
    """FSDP2: 2 ranks x batch 2; DDP: 2 ranks x 2 micro-batches of 1 (no_sync on the first): the same 4 samples."""
    if how == "fsdp2":
        out = fsdp2_run
    else:
        out = tmp_path / "run"
        config = write_config(raw_config(data, out, batch_size=1, grad_accum=2, wrap=how), tmp_path / f"{how}.yaml")
        done = torchrun(["ar", "--config", str(config)], tmp_path)
        assert done.returncode == 0, done.stderr[-3000:]
    one, two = logged(reference), logged(out)
    assert len(one) == len(two) == STEPS
    diffs = [abs(a - b) / abs(a) for a, b in zip(one, two)]
    print(f"{how}: per-step relative loss difference 1 vs 2 processes: {[f'{d:.1e}' for d in diffs]}")
    assert max(diffs) < LOSS_RTOL
    assert logged(out, "tokens") == logged(reference, "tokens")  # the same samples each step
    ref, got = weights(reference), weights(out)
    assert ref.keys() == got.keys()
    worst = max(float((ref[k] - got[k]).abs().max()) for k in ref)
    print(f"{how}: max |weight difference| after {STEPS} steps: {worst:.1e}")
    assert worst < 1e-4  # AdamW normalises near-zero gradients, so rounding shows up in weights more than in losses


def test_fsdp2_in_one_plain_process_matches(data, reference, tmp_path):
    raw = raw_config(data, tmp_path / "run", wrap="fsdp2", steps=2)
    train(from_dict(raw), STAGES["ar"], "ar", progress=False)  # a process group of one
    assert logged(tmp_path / "run") == pytest.approx(logged(reference)[:2], rel=LOSS_RTOL)


def test_fsdp2_killed_run_resumes_to_the_same_weights(data, fsdp2_run, tmp_path):
    config = write_config(raw_config(data, tmp_path / "run", batch_size=2, wrap="fsdp2"), tmp_path / "fsdp2.yaml")
    killed = torchrun(["ar", "--config", str(config), "--stop-after", "3"], tmp_path)
    assert killed.returncode != 0  # os._exit(17) after step 3, whose checkpoint was never written
    root = checkpoint.checkpoints_dir(tmp_path / "run")
    assert (root / "latest").read_text().strip() == "step-000002"
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step-000002"]
    resumed = torchrun(["ar", "--config", str(config), "--resume"], tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    ref, got = weights(fsdp2_run), weights(tmp_path / "run")
    assert all(torch.equal(ref[k], got[k]) for k in ref)
    assert logged(tmp_path / "run") == logged(fsdp2_run)  # rows of the lost step 3 replaced, none twice
    # the same checkpoint on one process: the shards and RNG streams would not line up
    with pytest.raises(CheckpointError, match=r"train_state\.pt: made with world size 2, this run has 1"):
        train(load_config(config), STAGES["ar"], "ar", resume="latest", progress=False)


# -- resume ----------------------------------------------------------------------------------------------------------

NOISY_STAGE = '''
import random
import numpy as np
import torch
from wamdiff_training.stages.ar import ArStage


class NoisyArStage(ArStage):
    """AR with a loss scale drawn from python, numpy and torch RNGs: resume is exact only if all three are restored."""

    def loss(self, model, samples, step):
        loss, metrics = super().loss(model, samples, step)
        return loss * (1.0 + random.random() + float(np.random.rand()) + float(torch.rand(()))), metrics
'''

RUN_NOISY = '''
import sys
sys.path.insert(0, sys.argv[1])
from noisy_stage import NoisyArStage
from wamdiff_training.config import load_config
from wamdiff_training.engine import train
train(load_config(sys.argv[2]), NoisyArStage, "noisy-ar", stop_after=int(sys.argv[3]), progress=False)
'''


def test_killed_run_resumes_exactly_mid_epoch(data, tmp_path):
    (tmp_path / "noisy_stage.py").write_text(NOISY_STAGE)
    spec = importlib.util.spec_from_file_location("noisy_stage", tmp_path / "noisy_stage.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    # 8 records, batch 4: 2 steps per epoch, so the checkpoint at step 3 sits in the middle of epoch 1
    raw = raw_config(data, tmp_path / "full", steps=5)
    raw["data"]["limit"] = 8
    raw["out"]["checkpoint_every"] = 3
    train(from_dict(raw), module.NoisyArStage, "noisy-ar", progress=False)
    raw["out"]["dir"] = str(tmp_path / "killed")
    config = write_config(raw, tmp_path / "noisy.yaml")
    killed = subprocess.run([sys.executable, "-c", RUN_NOISY, str(tmp_path), str(config), "4"], env=ENV,
                            capture_output=True, text=True, timeout=300)
    assert killed.returncode == 17, killed.stderr[-3000:]
    state = torch.load(checkpoint.checkpoints_dir(tmp_path / "killed") / "step-000003" / checkpoint.STATE_FILE,
                       weights_only=True)
    assert (state["sampler"]["epoch"], state["sampler"]["position"], state["step"]) == (1, 1, 3)
    result = train(load_config(config), module.NoisyArStage, "noisy-ar", resume="latest", progress=False)
    assert len(result.losses) == 2
    ref, got = weights(tmp_path / "full", 5), weights(tmp_path / "killed", 5)
    diff = max(float((ref[k] - got[k]).abs().max()) for k in ref)
    print(f"resume: max |weight difference| vs the uninterrupted run: {diff}")
    assert diff == 0.0
    assert logged(tmp_path / "killed") == logged(tmp_path / "full")


def test_rng_state_round_trip():
    import random

    import numpy as np

    state = checkpoint.capture_rng()
    first = (random.random(), float(np.random.rand()), float(torch.rand(())))
    checkpoint.restore_rng(state)
    assert (random.random(), float(np.random.rand()), float(torch.rand(()))) == first


# -- the AR stage end to end -----------------------------------------------------------------------------------------


def test_ar_stage_overfits_and_its_checkpoint_plans(data, tmp_path):
    records = json.loads(data.read_text())
    plans = [r for r in records if r["task"] == "plan"][:2]
    subset = data.with_name("overfit.json")
    subset.write_text(json.dumps(plans + [r for r in records if r["task"] != "plan"][:2]))
    raw = raw_config(subset, tmp_path / "run", steps=30, lr=3e-3, warmup=3)
    raw["out"]["checkpoint_every"] = 0
    result = train(from_dict(raw), STAGES["ar"], "ar", progress=False)
    losses = result.losses
    print(f"AR overfit: loss {losses[0]:.3f} -> {losses[-1]:.3f} in 30 steps ({result.steps_per_s:.1f} steps/s)")
    assert losses[-1] < 0.5 * losses[0]
    assert sum(losses[-5:]) < sum(losses[:5]) * 0.5
    meta = json.loads((result.checkpoint / "wamdiff.json").read_text())
    assert (meta["prediction"], meta["trained_block_size"], meta["prompt_attention"]) == ("next_token", 1, "causal")
    planner = Planner.from_pretrained(str(result.checkpoint))
    m = plans[0]["meta"]
    plan = planner.plan(load_rgb(data.parent / plans[0]["image"]), EgoState(tuple(m["velocity"]),
                        tuple(m["acceleration"])), m["command"])
    assert plan.valid, plan.reason
    assert (plan.stats.mode, plan.stats.block_size) == ("ar", 1)


def test_checkpoints_record_the_waypoint_format_of_their_exports(data, reference, tmp_path):
    """The export's manifest says which format its answers are in; the checkpoint records it. Two formats in one run
    are refused."""
    def version(run: Path) -> int:
        folder = checkpoint.resolve("latest", run)
        return json.loads((folder / "wamdiff.json").read_text())["format_version"]

    assert version(reference) == 3  # a fresh export writes the package's format
    free = tmp_path / "v1"
    assert export(["generate", "--scenarios", "highway", "--episodes", "1", "--max-seconds", "3", "--out", str(free),
                   "--format-version", "1", "--seed-offset", "7", "--preview", "0", "--no-progress"]) == 0
    assert json.loads((free / "manifest.json").read_text())["format_version"] == 1
    raw = raw_config(free / "train.json", tmp_path / "run", steps=1, warmup=0)
    raw["model"] = {"init": str(checkpoint.resolve("latest", reference))}  # a format-3 model learns format 1
    train(from_dict(raw), STAGES["ar"], "ar", progress=False)
    assert version(tmp_path / "run") == 1
    assert Planner.from_pretrained(str(checkpoint.resolve("latest", tmp_path / "run")))._constraint.format_version == 1
    raw["data"]["train"] = [str(free / "train.json"), str(data)]
    with pytest.raises(ConfigError, match="a run trains on one format"):
        train(from_dict(raw), STAGES["ar"], "ar", progress=False)


# -- refusals --------------------------------------------------------------------------------------------------------


def test_checkpoint_layout_and_pointer(reference):
    root = checkpoint.checkpoints_dir(reference)
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step-000002", "step-000004"]  # no tmp left over
    assert checkpoint.resolve("latest", reference) == root / "step-000004"
    manifest = json.loads((root / "step-000004" / checkpoint.MANIFEST).read_text())
    assert manifest["step"] == 4 and "model.safetensors" in manifest["files"]


def test_damaged_checkpoint_is_refused_naming_the_file(data, reference, tmp_path):
    source = checkpoint.checkpoints_dir(reference) / "step-000004"
    fingerprint = from_dict(raw_config(data, reference)).fingerprint()
    folder = tmp_path / "step-000004"
    shutil.copytree(source, folder)
    state_file = folder / checkpoint.STATE_FILE
    data = state_file.read_bytes()
    state_file.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=rf"{state_file}: truncated"):
        checkpoint.read_state(folder, fingerprint, 1, "ar")
    state_file.write_bytes(b"\0" * len(data))  # same size, garbage
    with pytest.raises(CheckpointError, match=rf"{state_file}: corrupt training state"):
        checkpoint.read_state(folder, fingerprint, 1, "ar")
    shutil.copy(source / checkpoint.STATE_FILE, state_file)
    assert checkpoint.read_state(folder, fingerprint, 1, "ar")["step"] == 4
    weights_file = folder / "model.safetensors"
    blob = bytearray(weights_file.read_bytes())
    blob[:64] = b"\xff" * 64
    weights_file.write_bytes(bytes(blob))
    with pytest.raises(CheckpointError, match=rf"{weights_file}: corrupt safetensors"):
        checkpoint.load_model(folder)
    with pytest.raises(CheckpointError, match=r"train_state\.pt: made with a different config"):
        checkpoint.read_state(folder, "0" * 64, 1, "ar")
    (folder / checkpoint.MANIFEST).write_text("{")
    with pytest.raises(CheckpointError, match=rf"{folder / checkpoint.MANIFEST}: missing or corrupt"):
        checkpoint.read_state(folder, fingerprint, 1, "ar")


def test_cli_refuses_a_changed_config_on_resume(data, reference, tmp_path, capsys):
    config = write_config(raw_config(data, reference), tmp_path / "ref.yaml")
    assert cli.main(["ar", "--config", str(config), "--resume", "--set", "train.lr=1e-2", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "step-000004/train_state.pt: made with a different config" in err


def test_a_field_added_later_keeps_old_fingerprints_while_it_holds_its_old_default(data, reference):
    """``ADDED_DEFAULTS``: a run checkpointed before ``ar.in_place_weight`` existed still resumes (its fingerprint is
    the hash of the config without it); setting it changes it."""
    import hashlib

    from wamdiff_training.config import ADDED_DEFAULTS

    config = from_dict(raw_config(data, reference))
    raw = config.as_dict()
    raw.pop("out")
    raw["data"].pop("cache_size")
    for name in ("ar.in_place_weight",):
        assert name in ADDED_DEFAULTS
        section, _, key = name.partition(".")
        raw[section].pop(key)
    before = hashlib.sha256(json.dumps(raw, sort_keys=True).encode()).hexdigest()
    assert config.fingerprint() == before
    for section, values in (("ar", {"in_place_weight": 0.5}),):
        changed = raw_config(data, reference)
        changed.setdefault(section, {}).update(values)
        assert from_dict(changed).fingerprint() != before, values


def test_config_errors_name_the_field(data, tmp_path, capsys):
    raw = raw_config(data, tmp_path)
    raw["train"]["stpes"] = 3
    path = write_config(raw, tmp_path / "typo.yaml")
    with pytest.raises(ConfigError, match=rf"{path}: train\.stpes: unknown key"):
        load_config(path)
    good = write_config(raw_config(data, tmp_path), tmp_path / "good.yaml")
    with pytest.raises(ConfigError, match=r"train\.wrap: must be one of"):
        load_config(good, ["train.wrap=fsdp"])
    with pytest.raises(ConfigError, match=r"train\.lr: expected float"):
        load_config(good, ["train.lr=fast"])
    with pytest.raises(ConfigError, match=r"out\.nope: unknown key"):
        load_config(good, ["out.nope=1"])
    assert cli.main(["ar", "--config", str(path)]) == 2
    assert "train.stpes: unknown key" in capsys.readouterr().err
    assert cli.main(["distill", "--config", str(good)]) == 2  # the distill section names no teacher
    assert "no teacher" in capsys.readouterr().err


def test_shipped_configs_validate():
    tiny = load_config(ROOT / "training/configs/tiny_ar.yaml")
    assert tiny.model.init == "tiny-random" and tiny.train.steps >= 20
    paper = load_config(ROOT / "training/configs/paper_ar_8b.yaml")
    assert (paper.train.wrap, paper.train.precision) == ("fsdp2", "bf16")
    if "QWEN3_VL_8B" not in os.environ:
        from wamdiff_training.engine import build_bundle

        with pytest.raises(ConfigError, match=r"model\.init: .*QWEN3_VL_8B"):
            build_bundle(paper)
