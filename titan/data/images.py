"""Image data of ``--task diffusion``: scikit-learn's digits or a folder of images, and the
shuffled, resumable batches of noisy images, targets and weights.

Sources (``--images``):

- ``digits``: the 1,797 8 x 8 handwritten digits (labels 0-9) that scikit-learn's wheel ships
  as ``sklearn/datasets/data/digits.csv.gz`` (UCI "Optical Recognition of Handwritten Digits",
  64 pixel values 0-16 then the label per line). The file is found with
  ``importlib.util.find_spec`` and read with the standard library: scikit-learn is never
  imported.
- a folder: one subfolder per class (labels follow the sorted subfolder names; files directly in
  the folder are class 0 when there are no subfolders; hidden files and folders are left out),
  PNG and JPEG files read with Pillow, 8-bit or 16-bit (scaled to 8 bits).

Every image is converted to the model's channels (1: grayscale, 3: RGB), resized so that its
shorter side is ``--image-size`` (bicubic) and centre-cropped to a square, then scaled from
[0, 255] (digits: [0, 16]) to [-1, 1]. The order is the sorted file order.

Batches (:class:`ImageBatches`) visit the N images once per epoch in an order drawn from
``(seed, epoch)``, as :class:`titan.data.text.PackedBatches` visits sequences; example ``g``
(ids count on across epochs) draws its noise, training timestep and label dropout from
``numpy.random.default_rng([seed, g])`` alone. The loader's whole state is the number of examples
consumed, which checkpoints store, so a resumed run sees exactly the batches it would have seen,
on any layout.
"""

from __future__ import annotations

import csv
import gzip
import hashlib
import importlib.util
import io
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError

from titan.diffusion.objectives import TRAIN_TIMESTEPS, Objective
from titan.errors import TitanError, first_line

DIGITS = "digits"
DIGITS_FILE = ("datasets", "data", "digits.csv.gz")
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")


@dataclass(frozen=True)
class ImageSet:
    """Images with their labels.

    Attributes:
        images: (N, H, W, C) float32 in [-1, 1].
        labels: (N,) int32 in [0, classes).
        classes: number of classes (the class names' count).
        source: ``digits`` or the folder.
        digest: sha256 of the pixels and labels (16 hex digits).
    """

    images: np.ndarray
    labels: np.ndarray
    classes: int
    source: str
    digest: str

    def record(self) -> dict:
        """The ``data`` section of ``run_start``."""
        h, w, c = self.images.shape[1:]
        return {
            "source": self.source,
            "images": len(self.images),
            "classes": self.classes,
            "shape": [h, w, c],
            "digest": self.digest,
        }


def digits_file() -> Path:
    """The digits file of the installed scikit-learn, found without importing it.

    Raises:
        TitanError: scikit-learn is not installed, or its wheel lacks the file.
    """
    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise TitanError(
            "--images digits needs scikit-learn installed (pip install 'titan-jax[diffusion]'), "
            "or give --images a folder"
        )
    path = Path(next(iter(spec.submodule_search_locations))).joinpath(*DIGITS_FILE)
    if not path.is_file():
        raise TitanError(f"--images digits: {path} is missing from the installed scikit-learn")
    return path


def read_digits() -> tuple[np.ndarray, np.ndarray]:
    """(1797, 8, 8) uint8 pixels scaled from 0-16 to 0-255, and (1797,) int32 labels."""
    with gzip.open(digits_file(), "rt") as handle:
        rows = np.array([[float(v) for v in row] for row in csv.reader(handle)], np.float64)
    pixels = np.round(rows[:, :64] * 255.0 / 16.0).astype(np.uint8).reshape(-1, 8, 8)
    return pixels, rows[:, 64].astype(np.int32)


def _fit(image, size: int):
    """The centre square of ``image`` at ``size`` x ``size``: what resizing the shorter side to
    ``size`` (bicubic) and centre-cropping gives, computed from the square's source region alone
    (PIL's ``resize(box=...)``), so a 1 x 2,000,000 strip never becomes a 32 x 64,000,000
    image on the way."""
    w, h = image.size
    scale = size / min(w, h)
    rw, rh = max(size, round(w * scale)), max(size, round(h * scale))
    left, top = (rw - size) // 2, (rh - size) // 2
    box = (left * w / rw, top * h / rh, (left + size) * w / rw, (top + size) * h / rh)
    return image.resize((size, size), Image.Resampling.BICUBIC, box=box)


