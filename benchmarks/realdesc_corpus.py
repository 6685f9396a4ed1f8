"""A real-descriptor retrieval corpus from photos that Python packages ship (issue 39).

VLAD of RootSIFT (64 words x 128 = 8192-D, as in the paper), built with OpenCV from the
photos bundled in scikit-image's data folder, scikit-learn's sample images and
matplotlib's sample data: nothing is downloaded. 13 photos are the instances, each with
``variants`` near-duplicates (crop, scale, rotation, JPEG, noise): the first
``queries_per`` of each are queries, the others the database. The codebook and the
negatives come from the other, held-apart photos (their own variants): no instance
photo is seen by any fit. Everything is seeded: the same packages give the same corpus,
written once as a zarr corpus group (``slem-dask evaluate --corpus``) and reused.

This corpus is small and easy (13 instances, near-duplicates of one photo each): it
checks the methods on real descriptors at the paper's width; it is not Holidays.
"""

from __future__ import annotations

import hashlib
import json
import os

import numpy as np

#: Photos that are the instances (package, file).
INSTANCES = [
    ("skimage", "astronaut.png"),
    ("skimage", "camera.png"),
    ("skimage", "chelsea.png"),
    ("skimage", "coffee.png"),
    ("skimage", "coins.png"),
    ("skimage", "rocket.jpg"),
    ("skimage", "moon.png"),
    ("skimage", "hubble_deep_field.jpg"),
    ("skimage", "ihc.png"),
    ("skimage", "retina.jpg"),
    ("sklearn", "china.jpg"),
    ("sklearn", "flower.jpg"),
    ("matplotlib", "grace_hopper.jpg"),
]
#: Held-apart photos: the codebook and the negatives (the stereo pair of motorcycles is
#: on this side as a whole, so that no negative is a view of an instance).
HELD_APART = [
    ("skimage", "brick.png"),
    ("skimage", "cell.png"),
    ("skimage", "chessboard_RGB.png"),
    ("skimage", "clock_motion.png"),
    ("skimage", "color.png"),
    ("skimage", "grass.png"),
    ("skimage", "gravel.png"),
    ("skimage", "horse.png"),
    ("skimage", "logo.png"),
    ("skimage", "microaneurysms.png"),
    ("skimage", "motorcycle_left.png"),
    ("skimage", "motorcycle_right.png"),
    ("skimage", "page.png"),
    ("skimage", "phantom.png"),
    ("skimage", "text.png"),
    ("matplotlib", "Minduka_Present_Blue_Pack.png"),
    ("matplotlib", "logo2.png"),
]

WORDS = 64  # VLAD: 64 x 128 = 8192 dimensions
MAX_SIDE = 400  # images are brought to at most this side before SIFT
SIFT_FEATURES = 600


def photo_path(package: str, name: str) -> str:
    if package == "skimage":
        import skimage

        return os.path.join(os.path.dirname(skimage.__file__), "data", name)
    if package == "sklearn":
        import sklearn

        return os.path.join(os.path.dirname(sklearn.__file__), "datasets", "images", name)
    import matplotlib

    return os.path.join(matplotlib.get_data_path(), "sample_data", name)


def load_gray(package: str, name: str) -> np.ndarray:
    import cv2

    path = photo_path(package, name)
    image = cv2.imread(path, cv2.IMREAD_GRAYSCALE)
    if image is None:
        raise FileNotFoundError(f"{package} ships no readable photo {name!r} (looked at {path})")
    return _fit_side(image, MAX_SIDE)


def _fit_side(image: np.ndarray, side: int) -> np.ndarray:
    import cv2

    scale = side / max(image.shape)
    if scale >= 1:
        return image
    size = (max(8, round(image.shape[1] * scale)), max(8, round(image.shape[0] * scale)))
    return cv2.resize(image, size, interpolation=cv2.INTER_AREA)


