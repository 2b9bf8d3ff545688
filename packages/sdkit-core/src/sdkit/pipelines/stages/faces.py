"""Face restoration as A1111 runs it: detect, align, restore, paste back.

    image, count = restore_faces(image, restorer, detector, parser)        # a PIL image back

A1111 (``modules/face_restoration_utils.py``) hands each image to facexlib's
``FaceRestoreHelper(upscale_factor=1, face_size=512, crop_ratio=(1, 1),
det_model="retinaface_resnet50", use_parse=True)``; this module does what that helper does, step
by step, with OpenCV's arithmetic reproduced in numpy (``sdkit.pipelines.imaging.cv_compat``):

1. **Detect** (``get_face_landmarks_5(only_center_face=False, resize=640, eye_dist_threshold=5)``):
   the image is resized (Lanczos-4) so that its short side is 640 (``scale = min(h, w) / 640``,
   the other side ``int(side / scale)``), RetinaFace finds faces at confidence 0.97, their boxes
   and 5 landmarks are scaled back by ``scale`` in float32, and faces whose eyes are closer than
   5 pixels are dropped. Every face is kept (not only the centre one), in the detector's order.
2. **Align** (``align_warp_face``): the 5 landmarks are mapped onto facexlib's 512 x 512 FFHQ
   template by ``cv2.estimateAffinePartial2D(..., method=cv2.LMEDS)``: 13 random 2-point
   similarities (OpenCV's generator and seed), the one with the least median squared error
   chooses the inliers (squared error within ``(2.5 * 1.4826 * (1 + 5 / 3))^2`` times that
   median), then the least-squares similarity over the inliers (what OpenCV's Levenberg-Marquardt
   refinement converges to). The face is warped to 512 x 512 (bilinear, grey border
   (132, 133, 135) RGB). A restorer with another side (``restorer.size``, e.g. a tiny test
   network's 64) gets ``FaceRestoreHelper(face_size=size)``'s crop: the template times
   ``size / 512``, the crop ``size`` x ``size``; its parse mask is computed at 512 (the restored
   face resized up, bilinear) and resized down to ``size`` before the warp back, as facexlib does.
3. **Restore**: the crop as RGB floats in [0, 1] goes to the restorer (GFPGAN, or CodeFormer with
   its fidelity weight ``w``); its [0, 1] output becomes 8 bits as A1111 writes it:
   ``(face * 255).astype(uint8)`` (truncated, not rounded).
4. **Paste back** (``get_inverse_affine`` + ``paste_faces_to_input_image``): the restored face is
   warped back with the inverted matrix (black border). With a face parser (``use_parse=True``,
   A1111's setting) the mask is the parse map's face classes (everything but background, hair,
   hat... classes 0, 14, 16, 17, 18) as 255, blurred twice (Gaussian 101 x 101, sigma 11), its
   10-pixel frame zeroed, divided by 255 and warped back. Without one (``use_parse=False``) it is
   facexlib's square mask: ones warped back, eroded 2 x 2, then eroded by ``2 * w_edge`` and
   blurred (``w_edge = int(sqrt(area)) // 20``). Each face blends as
   ``mask * face + (1 - mask) * image`` in floats; the image is truncated to 8 bits at the end.
5. **Visibility** (A1111's Extras ``gfpgan_visibility`` / ``codeformer_visibility``): below 1 the
   result is ``PIL.Image.blend(original, restored, visibility)``; 0 runs nothing.

Files (``load_face_models``, ``sdkit.restore_faces``): a restorer is a ``.safetensors`` file whose
kind (GFPGAN or CodeFormer) is read from its tensors by ``sdkit.families.gfpgan.sniff`` /
``codeformer.sniff``, or A1111's name ("GFPGAN", "CodeFormer") of ``GFPGANv1.4`` /
``codeformer-v0.1.0`` in the face folders; the detector ``detection_Resnet50_Final`` and the
parser ``parsing_parsenet`` are found next to it or in ``$SDKIT_FACE_DIR`` (or given), each checked
by its family's ``sniff``. Pickles (``.pth``...) are refused unread with the conversion command.
The networks are the faces contract's classes, imported when first needed.

``fixtures/faces/pipeline/make_pipeline_goldens.py`` runs facexlib itself on the same landmarks,
restored faces and parse maps; ``tests/pipelines/test_faces.py`` holds this module to its output.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from numpy.typing import NDArray

from sdkit.errors import InputError, MissingDependencyError, ModelFormatError, NonFiniteError
from sdkit.families.safetensors_reader import SafetensorsFile
from sdkit.families.shipped_weights import SELECT_PARAMS, pth_refusal_message
from sdkit.limits import check_bytes
from sdkit.pipelines.imaging.cv_compat import (
    erode,
    gaussian_blur,
    invert_affine,
    resize_lanczos4,
    resize_linear,
    warp_affine,
)

log = logging.getLogger(__name__)

F32 = NDArray[np.float32]
U8 = NDArray[np.uint8]
FACE_SIZE = 512
# facexlib's 5 landmarks of an FFHQ face at 512 x 512: left eye, right eye, nose, mouth corners
FACE_TEMPLATE = np.array(
    [
        [192.98138, 239.94708],
        [318.90277, 240.1936],
        [256.63416, 314.01935],
        [201.26117, 371.41043],
        [313.08905, 371.15118],
    ]
)
CROP_BORDER_RGB = (132.0, 133.0, 135.0)  # facexlib's grey (135, 133, 132) in BGR
DETECT_SHORT_SIDE = 640
DETECT_CONFIDENCE = 0.97
MIN_EYE_DISTANCE = 5.0
NOT_FACE_CLASSES = (0, 14, 16, 17, 18)  # facexlib's MASK_COLORMAP zeros: background, cloth, hair, hat...
PARSE_BLUR, PARSE_SIGMA, PARSE_FRAME = 101, 11.0, 10


class FaceRestorer(Protocol):
    """What ``GFPGANRestorer`` and ``CodeFormerRestorer`` provide (the faces contract)."""

    name: str
    size: int
    takes_fidelity: bool

    def restore(self, face: F32, fidelity: float | None = None) -> F32: ...


class DetectedFaceLike(Protocol):
    @property
    def box(self) -> tuple[float, float, float, float]: ...
    @property
    def score(self) -> float: ...
    @property
    def landmarks(self) -> F32: ...


class FaceDetector(Protocol):
    def detect(self, image: np.ndarray, conf_threshold: float = ...) -> Sequence[DetectedFaceLike]: ...


class FaceParser(Protocol):
    size: int

    def parse(self, face: F32) -> np.ndarray: ...


# ---------------------------------------------------------------- OpenCV's LMEDS similarity


class _CvRng:
    """OpenCV's ``cv::RNG`` (multiply-with-carry), as ``LMeDSPointSetRegistrator`` seeds it."""

    def __init__(self, state: int = 0xFFFFFFFFFFFFFFFF) -> None:
        self.state = state

    def uniform(self, low: int, high: int) -> int:
        self.state = ((self.state & 0xFFFFFFFF) * 4164903690 + (self.state >> 32)) & 0xFFFFFFFFFFFFFFFF
        return low + (self.state & 0xFFFFFFFF) % (high - low)


