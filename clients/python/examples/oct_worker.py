"""An OCT-style worker in Python: each `oct.analyze` task names a synthetic B-scan (its size,
noise and seed); the worker makes it, denoises it (a 5x5 box filter, twice), segments the
retina-like band by Otsu's threshold and returns structured measurements.

    python oct_worker.py --server http://127.0.0.1:7700 --gpus 2
"""

from __future__ import annotations

import argparse

import numpy as np

from sluice_client import Client, InvalidInputError, Job, Worker


def synthetic_bscan(size: int, noise: float, seed: int) -> np.ndarray:
    """A bright curved band (the "retina") on a dark background, with speckle-like noise."""
    rng = np.random.default_rng(seed)
    rows, cols = np.mgrid[0:size, 0:size].astype(np.float32)
    top = size * (0.35 + 0.08 * np.sin(cols / size * 2 * np.pi + seed % 7))
    thickness = size * (0.18 + 0.04 * np.cos(cols / size * 3 * np.pi))
    band = ((rows >= top) & (rows < top + thickness)).astype(np.float32)
    return band * 0.8 + 0.1 + rng.normal(0.0, noise, (size, size)).astype(np.float32)


def box_filter(image: np.ndarray, radius: int = 2) -> np.ndarray:
    padded = np.pad(image, radius, mode="edge")
    size = 2 * radius + 1
    total = np.zeros_like(image)
    for dy in range(size):
        for dx in range(size):
            total += padded[dy:dy + image.shape[0], dx:dx + image.shape[1]]
    return total / (size * size)


def otsu_threshold(image: np.ndarray, bins: int = 256) -> float:
    counts, edges = np.histogram(image, bins=bins)
    centres = (edges[:-1] + edges[1:]) / 2
    weight_low = np.cumsum(counts)
    weight_high = weight_low[-1] - weight_low
    mean_low = np.cumsum(counts * centres) / np.maximum(weight_low, 1)
    total_mean = (counts * centres).sum()
    mean_high = (total_mean - np.cumsum(counts * centres)) / np.maximum(weight_high, 1)
    between = weight_low * weight_high * (mean_low - mean_high) ** 2
    return float(centres[int(np.argmax(between))])


def analyze(payload: dict) -> dict:
    size = int(payload.get("size", 128))
    if not 16 <= size <= 1024:
        raise InvalidInputError(f"size must be 16 to 1024 pixels, not {size}")
    image = synthetic_bscan(size, float(payload.get("noise", 0.2)), int(payload.get("seed", 0)))
    smooth = box_filter(box_filter(image))
    threshold = otsu_threshold(smooth)
    mask = smooth > threshold
    columns = mask.any(axis=0)
    top = np.argmax(mask, axis=0)[columns]
    thickness = mask.sum(axis=0)[columns]
    signal, background = smooth[mask].mean(), smooth[~mask]
    return {
        "exam": payload.get("exam"),
        "threshold": round(threshold, 4),
        "foreground_fraction": round(float(mask.mean()), 4),
        "layer_top_px_mean": round(float(top.mean()), 2) if top.size else None,
        "thickness_px_mean": round(float(thickness.mean()), 2) if thickness.size else None,
        "thickness_px_max": int(thickness.max()) if thickness.size else 0,
        "snr_db": round(float(20 * np.log10(signal / max(background.std(), 1e-6))), 2),
    }


def execute(job: Job) -> dict:
    job.check()
    return analyze(job.payload or {})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", default="http://127.0.0.1:7700")
    parser.add_argument("--id", default="py-oct")
    parser.add_argument("--gpus", type=int, default=1)
    parser.add_argument("--token")
    parser.add_argument("--ca-file")
    args = parser.parse_args()
    client = Client(args.server, token=args.token, ca_file=args.ca_file)
    worker = Worker(client, args.id, execute, gpus=args.gpus, kinds=["oct.analyze"])
    stats = worker.run()
    print(f"drained: {stats.line()}", flush=True)


if __name__ == "__main__":
    main()