def _scaled(pixels: np.ndarray) -> np.ndarray:
    """uint8 [0, 255] -> float32 [-1, 1]."""
    return (pixels.astype(np.float32) / 127.5 - 1.0).astype(np.float32)


def _digest(images: np.ndarray, labels: np.ndarray) -> str:
    h = hashlib.sha256(images.tobytes())
    h.update(labels.tobytes())
    return h.hexdigest()[:16]


def _mode(channels: int) -> str:
    if channels not in (1, 3):
        raise TitanError(f"--images: images have 1 or 3 channels, the model takes {channels}")
    return "L" if channels == 1 else "RGB"


def load_digits(size: int, channels: int) -> ImageSet:
    """scikit-learn's digits at ``size`` x ``size`` x ``channels``."""
    pixels, labels = read_digits()
    mode = _mode(channels)
    if size != 8 or channels != 1:
        pixels = np.stack(
            [np.asarray(_fit(Image.fromarray(p, "L").convert(mode), size)) for p in pixels]
        )
    images = _scaled(pixels.reshape(len(pixels), size, size, channels))
    return ImageSet(images, labels, 10, DIGITS, _digest(images, labels))


def _visible(folder: Path) -> list[Path]:
    """The entries of ``folder`` not hidden (``.ipynb_checkpoints``, macOS's ``._`` files),
    sorted."""
    return sorted(p for p in folder.iterdir() if not p.name.startswith("."))


def _images_in(folder: Path) -> list[Path]:
    return [f for f in _visible(folder) if f.suffix.lower() in IMAGE_SUFFIXES and f.is_file()]


def _folder_files(root: Path, spec: str) -> tuple[list[tuple[Path, int]], int]:
    """(each image with its label, the number of classes) of a folder: one class per
    subfolder, else one class of the images in it.

    Raises:
        TitanError: images both in the folder and in subfolders, or a subfolder without one.
    """
    classes = [p for p in _visible(root) if p.is_dir()]
    if not classes:
        return [(f, 0) for f in _images_in(root)], 1
    if loose := _images_in(root):
        raise TitanError(
            f"--images {spec}: {loose[0].name} and others lie beside the class subfolders; "
            "put every image in a class subfolder, or use no subfolders"
        )
    files = [(f, label) for label, folder in enumerate(classes) for f in _images_in(folder)]
    labelled = {label for _, label in files}
    for label, folder in enumerate(classes):
        if files and label not in labelled:
            raise TitanError(
                f"--images {spec}: class subfolder {folder.name} holds no .png, .jpg or .jpeg "
                "file (each subfolder is a class)"
            )
    return files, len(classes)


def _eight_bit(image: Image.Image, file: Path) -> Image.Image:
    """``image`` with 8-bit channels: 16-bit grayscale (Pillow's ``I;16`` modes, and ``I``
    holding 16-bit values) scaled from [0, 65535] to [0, 255]; others as they are.

    Raises:
        TitanError: an image of floats, or of integers past 16 bits.
    """
    if image.mode == "F":
        raise TitanError(f"--images: {file} holds floating-point pixels (8 or 16 bits read)")
    if not image.mode.startswith("I"):
        return image
    pixels = np.asarray(image, np.float64)
    if pixels.size and (pixels.min() < 0 or pixels.max() > 65535):
        raise TitanError(f"--images: {file} holds pixels past 16 bits (8 or 16 bits read)")
    return Image.fromarray(np.round(pixels * (255 / 65535)).astype(np.uint8), "L")


def load_folder(path: str, size: int, channels: int) -> ImageSet:
    """The PNG/JPEG images under ``path`` (class subfolders) at ``size`` x ``size`` x ``channels``;
    hidden files and folders are left out.

    Raises:
        TitanError: the folder does not exist, holds no image, mixes images and class
            subfolders, has a class subfolder without images, or an image cannot be read (or
            holds floating-point pixels, or integers past 16 bits).
    """
    root = Path(path)
    if not root.is_dir():
        raise TitanError(f"--images {path}: not 'digits' nor a folder")
    files, classes = _folder_files(root, path)
    if not files:
        raise TitanError(f"--images {path}: no .png, .jpg or .jpeg files in it or its subfolders")
    mode, arrays = _mode(channels), []
    for file, _ in files:
        try:
            with Image.open(file) as image:
                pixels = _fit(_eight_bit(image, file).convert(mode), size)
                arrays.append(np.asarray(pixels, np.uint8))
        except (OSError, UnidentifiedImageError, Image.DecompressionBombError) as err:
            raise TitanError(f"--images: cannot read {file}: {first_line(err)}") from None
    images = _scaled(np.stack(arrays).reshape(len(arrays), size, size, channels))
    labels = np.array([label for _, label in files], np.int32)
    return ImageSet(images, labels, classes, str(root), _digest(images, labels))


