"""Detection metrics on the 0-1000 box grid: precision / recall and VOC all-point AP at IoU 0.5."""

from __future__ import annotations

import math

import numpy as np

from wamdiff_ros import format as fmt

IOU = 0.5


def _iou(a: fmt.Box, b: fmt.Box) -> float:
    w, h = min(a.x2, b.x2) - max(a.x1, b.x1), min(a.y2, b.y2) - max(a.y1, b.y1)
    inter = max(w, 0.0) * max(h, 0.0)
    union = (a.x2 - a.x1) * (a.y2 - a.y1) + (b.x2 - b.x1) * (b.y2 - b.y1) - inter
    return inter / union if union > 0 else 0.0


def detection_metrics(predicted: list[list[fmt.Box]], truth: list[list[fmt.Box]]) -> dict:
    """Precision / recall at IoU 0.5 (same label, each true box matched once, greedy by score then output order) and
    VOC all-point AP per class. The box text carries no confidence (every score 1.0), so each class's PR curve is one
    point and AP = precision x recall there; mAP is the mean over the classes that have true boxes."""
    hits: dict[str, list[tuple[float, bool]]] = {}
    n_true: dict[str, int] = {}
    for boxes, gts in zip(predicted, truth):
        for g in gts:
            n_true[g.label] = n_true.get(g.label, 0) + 1
        used = [False] * len(gts)
        for box in sorted(boxes, key=lambda b: -b.score):
            best, best_iou = -1, IOU
            for j, g in enumerate(gts):
                if not used[j] and g.label == box.label and (iou := _iou(box, g)) >= best_iou:
                    best, best_iou = j, iou
            if best >= 0:
                used[best] = True
            hits.setdefault(box.label, []).append((box.score, best >= 0))
    ap = {label: _average_precision(hits.get(label, []), n) for label, n in sorted(n_true.items())}
    tp = sum(h for v in hits.values() for _, h in v)
    n_pred, n_gt = sum(len(v) for v in hits.values()), sum(n_true.values())
    return {"predicted": n_pred, "ground_truth": n_gt, "true_positives": tp,
            "precision": tp / n_pred if n_pred else math.nan, "recall": tp / n_gt if n_gt else math.nan,
            "ap50_per_class": ap, "map50": float(np.mean(list(ap.values()))) if ap else math.nan}


def _average_precision(hits: list[tuple[float, bool]], n_true: int) -> float:
    """All-point interpolated AP; detections of one score enter together (ties are one operating point)."""
    if not n_true:
        return math.nan
    points, tp, seen = [(0.0, 1.0)], 0, 0
    scores = sorted({s for s, _ in hits}, reverse=True)
    for s in scores:
        group = [h for score, h in hits if score == s]
        tp, seen = tp + sum(group), seen + len(group)
        points.append((tp / n_true, tp / seen))
    recall = np.array([r for r, _ in points])
    precision = np.maximum.accumulate(np.array([p for _, p in points])[::-1])[::-1]
    return float(np.sum(np.diff(recall) * precision[1:]))
