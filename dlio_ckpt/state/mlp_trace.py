"""A real, tiny training run: the reference the `sgd` model's deltas are judged against.

An MLP (64-128-128-10, ReLU, 26,122 parameters) learns a fixed random teacher network's labels on
fresh Gaussian inputs with plain minibatch SGD, its learning rate decaying as the `sgd` model's
(values.decay). Everything is seeded: the parameters at step s are the same in every process,
whatever steps were asked for before (each step's batch has its own seed). The `trace` update
model tiles these parameters over a checkpoint file, so the deltas a codec sees are those of
real SGD on a real loss surface.
"""

from __future__ import annotations

import numpy as np
from threadpoolctl import threadpool_limits

from dlio_ckpt.state.values import decay

SIZES = (64, 128, 128, 10)
_TEACHER = ((64, 32), (32, 10))  # the labelling network's layers
BATCH = 64
LEARNING_RATE = 0.05  # the MLP's own step at step 0 (checkpoint.learning_rate scales `sgd` only)
_KEEP = 4  # parameter snapshots kept besides step 0 (the latest asked for)
_HELD_OUT = 1 << 40  # the seed of the held-out batch (no training step has it)


class MlpTrace:
    """The MLP's flattened parameters (float32) at any training step."""

    def __init__(self, seed: int) -> None:
        self._seed = seed & ((1 << 64) - 1)
        rng = self._rng(0)
        self._teacher = [(rng.standard_normal((m, n)) / np.sqrt(m)).astype(np.float32) for m, n in _TEACHER]
        layers = []
        for m, n in zip(SIZES[:-1], SIZES[1:]):
            layers += [(rng.standard_normal((m, n)) * np.sqrt(2.0 / m)).astype(np.float32), np.zeros(n, np.float32)]
        self._snapshots: dict[int, list[np.ndarray]] = {0: layers}

    @property
    def size(self) -> int:
        return sum(m * n + n for m, n in zip(SIZES[:-1], SIZES[1:]))

    def _rng(self, step: int) -> np.random.Generator:
        return np.random.Generator(np.random.PCG64(np.random.SeedSequence([self._seed, 0x7ACE, step])))

    def params_at(self, step: int) -> np.ndarray:
        """Every weight and bias after `step` SGD steps, flattened, as float32."""
        return np.concatenate([p.ravel() for p in self._layers_at(step)])

    def loss(self, step: int) -> float:
        """Cross-entropy on a held-out batch after `step` steps: that the run really learns (tests)."""
        x, labels = self._batch(self._rng(_HELD_OUT), 1024)
        logits = self._forward(self._layers_at(step), x)[-1]
        logits -= logits.max(axis=1, keepdims=True)
        return float(np.mean(np.log(np.exp(logits).sum(axis=1)) - logits[np.arange(len(x)), labels]))

    def _layers_at(self, step: int) -> list[np.ndarray]:
        if step < 0:
            raise ValueError(f"no training step {step}")
        start = max(s for s in self._snapshots if s <= step)
        layers = [p.copy() for p in self._snapshots[start]]
        with threadpool_limits(1):  # tiny products: BLAS threads only contend (4-20x slower on a busy host)
            for s in range(start + 1, step + 1):
                self._sgd_step(layers, s)
        self._snapshots.pop(step, None)
        self._snapshots[step] = layers  # newest last
        while len(self._snapshots) > _KEEP + 1:  # step 0 stays: the way back from anywhere
            del self._snapshots[next(s for s in self._snapshots if s != 0)]
        return layers

    def _batch(self, rng: np.random.Generator, size: int) -> tuple[np.ndarray, np.ndarray]:
        x = rng.standard_normal((size, SIZES[0]), dtype=np.float32)
        hidden = x
        for w in self._teacher[:-1]:
            hidden = np.tanh(hidden @ w)
        return x, np.argmax(hidden @ self._teacher[-1], axis=1)

    @staticmethod
    def _forward(layers: list[np.ndarray], x: np.ndarray) -> list[np.ndarray]:
        outputs = [x]
        for i in range(0, len(layers), 2):
            z = outputs[-1] @ layers[i] + layers[i + 1]
            outputs.append(np.maximum(z, 0.0) if i + 2 < len(layers) else z)
        return outputs

    def _sgd_step(self, layers: list[np.ndarray], step: int) -> None:
        x, labels = self._batch(self._rng(step), BATCH)
        outputs = self._forward(layers, x)
        logits = outputs[-1] - outputs[-1].max(axis=1, keepdims=True)
        grad = np.exp(logits)
        grad /= grad.sum(axis=1, keepdims=True)
        grad[np.arange(len(x)), labels] -= 1.0
        grad /= len(x)
        rate = np.float32(LEARNING_RATE * float(decay(step)))
        for i in range(len(layers) - 2, -1, -2):
            below = outputs[i // 2]
            weight_grad, bias_grad = below.T @ grad, grad.sum(axis=0)
            if i:
                grad = (grad @ layers[i].T) * (below > 0)
            layers[i] -= rate * weight_grad
            layers[i + 1] -= rate * bias_grad
