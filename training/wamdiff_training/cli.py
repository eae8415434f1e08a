"""``wamdiff-train {ar,adapt,distill,cross-scale} --config FILE [--resume [CKPT]] [--set key=value ...]``;
``wamdiff-train eval ...`` evaluates checkpoints (``wamdiff_training.evaluation``); ``wamdiff-train data ...`` exports
the CPU world's data, ``wamdiff-train probe lane|lead ...`` and ``wamdiff-train trace ...`` probe a model in it
(``wamdiff_training.world``).

Runs as one process or under ``torchrun --nproc-per-node N -m wamdiff_training.cli ...``. Exit status: 0 done,
2 a bad config / argument / checkpoint / stage setting, 1 anything else.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from wamdiff_ros.errors import CheckpointError
from wamdiff_training.config import ConfigError, load_config
from wamdiff_training.data import RecordError
from wamdiff_training.stages import NAMES, STAGES


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="wamdiff-train", description=__doc__.split("\n\n")[0],
                                epilog="Evaluation: wamdiff-train eval --help; the whole tiny hierarchy: wamdiff-train hierarchy --help")
    p.add_argument("stage", choices=NAMES, help="ar: phase 1 AR pretraining; adapt: Stage I (one curriculum phase "
                   "per run, adapt.block_size); distill: Stage II block-wise; cross-scale: Stage III model-wise")
    p.add_argument("--config", required=True, help="YAML config, e.g. training/configs/tiny_ar.yaml")
    p.add_argument("--resume", nargs="?", const="latest", default=None, metavar="CKPT",
                   help="continue from <out.dir>/checkpoints/latest, or from the checkpoint folder CKPT")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config field, e.g. --set train.lr=3e-4 (repeatable)")
    p.add_argument("--stop-after", type=int, default=None, metavar="K",
                   help="exit hard (os._exit, no cleanup) right after step K: a kill, for resume tests")
    p.add_argument("--curriculum", action="store_true",
                   help="adapt only: run the whole ladder adapt.curriculum (e.g. B = 1 4 8 16 32), each phase in "
                        "<out.dir>/bNN initialised from its predecessor's last checkpoint (phase 0: model.init)")
    p.add_argument("--no-progress", action="store_true", help="log lines instead of a progress bar")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["eval"]:  # commands of their own (no --config): kept apart from the stage parser
        from wamdiff_training import evaluation

        return evaluation.main(argv[1:])
    if argv[:1] == ["hierarchy"]:
        from wamdiff_training import hierarchy

        return hierarchy.main(argv[1:])
    if argv[:1] == ["results"]:
        from wamdiff_training import results

        return results.main(argv[1:])
    if argv[:1] == ["export"]:
        from wamdiff_training import export

        return export.main(argv[1:])
    if argv[:1] == ["data"]:  # the CPU world's exports: generate, recoveries
        from wamdiff_training.world import dataset

        return dataset.main(argv[1:])
    if argv[:1] in (["probe"], ["trace"]):
        from wamdiff_training.world import commands

        return (commands.probe_main if argv[0] == "probe" else commands.trace_main)(argv[1:])
    args = parser().parse_args(argv)
    rank = int(os.environ.get("RANK", 0))
    logging.basicConfig(level=logging.INFO if rank == 0 else logging.WARNING,
                        format="%(asctime)s wamdiff-train: %(message)s", datefmt="%H:%M:%S")
    try:
        if args.stop_after is not None and args.stop_after < 1:
            raise ConfigError("--stop-after", "", f"must be >= 1, got {args.stop_after}")
        config = load_config(args.config, args.overrides)
        from transformers.utils import logging as hf_logging

        from wamdiff_training.engine import train

        hf_logging.disable_progress_bar()
        if not args.curriculum:
            result = train(config, STAGES[args.stage], args.stage, resume=args.resume, stop_after=args.stop_after,
                           progress=not args.no_progress)
        else:
            if args.stage != "adapt":
                raise ConfigError("--curriculum", "", "only the adapt stage has a curriculum")
            from wamdiff_training.stages.adapt import curriculum

            plan = curriculum(config.adapt.curriculum, config.adapt.steps_per_phase or config.train.steps)
            root, init = config.out.dir, config.model.init
            for phase in plan:  # each phase's init resolves to the checkpoint its predecessor has just written
                logging.info("curriculum phase %d: B=%d, %d steps", phase.index, phase.block_size, phase.steps)
                phase_config = load_config(args.config, [*args.overrides, *plan.overrides(phase, root, init)])
                result = train(phase_config, STAGES["adapt"], "adapt", resume=args.resume,
                               stop_after=args.stop_after, progress=not args.no_progress)
    except (ConfigError, CheckpointError, RecordError, ValueError) as exc:  # ValueError: a stage's own settings
        if rank == 0:
            print(f"wamdiff-train: error: {exc}", file=sys.stderr)
        return 2
    if rank == 0:
        losses = result.losses
        first = f"{losses[0]:.4f} -> {losses[-1]:.4f}" if losses else "no steps run"
        logging.info("done: %d steps, loss %s, %.2f steps/s, %.1f samples/s, checkpoint %s", result.steps, first,
                     result.steps_per_s, result.samples_per_s, result.checkpoint)
    return 0


if __name__ == "__main__":
    sys.exit(main())