def _two_point_similarity(src: np.ndarray, dst: np.ndarray) -> NDArray[np.float64]:
    """The similarity (rotation, uniform scale, shift) taking 2 points exactly onto 2."""
    p = complex(*src[0]) - complex(*src[1])
    q = complex(*dst[0]) - complex(*dst[1])
    z = q / p if p != 0 else complex(0, 0)
    t = complex(*dst[0]) - z * complex(*src[0])
    return np.array([[z.real, -z.imag, t.real], [z.imag, z.real, t.imag]])


def _squared_errors(matrix: np.ndarray, src: np.ndarray, dst: np.ndarray) -> F32:
    """OpenCV's ``computeError`` for affine models: float32 squared distances."""
    h = matrix.reshape(6).astype(np.float32)
    a = h[0] * src[:, 0] + h[1] * src[:, 1] + h[2] - dst[:, 0]
    b = h[3] * src[:, 0] + h[4] * src[:, 1] + h[5] - dst[:, 1]
    return np.asarray(a * a + b * b, dtype=np.float32)


def _least_squares_similarity(src: np.ndarray, dst: np.ndarray) -> NDArray[np.float64]:
    """The similarity minimising the summed squared distances (closed form)."""
    p, q = src.astype(np.float64), dst.astype(np.float64)
    pm, qm = p.mean(axis=0), q.mean(axis=0)
    pc, qc = p - pm, q - qm
    norm = float((pc * pc).sum())
    a = float((pc * qc).sum()) / norm
    b = float((pc[:, 0] * qc[:, 1] - pc[:, 1] * qc[:, 0]).sum()) / norm
    tx = qm[0] - (a * pm[0] - b * pm[1])
    ty = qm[1] - (b * pm[0] + a * pm[1])
    return np.array([[a, -b, tx], [b, a, ty]])