def open_images(source: str, size: int, channels: int) -> ImageSet:
    """``--images``: ``digits`` or a folder (see the module docstring)."""
    if source == DIGITS:
        return load_digits(size, channels)
    return load_folder(source, size, channels)


def encode_png(pixels: np.ndarray) -> bytes:
    """(H, W, C) uint8 with C 1 or 3 as PNG bytes."""
    buffer = io.BytesIO()
    image = pixels[..., 0] if pixels.shape[-1] == 1 else pixels
    Image.fromarray(image, "L" if pixels.shape[-1] == 1 else "RGB").save(buffer, "PNG")
    return buffer.getvalue()


@dataclass
class ImageBatches:
    """Training batches of a diffusion run (see the module docstring).

    Args:
        data: the images.
        objective: what the model predicts and how each example is weighted.
        batch_size: examples per batch.
        seed: shuffling and noise seed.
        label_dropout: probability that an example's label is ``null_label``.
        null_label: the label of unconditional examples (the label table's last row; the
            number of classes by default).
        position: examples consumed so far (saved in checkpoints).
        rows: the rows of each batch to materialise (None: all).

    Raises:
        TitanError: fewer images than one batch.
    """

    data: ImageSet
    objective: Objective
    batch_size: int
    seed: int
    label_dropout: float
    null_label: int = -1
    position: int = 0
    rows: np.ndarray | None = None
    _orders: dict[int, np.ndarray] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self.null_label < 0:
            self.null_label = self.data.classes
        if self.num_sequences < self.batch_size:
            raise TitanError(
                f"--images has {self.num_sequences} image{'s' * (self.num_sequences != 1)}, "
                "fewer than --batch-size "
                f"{self.batch_size}"
            )

    @property
    def num_sequences(self) -> int:
        """Images per epoch (named as the text loader's, for the checkpoints' resume check)."""
        return len(self.data.images)

    @property
    def data_digest(self) -> str:
        """The images' and labels' digest (:attr:`ImageSet.digest`), kept in checkpoints."""
        return self.data.digest

    def _order(self, epoch: int) -> np.ndarray:
        if epoch not in self._orders:
            self._orders = {
                epoch: np.random.default_rng([self.seed, epoch]).permutation(len(self.data.images))
            }
        return self._orders[epoch]

    def example_ids(self, position: int) -> np.ndarray:
        """(batch_size,) int64 ids of the batch starting at ``position``: place ``j`` of epoch
        ``e`` is example ``e * N + order_e[j]``."""
        ids = np.empty(self.batch_size, dtype=np.int64)
        for i, index in enumerate(range(position, position + self.batch_size)):
            epoch, offset = divmod(index, self.num_sequences)
            ids[i] = epoch * self.num_sequences + self._order(epoch)[offset]
        return ids

    def draws(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(noise (R, H, W, C) float64, timestep indices (R,), dropped (R,) bool) of examples
        ``ids``, each from ``default_rng([seed, id])``."""
        shape = self.data.images.shape[1:]
        noise, steps, dropped = [], [], []
        for g in ids:
            rng = np.random.default_rng([self.seed, int(g)])
            noise.append(rng.standard_normal(shape))
            steps.append(rng.integers(0, TRAIN_TIMESTEPS))
            dropped.append(rng.random() < self.label_dropout)
        return np.stack(noise), np.array(steps), np.array(dropped)

    def batch_of(self, ids: np.ndarray) -> dict[str, np.ndarray]:
        """The batch of examples ``ids``: ``noisy``, ``t``, ``labels``, ``target``, ``weight``."""
        images = self.data.images[ids % self.num_sequences]
        labels = self.data.labels[ids % self.num_sequences]
        noise, steps, dropped = self.draws(ids)
        noisy, target, weight = self.objective.example(images, noise, steps)
        labels = np.where(dropped, self.null_label, labels).astype(np.int32)
        t = self.objective.model_timesteps(steps)
        return {"noisy": noisy, "t": t, "labels": labels, "target": target, "weight": weight}

    def next_batch(self) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """The next batch (its :attr:`rows`) and the whole batch's example ids; advances
        :attr:`position`."""
        ids = self.example_ids(self.position)
        batch = self.batch_of(ids if self.rows is None else ids[self.rows])
        self.position += self.batch_size
        return batch, ids
