"""RetinaFace face detection as facexlib's ``RetinaFace.detect_faces`` does it.

    detector = RetinaFaceDetector("detection_Resnet50_Final.safetensors")
    faces = detector.detect(rgb_uint8)              # [DetectedFace(box, score, landmarks), ...]

The network (``sdkit.families.retinaface``: the file's weights in a shipped weightless graph,
compiled on any backend) takes the image as facexlib feeds it: BGR floats in 0..255 minus
(104, 117, 123), at its own size (``use_origin_size=True``; the caller resizes, as
``FaceRestoreHelper.get_face_landmarks_5(resize=640)`` does). The rest is numpy, step by step
as facexlib (``retinaface.py``, ``retinaface_utils.py``) computes it in float32:

- prior boxes (``PriorBox``): for each level with step s in (8, 16, 32) and its two minimum
  sizes, per cell (row i, column j) of the ceil(H/s) x ceil(W/s) map, per size m:
  ``(cx, cy, w, h) = ((j + 0.5) s / W, (i + 0.5) s / H, m / W, m / H)`` computed in float64,
  stored as float32;
- boxes (``decode``, variances 0.1 and 0.2): centre ``p_xy + loc_xy * 0.1 * p_wh``, size
  ``p_wh * exp(loc_wh * 0.2)``, then corners, scaled by (W, H, W, H); landmarks
  (``decode_landm``) ``p_xy + l * 0.1 * p_wh`` per point, scaled by (W, H);
- scores ``conf[:, 1]`` (the graph's softmax) kept when ``> conf_threshold``, ordered by
  ``argsort()[::-1]`` (numpy's, as facexlib calls it), then non-maximum suppression as
  torchvision's ``nms`` (which facexlib's ``py_cpu_nms`` calls): in score order, a box is kept
  unless an already kept box overlaps it with IoU ``inter / (area_i + area_j - inter)`` (areas
  ``(x2 - x1) * (y2 - y1)``, float32) strictly above ``nms_threshold``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from contextlib import closing
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from sdkit.errors import InputError
from sdkit.families.retinaface import RetinaFaceConfig, RetinaFaceFile, find_graph
from sdkit.limits import check_bytes
from sdkit.pipelines.stages.shipped_net import ShippedNetwork, compile_network

F32 = NDArray[np.float32]
MEAN_BGR = np.array([104.0, 117.0, 123.0], dtype=np.float32)
MIN_SIZES = ((16, 32), (64, 128), (256, 512))  # facexlib's cfg_re50 / cfg_mnet (the same)
STEPS = (8, 16, 32)
VARIANCES = (np.float32(0.1), np.float32(0.2))
MIN_SIDE = 2  # smaller images have no 32-pixel level cell worth a prior box


@dataclass(frozen=True)
class DetectedFace:
    """One face: ``box`` (x1, y1, x2, y2) in input pixels, its ``score``, and five ``landmarks``
    (5, 2) x, y: left eye, right eye, nose, mouth left, mouth right (facexlib's order)."""

    box: tuple[float, float, float, float]
    score: float
    landmarks: F32


def prior_boxes(height: int, width: int) -> F32:
    """facexlib's ``PriorBox(cfg, image_size=(height, width)).forward()``: [P, 4] (cx, cy, w, h)
    relative to the image, level by level, row-major cells, two sizes per cell."""
    levels = []
    for step, sizes in zip(STEPS, MIN_SIZES, strict=True):
        rows, cols = -(-height // step), -(-width // step)
        cx = (np.arange(cols, dtype=np.float64) + 0.5) * step / width
        cy = (np.arange(rows, dtype=np.float64) + 0.5) * step / height
        grid = np.empty((rows, cols, len(sizes), 4), dtype=np.float64)
        grid[..., 0] = cx[None, :, None]
        grid[..., 1] = cy[:, None, None]
        for k, size in enumerate(sizes):
            grid[:, :, k, 2] = size / width
            grid[:, :, k, 3] = size / height
        levels.append(grid.reshape(-1, 4))
    return np.concatenate(levels).astype(np.float32)


def decode_boxes(loc: F32, priors: F32) -> F32:
    """facexlib's ``decode``: [P, 4] offsets -> (x1, y1, x2, y2) relative to the image (float32)."""
    centre = priors[:, :2] + loc[:, :2] * VARIANCES[0] * priors[:, 2:]
    size = priors[:, 2:] * np.exp(loc[:, 2:] * VARIANCES[1])
    x1y1 = centre - size / np.float32(2)
    return np.concatenate([x1y1, size + x1y1], axis=1).astype(np.float32)


def decode_landmarks(pre: F32, priors: F32) -> F32:
    """facexlib's ``decode_landm``: [P, 10] offsets -> five (x, y) points relative to the image."""
    points = [priors[:, :2] + pre[:, 2 * k : 2 * k + 2] * VARIANCES[0] * priors[:, 2:] for k in range(5)]
    return np.concatenate(points, axis=1).astype(np.float32)


def nms(boxes: F32, scores: F32, threshold: float) -> list[int]:
    """torchvision's ``ops.nms`` on float32 boxes: indices kept, highest score first (a stable
    descending sort, as torchvision's CPU kernel sorts)."""
    x1, y1, x2, y2 = (np.ascontiguousarray(boxes[:, k], dtype=np.float32) for k in range(4))
    areas = (x2 - x1) * (y2 - y1)
    order = np.argsort(-scores.astype(np.float64), kind="stable")
    suppressed = np.zeros(len(order), dtype=bool)
    keep: list[int] = []
    zero = np.float32(0)
    for pos, i in enumerate(order):
        if suppressed[i]:
            continue
        keep.append(int(i))
        rest = order[pos + 1 :]
        rest = rest[~suppressed[rest]]
        w = np.maximum(zero, np.minimum(x2[i], x2[rest]) - np.maximum(x1[i], x1[rest]))
        h = np.maximum(zero, np.minimum(y2[i], y2[rest]) - np.maximum(y1[i], y1[rest]))
        inter = w * h
        iou = inter / (areas[i] + areas[rest] - inter)
        suppressed[rest[iou.astype(np.float64) > threshold]] = True
    return keep


def detections(
    loc: F32, conf: F32, landmarks: F32, height: int, width: int, conf_threshold: float, nms_threshold: float
) -> F32:
    """The network's raw outputs for one image ([P, 4], [P, 2], [P, 10]) -> facexlib's
    ``detect_faces`` result: [K, 15] float32 rows ``x1, y1, x2, y2, score, 5 x (x, y)``."""
    priors = prior_boxes(height, width)
    if not loc.shape[0] == conf.shape[0] == landmarks.shape[0] == priors.shape[0]:
        raise InputError(f"RetinaFace outputs for {loc.shape[0]} priors, a {width}x{height} image has {len(priors)}")
    scale = np.array([width, height, width, height], dtype=np.float32)
    boxes = decode_boxes(loc, priors) * scale
    points = decode_landmarks(landmarks, priors) * np.tile(np.array([width, height], dtype=np.float32), 5)
    scores = np.asarray(conf[:, 1], dtype=np.float32)
    inds = np.where(scores > conf_threshold)[0]
    boxes, points, scores = boxes[inds], points[inds], scores[inds]
    order = scores.argsort()[::-1]
    boxes, points, scores = boxes[order], points[order], scores[order]
    rows = np.hstack((boxes, scores[:, None])).astype(np.float32, copy=False)
    keep = nms(rows[:, :4], rows[:, 4], nms_threshold)
    return np.concatenate((rows[keep], points[keep]), axis=1).astype(np.float32)


def faces_from_rows(rows: F32) -> list[DetectedFace]:
    """``detections`` rows as ``DetectedFace`` values."""
    return [
        DetectedFace(
            box=(float(r[0]), float(r[1]), float(r[2]), float(r[3])),
            score=float(r[4]),
            landmarks=np.asarray(r[5:15], dtype=np.float32).reshape(5, 2),
        )
        for r in rows
    ]


class RetinaFaceDetector(ShippedNetwork[RetinaFaceConfig]):
    """A RetinaFace file compiled on a backend, ready to find faces (module docstring)."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        backend: str = "auto",
        device: str | None = None,
        *,
        graphs: Iterable[str | os.PathLike[str]] = (),
        **options: Any,
    ) -> None:
        with closing(RetinaFaceFile(path)) as file:
            model = self.fill(file, find_graph, graphs, path)
        self.compiled = compile_network(model, "face detector", backend, device, options)

    def raw_outputs(self, image: np.ndarray) -> tuple[F32, F32, F32]:
        """The network's (loc [P, 4], conf [P, 2], landmarks [P, 10]) for an (H, W, 3) uint8 RGB
        image, fed as facexlib feeds it (BGR, minus the mean)."""
        pixels = np.asarray(image)
        if pixels.dtype != np.uint8 or pixels.ndim != 3 or pixels.shape[2] != 3:
            raise InputError(f"face detection takes an (H, W, 3) uint8 RGB image, got {pixels.dtype} {pixels.shape}")
        height, width = pixels.shape[:2]
        if min(height, width) < MIN_SIDE:
            raise InputError(f"face detection needs an image at least {MIN_SIDE}x{MIN_SIDE}, got {width}x{height}")
        check_bytes(height * width * 3 * 4 * 8, f"detecting faces in a {width}x{height} image")
        bgr = pixels[:, :, ::-1].astype(np.float32) - MEAN_BGR
        x = np.ascontiguousarray(bgr.transpose(2, 0, 1)[None])
        out = self.compiled.run({"image": x})
        loc, conf, landmarks = (np.asarray(out[k], dtype=np.float32)[0] for k in ("loc", "conf", "landmarks"))
        return loc, conf, landmarks

    def detect(self, image: np.ndarray, conf_threshold: float = 0.97, nms_threshold: float = 0.4) -> list[DetectedFace]:
        """Faces in an (H, W, 3) uint8 RGB image, highest score first: the same boxes, scores and
        landmarks as facexlib's ``RetinaFace.detect_faces`` on the BGR image (its default
        ``use_origin_size=True``) with these thresholds."""
        for name, value in (("conf_threshold", conf_threshold), ("nms_threshold", nms_threshold)):
            if not 0.0 <= float(value) <= 1.0:
                raise InputError(f"face detection: {name} must be in [0, 1], got {value}")
        loc, conf, landmarks = self.raw_outputs(image)
        height, width = np.asarray(image).shape[:2]
        return faces_from_rows(detections(loc, conf, landmarks, height, width, conf_threshold, nms_threshold))