def _lmeds_iterations(points: int = 2, confidence: float = 0.99, outliers: float = 0.45, most: int = 2000) -> int:
    num = math.log(1.0 - confidence)
    denom = math.log(1.0 - (1.0 - outliers) ** points)
    return max(most if -num >= most * -denom else round(num / denom), 3)


def estimate_similarity(src: np.ndarray, dst: np.ndarray) -> NDArray[np.float64]:
    """``cv2.estimateAffinePartial2D(src, dst, method=cv2.LMEDS)[0]`` for N >= 2 point pairs
    (module docstring, step 2): a (2, 3) float64 matrix taking ``src`` onto ``dst``."""
    src = np.asarray(src, dtype=np.float32).reshape(-1, 2)
    dst = np.asarray(dst, dtype=np.float32).reshape(-1, 2)
    count = len(src)
    if count < 2 or len(dst) != count or not (np.isfinite(src).all() and np.isfinite(dst).all()):
        raise InputError(f"a similarity needs >= 2 finite point pairs, got {len(src)} and {len(dst)}")
    if count == 2:
        return _two_point_similarity(src, dst)
    rng, best, least = _CvRng(), None, math.inf
    for _ in range(_lmeds_iterations()):
        first = rng.uniform(0, count)
        second = rng.uniform(0, count)
        while second == first:
            second = rng.uniform(0, count)
        model = _two_point_similarity(src[[first, second]], dst[[first, second]])
        median = float(np.sort(_squared_errors(model, src, dst))[count // 2])
        if median < least:
            best, least = model, median
    if best is None:
        raise InputError("no similarity fits these landmarks")
    sigma = max(2.5 * 1.4826 * (1 + 5.0 / (count - 2)) * math.sqrt(least), 0.001)
    inliers = _squared_errors(best, src, dst) <= np.float32(sigma * sigma)
    if inliers.sum() < 2 or not np.ptp(src[inliers], axis=0).any():
        return best
    return _least_squares_similarity(src[inliers], dst[inliers])


# ---------------------------------------------------------------- detection, alignment


@dataclass(frozen=True)
class AlignedFace:
    """One face: its landmarks in the image, the image -> crop matrix and the 512 px crop."""

    landmarks: F32
    matrix: NDArray[np.float64]
    crop: U8


def detection_input(image: U8) -> tuple[U8, float]:
    """The image the detector sees and the factor back to the image (facexlib's ``resize=640``)."""
    height, width = image.shape[:2]
    scale = min(height, width) / DETECT_SHORT_SIDE
    size = (int(width / scale), int(height / scale))
    return resize_lanczos4(image, size), scale


def face_landmarks(image: U8, detector: FaceDetector) -> list[F32]:
    """The 5 landmarks of every face the detector finds, in image pixels (step 1)."""
    resized, scale = detection_input(image)
    found = []
    for face in detector.detect(resized, DETECT_CONFIDENCE):
        landmarks = np.asarray(face.landmarks, dtype=np.float32).reshape(5, 2) * np.float32(scale)
        if float(np.linalg.norm(landmarks[0] - landmarks[1])) < MIN_EYE_DISTANCE:
            continue
        found.append(np.asarray(landmarks, dtype=np.float32))
    return found


def face_template(size: int = FACE_SIZE) -> NDArray[np.float64]:
    """facexlib's template for ``FaceRestoreHelper(face_size=size)``: the 512 px one times ``size / 512``."""
    return np.asarray(FACE_TEMPLATE * (size / 512.0), dtype=np.float64)


def align_face(image: U8, landmarks: np.ndarray, size: int = FACE_SIZE) -> AlignedFace:
    """The ``size`` x ``size`` crop of the face with these landmarks (step 2; facexlib's
    ``face_size``: the restorer's side)."""
    matrix = estimate_similarity(landmarks, face_template(size))
    crop = warp_affine(image, matrix, (size, size), CROP_BORDER_RGB)
    return AlignedFace(np.asarray(landmarks, dtype=np.float32), matrix, crop)


def restored_to_uint8(face: np.ndarray) -> U8:
    """A restorer's [0, 1] face as A1111 stores it: ``(face * 255).astype(uint8)``."""
    return np.asarray(np.asarray(face, dtype=np.float32) * 255.0).astype(np.uint8)


def crop_to_float(crop: U8) -> F32:
    """An 8-bit crop as the restorer takes it: ``crop / 255.0`` (float64) in float32."""
    return np.asarray(crop / 255.0, dtype=np.float32)


# ---------------------------------------------------------------- paste-back


def parse_mask(classes: np.ndarray) -> NDArray[np.float64]:
    """facexlib's soft mask from a (512, 512) parse map: 255 on face classes, blurred twice, the
    10-pixel frame zeroed, in [0, 1] (float64)."""
    classes = np.asarray(classes)
    if classes.shape != (FACE_SIZE, FACE_SIZE):
        raise InputError(f"a face parse map is {FACE_SIZE} x {FACE_SIZE}, got {classes.shape}")
    mask = np.where(np.isin(classes, NOT_FACE_CLASSES), 0.0, 255.0)
    mask[(classes < 0) | (classes >= 19)] = 0.0  # classes outside facexlib's colormap stay 0
    mask = gaussian_blur(mask, PARSE_BLUR, PARSE_SIGMA)
    mask = gaussian_blur(mask, PARSE_BLUR, PARSE_SIGMA)
    frame = PARSE_FRAME
    mask[:frame, :] = 0
    mask[-frame:, :] = 0
    mask[:, :frame] = 0
    mask[:, -frame:] = 0
    return mask / 255.0


def _square_mask(
    inverse: np.ndarray, size: tuple[int, int], region: tuple[int, int, int, int], face: int = FACE_SIZE
) -> tuple[F32, F32]:
    """facexlib's ``use_parse=False`` masks in ``region``: (the eroded warped square, its
    softened centre)."""
    ones = np.ones((face, face), dtype=np.float32)
    eroded = erode(warp_affine(ones, inverse, size, region=region), 2)
    w_edge = int(np.sum(eroded) ** 0.5) // 20
    centre = erode(eroded, w_edge * 2)
    return eroded, gaussian_blur(centre, w_edge * 2 + 1, 0)


def _footprint(inverse: np.ndarray, width: int, height: int, face: int = FACE_SIZE) -> tuple[int, int, int, int]:
    """The block of the image a face pastes into: its crop's corners mapped back, widened by
    what the square mask's erosion and blur reach (so that every value outside is the image's
    own, and inside the same as over the whole image)."""
    corners = np.array([[-1, -1, 1], [face + 1, -1, 1], [-1, face + 1, 1], [face + 1, face + 1, 1]])
    mapped = corners @ np.asarray(inverse, dtype=np.float64).T
    if not np.isfinite(mapped).all():
        return 0, 0, width, height
    low, high = np.floor(mapped.min(axis=0)), np.ceil(mapped.max(axis=0))
    reach = 3 * (int(math.sqrt(max(float(np.prod(high - low)), 0.0))) // 20) + 8
    x0, y0 = (int(max(v - reach, 0)) for v in low)
    x1, y1 = int(min(high[0] + reach, width)), int(min(high[1] + reach, height))
    return (x0, y0, x1, y1) if x0 < x1 and y0 < y1 else (0, 0, 0, 0)


def paste_faces(
    image: U8,
    faces: Sequence[tuple[np.ndarray, U8]],
    parse_maps: Sequence[np.ndarray] | None = None,
) -> U8:
    """Step 4: each ``(matrix, restored uint8 face)`` pasted back into ``image`` (H, W, 3 uint8
    RGB); with ``parse_maps`` (one 512 x 512 map per face, whatever the face's side: facexlib
    parses the face resized to 512 and resizes the mask to the face, both bilinear) the parse
    mask, else the square mask. Only
    the block each face reaches is computed (``_footprint``); facexlib's float types are kept
    (float64 with the parse mask, float32 with the square one) until the final truncation."""
    height, width = image.shape[:2]
    item = 8 if parse_maps is not None else 4
    check_bytes(height * width * 3 * item * 2, f"pasting faces into a {width}x{height} image")
    out = image.astype(np.float64 if parse_maps is not None else np.float32)
    for i, (matrix, restored) in enumerate(faces):
        inverse = invert_affine(matrix)
        side = int(np.asarray(restored).shape[0])
        region = _footprint(inverse, width, height, side)
        x0, y0, x1, y1 = region
        if x0 >= x1:
            continue  # the face maps entirely outside the image
        warped = warp_affine(restored, inverse, (width, height), region=region)
        block = out[y0:y1, x0:x1]
        if parse_maps is not None:
            soft = resize_linear(parse_mask(parse_maps[i]), (side, side))
            mask = warp_affine(soft, inverse, (width, height), region=region)[:, :, None]
            out[y0:y1, x0:x1] = mask * warped + (1 - mask) * block
        else:
            eroded, centre = _square_mask(inverse, (width, height), region, side)
            pasted = eroded[:, :, None] * warped
            out[y0:y1, x0:x1] = centre[:, :, None] * pasted + (1 - centre[:, :, None]) * block
    return np.asarray(out).astype(np.uint8)


# ---------------------------------------------------------------- orchestration


def _as_rgb_array(image: Any) -> U8:
    from PIL import Image

    if isinstance(image, Image.Image):
        return np.asarray(image.convert("RGB"), dtype=np.uint8)
    array = np.asarray(image)
    if array.dtype != np.uint8 or array.ndim != 3 or array.shape[2] != 3:
        raise InputError(f"face restoration takes a PIL image or (H, W, 3) uint8 RGB, got {array.dtype} {array.shape}")
    return array


def face_size(restorer: FaceRestorer) -> int:
    """The side of the crops a restorer takes (facexlib's ``face_size``; 512 for A1111's files)."""
    size = getattr(restorer, "size", FACE_SIZE)
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or not 16 <= int(size) <= 2048:
        raise ModelFormatError(f"{getattr(restorer, 'name', 'the face restorer')} has face size {size!r}")
    return int(size)


def _checked_face(restorer: FaceRestorer, face: Any) -> F32:
    """The restorer's output, refused unless a finite (size, size, 3) face."""
    name = getattr(restorer, "name", "the face restorer")
    side = face_size(restorer)
    out: F32 = np.asarray(face, dtype=np.float32)
    if out.shape != (side, side, 3):
        raise ModelFormatError(f"{name} returned a {list(out.shape)} face; ({side}, {side}, 3) was expected")
    if not np.isfinite(out).all():
        raise NonFiniteError(f"{name} returned NaN or infinity in a restored face")
    return out


def check_fidelity(restorer: FaceRestorer, fidelity: float | None) -> float | None:
    """``fidelity`` checked against the restorer: CodeFormer's ``w`` in [0, 1]; GFPGAN takes none."""
    if fidelity is None:
        return None
    if not getattr(restorer, "takes_fidelity", False):
        raise InputError(
            f"{getattr(restorer, 'name', 'this restorer')} has no fidelity weight (CodeFormer's); leave it unset"
        )
    value = float(fidelity)
    if not 0.0 <= value <= 1.0:
        raise InputError(f"CodeFormer's fidelity weight must be in [0, 1], got {fidelity}")
    return value


def restore_faces(
    image: Any,
    restorer: FaceRestorer,
    detector: FaceDetector,
    parser: FaceParser | None = None,
    fidelity: float | None = None,
    visibility: float = 1.0,
) -> tuple[Any, int]:
    """Restore every face in ``image`` (a PIL image or (H, W, 3) uint8 RGB) as A1111 does
    (module docstring); returns ``(PIL image, number of faces restored)``. ``parser`` None uses
    facexlib's square mask (``use_parse=False``); A1111 always has one."""
    from PIL import Image

    visibility = float(visibility)
    if not 0.0 <= visibility <= 1.0:
        raise InputError(f"face restoration visibility must be in [0, 1], got {visibility}")
    fidelity = check_fidelity(restorer, fidelity)
    pixels = _as_rgb_array(image)
    original = Image.fromarray(pixels)
    if visibility == 0.0:
        return original, 0
    faces, parse_maps, side = [], [], face_size(restorer)
    for landmarks in face_landmarks(pixels, detector):
        aligned = align_face(pixels, landmarks, side)
        restored = restored_to_uint8(_checked_face(restorer, restorer.restore(crop_to_float(aligned.crop), fidelity)))
        faces.append((aligned.matrix, restored))
        if parser is not None:
            face512 = resize_linear(restored, (FACE_SIZE, FACE_SIZE))  # facexlib's cv2.resize before parsing
            parse_maps.append(parser.parse(np.asarray(face512, dtype=np.float32) / np.float32(255.0)))
    log.info("restoring %d face(s) with %s", len(faces), getattr(restorer, "name", "a face restorer"))
    if not faces:
        return original, 0
    result = Image.fromarray(paste_faces(pixels, faces, parse_maps if parser is not None else None))
    if visibility < 1.0:
        result = Image.blend(original, result, visibility)
    return result, len(faces)


# ---------------------------------------------------------------- files

FACE_DIR_ENV = "SDKIT_FACE_DIR"
# A1111's file names (what it downloads into models/GFPGAN, models/Codeformer), as .safetensors
RESTORER_STEMS = {"GFPGAN": "GFPGANv1.4", "CodeFormer": "codeformer-v0.1.0"}
DETECTOR_STEM = "detection_Resnet50_Final"
PARSER_STEM = "parsing_parsenet"
_RESTORER_MODULES = {"GFPGAN": "gfpgan", "CodeFormer": "codeformer"}
_RESTORER_CLASSES = {"GFPGAN": "GFPGANRestorer", "CodeFormer": "CodeFormerRestorer"}
_PICKLED = (".pth", ".pt", ".ckpt", ".bin", ".pkl", ".pickle")


def face_pth_refusal(name: str) -> str:
    """Why a face model ``.pth`` is refused, and the one-line conversion (GFPGAN's and
    CodeFormer's files keep their weights under ``params_ema``; facexlib's are plain)."""
    return pth_refusal_message(name, "face model files", select=SELECT_PARAMS)


def face_folders(folders: Iterable[str | os.PathLike[str]] = ()) -> list[Path]:
    """``folders``, then those of ``$SDKIT_FACE_DIR`` (``os.pathsep``-separated)."""
    env = [p for p in os.environ.get(FACE_DIR_ENV, "").split(os.pathsep) if p]
    return [Path(f) for f in [*folders, *env]]


def find_face_file(stem: str, folders: Iterable[str | os.PathLike[str]] = ()) -> Path | None:
    """``<stem>.safetensors`` in the face folders (first match, case-insensitive), or None."""
    for folder in face_folders(folders):
        if folder.is_dir():
            for path in sorted(folder.glob("*.safetensors")):
                if path.stem.lower() == stem.lower():
                    return path
    return None


def _family(kind: str) -> Any:
    """``sdkit.families.<kind>`` (gfpgan, codeformer, retinaface, parsenet), imported when asked."""
    import importlib

    try:
        return importlib.import_module(f"sdkit.families.{kind}")
    except ImportError as exc:
        raise MissingDependencyError(
            f"face restoration needs sdkit.families.{kind}, which this sdkit lacks ({exc})"
        ) from None


def _stage(kind: str, cls: str) -> Any:
    """``sdkit.pipelines.stages.<kind>.<cls>``, imported when asked."""
    import importlib

    try:
        return getattr(importlib.import_module(f"sdkit.pipelines.stages.{kind}"), cls)
    except (ImportError, AttributeError) as exc:
        raise MissingDependencyError(
            f"face restoration needs sdkit.pipelines.stages.{kind}.{cls}, which this sdkit lacks ({exc})"
        ) from None


def _file_shapes(path: Path, what: str) -> dict[str, tuple[int, ...]]:
    if path.suffix.lower() in _PICKLED:
        raise ModelFormatError(face_pth_refusal(path.name))
    if not path.is_file():
        raise ModelFormatError(f"{what} file not found: {path}")
    file = SafetensorsFile(path)
    try:
        return {key: tuple(entry.shape) for key, entry in file.entries.items()}
    finally:
        file.close()


def _check_kind(path: Path, family: str, what: str) -> None:
    """A ModelFormatError unless ``sdkit.families.<family>.sniff`` takes the file's tensors (a
    ``.pth`` is refused unread, a missing file named)."""
    shapes = _file_shapes(path, what)
    if _family(family).sniff(shapes) is None:
        keys = ", ".join(sorted(shapes)[:4])
        raise ModelFormatError(
            f"{path.name} is not {what} (sdkit.families.{family}.sniff declined its keys: {keys}...)"
        )


def sniff_face_restorer(path: str | os.PathLike[str]) -> str:
    """ "GFPGAN" or "CodeFormer": which restorer a ``.safetensors`` file holds, from its keys and
    shapes (``sdkit.families.gfpgan.sniff`` / ``codeformer.sniff``); a ModelFormatError otherwise."""
    path = Path(path)
    shapes = _file_shapes(path, "face restorer")
    for name, module in _RESTORER_MODULES.items():
        if _family(module).sniff(shapes) is not None:
            return name
    keys = ", ".join(sorted(shapes)[:4])
    raise ModelFormatError(
        f"{path.name} is neither a GFPGAN nor a CodeFormer file (sdkit.families.gfpgan.sniff and "
        f"codeformer.sniff both declined its keys: {keys}...)"
    )


def open_face_restorer(path: str | os.PathLike[str], backend: str = "auto", device: Any = None) -> FaceRestorer:
    """A compiled GFPGAN or CodeFormer restorer for this file, chosen by sniffing its tensors."""
    name = sniff_face_restorer(path)
    cls = _stage(_RESTORER_MODULES[name], _RESTORER_CLASSES[name])
    restorer: FaceRestorer = cls(Path(path), backend=backend, device=device)
    return restorer


def _helper_file(
    given: str | os.PathLike[str] | None, stem: str, what: str, folders: Iterable[str | os.PathLike[str]]
) -> Path:
    if given is not None:
        return Path(given)
    found = find_face_file(stem, folders)
    if found is None:
        where = ", ".join(str(f) for f in face_folders(folders)) or f"no folder (set ${FACE_DIR_ENV})"
        raise InputError(f"face restoration needs the {what} {stem}.safetensors: not found in {where}")
    return found


def _open_helper(
    path: str | os.PathLike[str] | None,
    stem: str,
    what: tuple[str, str],
    family: str,
    cls: str,
    backend: str,
    device: Any,
    folders: Iterable[str | os.PathLike[str]],
) -> Any:
    """The detector or parser stage ``cls`` of ``sdkit.pipelines.stages.<family>`` on ``path`` or
    ``<stem>.safetensors`` in the face folders, its tensors checked first (``what``: the short
    and the full description, for the errors)."""
    file = _helper_file(path, stem, what[0], folders)
    _check_kind(file, family, what[1])
    return _stage(family, cls)(file, backend=backend, device=device)


def open_face_detector(
    path: str | os.PathLike[str] | None = None,
    backend: str = "auto",
    device: Any = None,
    folders: Iterable[str | os.PathLike[str]] = (),
) -> FaceDetector:
    """RetinaFace (ResNet-50) from ``path`` or ``detection_Resnet50_Final.safetensors`` in the face folders."""
    what = ("face detector", "a RetinaFace (detection_Resnet50_Final) face detector")
    detector: FaceDetector = _open_helper(
        path, DETECTOR_STEM, what, "retinaface", "RetinaFaceDetector", backend, device, folders
    )
    return detector


def open_face_parser(
    path: str | os.PathLike[str] | None = None,
    backend: str = "auto",
    device: Any = None,
    folders: Iterable[str | os.PathLike[str]] = (),
) -> FaceParser:
    """ParseNet from ``path`` or ``parsing_parsenet.safetensors`` in the face folders."""
    what = ("face parser", "a ParseNet (parsing_parsenet) face parser")
    parser: FaceParser = _open_helper(path, PARSER_STEM, what, "parsenet", "ParseNetParser", backend, device, folders)
    return parser


@dataclass(frozen=True)
class FaceModels:
    """A restorer with the detector and parser it runs with (A1111's face helper)."""

    restorer: FaceRestorer
    detector: FaceDetector
    parser: FaceParser | None

    @property
    def name(self) -> str:
        return str(getattr(self.restorer, "name", "face restorer"))


def resolve_face_restorer(model: str | os.PathLike[str], folders: Iterable[str | os.PathLike[str]] = ()) -> Path:
    """A restorer file: a path, or A1111's name ("GFPGAN", "CodeFormer") / a file stem found in
    the face folders."""
    text = str(model)
    if text.lower().endswith((".safetensors", *_PICKLED)) or os.sep in text:
        return Path(text)
    stem = RESTORER_STEMS.get(text, next((s for n, s in RESTORER_STEMS.items() if n.lower() == text.lower()), text))
    found = find_face_file(stem, folders)
    if found is None:
        where = ", ".join(str(f) for f in face_folders(folders)) or f"no folder (set ${FACE_DIR_ENV})"
        raise InputError(f"unknown face restorer {text!r}: not a file, and no {stem}.safetensors in {where}")
    return found


_LOADED: dict[tuple[Any, ...], FaceModels] = {}
_KEEP = 2  # restorer sets kept compiled (a server switching GFPGAN / CodeFormer)


def _stamp(path: Path) -> int | None:
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return None


def load_face_models(
    model: str | os.PathLike[str],
    *,
    detector: str | os.PathLike[str] | None = None,
    parser: str | os.PathLike[str] | None = None,
    use_parse: bool = True,
    backend: str = "auto",
    device: Any = None,
    folders: Iterable[str | os.PathLike[str]] = (),
) -> FaceModels:
    """The restorer (by path or A1111's name), detector and parser (``use_parse``), compiled and
    reused while their files are unchanged (the last two sets)."""
    folders = list(folders)
    path = resolve_face_restorer(model, folders)
    folders.append(path.parent)  # the detector and parser may sit next to the restorer
    det = _helper_file(detector, DETECTOR_STEM, "face detector", folders)
    par = _helper_file(parser, PARSER_STEM, "face parser", folders) if use_parse else None
    files = [p for p in (path, det, par) if p is not None]
    key = (*((str(p.resolve()), _stamp(p)) for p in files), use_parse, backend, device)
    if key not in _LOADED:
        models = FaceModels(
            open_face_restorer(path, backend, device),
            open_face_detector(det, backend, device),
            open_face_parser(par, backend, device) if par is not None else None,
        )
        while len(_LOADED) >= _KEEP:
            _LOADED.pop(next(iter(_LOADED)))
        _LOADED[key] = models
    return _LOADED[key]


def restore_faces_with(
    image: Any, models: FaceModels, fidelity: float | None = None, visibility: float = 1.0
) -> tuple[Any, int]:
    """``restore_faces`` with a loaded ``FaceModels``."""
    return restore_faces(image, models.restorer, models.detector, models.parser, fidelity, visibility)


def restore(
    image: Any,
    model: str | os.PathLike[str],
    *,
    fidelity: float | None = None,
    visibility: float = 1.0,
    detector: str | os.PathLike[str] | None = None,
    parser: str | os.PathLike[str] | None = None,
    use_parse: bool = True,
    backend: str = "auto",
    device: Any = None,
    folders: Iterable[str | os.PathLike[str]] = (),
) -> Any:
    """Restore the faces in a PIL image (or an image file's path) as A1111 does, with a GFPGAN
    or CodeFormer ``.safetensors`` file (or A1111's name for one in ``$SDKIT_FACE_DIR``);
    ``fidelity``: CodeFormer's ``w``; ``visibility``: A1111's Extras blend. The detector
    (``detection_Resnet50_Final``) and parser (``parsing_parsenet``) are found in ``folders``,
    next to the restorer or in ``$SDKIT_FACE_DIR`` unless given. Returns a PIL image
    (``sdkit.restore_faces``).

        fixed = sdkit.restore_faces("photo.png", "codeformer-v0.1.0.safetensors", fidelity=0.7)
    """
    from sdkit.pipelines.stages.upscaler import opened_image

    models = load_face_models(
        model, detector=detector, parser=parser, use_parse=use_parse, backend=backend, device=device, folders=folders
    )
    result, _ = restore_faces_with(opened_image(image), models, fidelity, visibility)
    return result