def variant(image: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A near-duplicate: crop (60-100% of each side), scale (0.6-1.1), rotation
    (-15 to 15 degrees), JPEG (quality 30-90), Gaussian noise (sigma 0-6)."""
    import cv2

    h, w = image.shape
    ch, cw = int(h * rng.uniform(0.6, 1.0)), int(w * rng.uniform(0.6, 1.0))
    y, x = int(rng.integers(0, h - ch + 1)), int(rng.integers(0, w - cw + 1))
    out = image[y : y + ch, x : x + cw]
    scale = rng.uniform(0.6, 1.1)
    out = cv2.resize(out, (max(16, int(cw * scale)), max(16, int(ch * scale))))
    angle = rng.uniform(-15, 15)
    rot = cv2.getRotationMatrix2D((out.shape[1] / 2, out.shape[0] / 2), angle, 1.0)
    out = cv2.warpAffine(out, rot, (out.shape[1], out.shape[0]), borderMode=cv2.BORDER_REFLECT)
    ok, buf = cv2.imencode(".jpg", out, [cv2.IMWRITE_JPEG_QUALITY, int(rng.integers(30, 91))])
    out = cv2.imdecode(buf, cv2.IMREAD_GRAYSCALE)
    noise = rng.normal(0.0, rng.uniform(0.0, 6.0), out.shape)
    return np.clip(out.astype(np.float64) + noise, 0, 255).astype(np.uint8)


def rootsift(image: np.ndarray) -> np.ndarray:
    """RootSIFT descriptors (n, 128) float32: SIFT, L1-normalized, square-rooted."""
    import cv2

    sift = cv2.SIFT_create(nfeatures=SIFT_FEATURES)
    _, desc = sift.detectAndCompute(image, None)
    if desc is None:
        return np.zeros((0, 128), dtype=np.float32)
    desc = desc / np.maximum(desc.sum(axis=1, keepdims=True), 1e-12)
    return np.sqrt(desc).astype(np.float32)


def vlad(desc: np.ndarray, centres: np.ndarray) -> np.ndarray:
    """VLAD (words x 128): residuals to the nearest word summed, signed square root,
    L2-normalized (Jegou et al.; Arandjelovic and Zisserman's power normalization)."""
    out = np.zeros(centres.shape, dtype=np.float64)
    if len(desc):
        d2 = (desc**2).sum(1)[:, None] - 2 * desc @ centres.T + (centres**2).sum(1)[None, :]
        nearest = np.argmin(d2, axis=1)
        np.add.at(out, nearest, desc - centres[nearest])
    out = np.sign(out) * np.sqrt(np.abs(out))
    norm = np.linalg.norm(out)
    return (out / norm if norm > 0 else out).ravel().astype(np.float32)


def codebook(held_apart: list[np.ndarray], seed: int) -> np.ndarray:
    """WORDS k-means centres of RootSIFT from 8 variants of each held-apart photo."""
    from sklearn.cluster import KMeans

    rng = np.random.default_rng(seed)
    sample = np.concatenate([rootsift(variant(img, rng)) for img in held_apart for _ in range(8)])
    return (
        KMeans(WORDS, n_init=2, random_state=seed).fit(sample).cluster_centers_.astype(np.float32)
    )


def key(variants: int, queries_per: int, negatives: int, seed: int) -> str:
    """What the cached corpus depends on: its settings and the packages' versions."""
    import cv2
    import matplotlib
    import skimage
    import sklearn

    facts = [variants, queries_per, negatives, seed, WORDS, MAX_SIDE, SIFT_FEATURES]
    facts += [INSTANCES, HELD_APART, cv2.__version__, skimage.__version__]
    facts += [sklearn.__version__, matplotlib.__version__]
    return hashlib.sha256(json.dumps(facts).encode()).hexdigest()[:12]


def build(path: str, variants=23, queries_per=3, negatives=3000, seed=0, say=print) -> str:
    """Write the corpus group at ``path`` (a zarr corpus: negatives, database, queries
    and their labels), unless one with the same key is there. Returns ``path``."""
    import cv2

    from slem_dask import storage
    from slem_dask.datasets import Corpus, write_corpus

    wanted = key(variants, queries_per, negatives, seed)
    if os.path.exists(path):
        try:
            if storage.open_node(path).attrs.get("realdesc_key") == wanted:
                say(f"corpus: {path} (cached, key {wanted})")
                return path
        except Exception:  # noqa: BLE001 - an unfinished or foreign folder: rebuilt
            pass
    cv2.setNumThreads(1)  # the machine is shared; deterministic too
    rng = np.random.default_rng(seed)
    apart = [load_gray(*p) for p in HELD_APART]
    centres = codebook(apart, seed)
    say(f"corpus: codebook of {WORDS} words from {len(apart)} held-apart photos")
    neg = np.stack(
        [vlad(rootsift(variant(apart[i % len(apart)], rng)), centres) for i in range(negatives)]
    )
    say(f"corpus: {negatives} negatives")
    db, q, db_labels, q_labels = [], [], [], []
    for label, photo in enumerate(INSTANCES):
        image = load_gray(*photo)
        for j in range(variants):
            row = vlad(rootsift(variant(image, rng)), centres)
            (q if j < queries_per else db).append(row)
            (q_labels if j < queries_per else db_labels).append(label)
    corpus = Corpus(
        negatives=neg,
        database=np.stack(db),
        queries=np.stack(q),
        database_labels=np.asarray(db_labels, dtype=np.int64),
        query_labels=np.asarray(q_labels, dtype=np.int64),
    )
    # a new committed version: an interrupted build is never taken for a corpus
    write_corpus(corpus, path, chunk_rows=512, attrs={"realdesc_key": wanted})
    say(f"corpus: {path} written ({len(db)} database rows, {len(q)} queries, key {wanted})")
    return path
