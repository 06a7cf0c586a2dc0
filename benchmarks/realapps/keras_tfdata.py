"""A Keras CNN trained on tf.data over TFRecords, checkpointed with tf.train.CheckpointManager.

Written after TensorFlow's guides "Better performance with the tf.data API" (list_files, interleave
of TFRecordDataset, map with num_parallel_calls, batch, prefetch, all AUTOTUNE) and "Training
checkpoints" (a custom loop with tf.GradientTape and a tf.function train step;
`tf.train.Checkpoint(step=..., optimizer=..., net=...)` saved by a
`tf.train.CheckpointManager(..., max_to_keep=3)`), saving once per epoch.

Samples are the TFRecords dlio_ckpt generates (dataset.format: tfrecord): tf.train.Example
{"image": bytes (side*side*3 uint8), "label": int64}.

A reference program, not part of dlio_ckpt; its emulation is keras_tfdata.yaml (fidelity.py).
It writes its timings as JSON (--metrics): the time the loop blocked in the iterator (data
wait), compute, checkpoint seconds per save, loop wall time.
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402
import keras  # noqa: E402

from loop_clock import LoopClock, report  # noqa: E402


def make_dataset(pattern: str, batch_size: int, side: int, seed: int) -> tf.data.Dataset:
    features = {"image": tf.io.FixedLenFeature([], tf.string), "label": tf.io.FixedLenFeature([], tf.int64)}

    def parse(record):
        example = tf.io.parse_single_example(record, features)
        image = tf.reshape(tf.io.decode_raw(example["image"], tf.uint8), (side, side, 3))
        return tf.cast(image, tf.float32) / 255.0, example["label"] % 10

    files = tf.data.Dataset.list_files(pattern, shuffle=True, seed=seed)
    return (files.interleave(tf.data.TFRecordDataset, cycle_length=tf.data.AUTOTUNE, num_parallel_calls=tf.data.AUTOTUNE)
            .shuffle(1024, seed=seed)
            .map(parse, num_parallel_calls=tf.data.AUTOTUNE)
            .batch(batch_size)
            .prefetch(tf.data.AUTOTUNE))


def make_model(width: int, side: int) -> keras.Model:
    return keras.Sequential([
        keras.Input((side, side, 3)),
        keras.layers.Conv2D(width, 3, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Conv2D(2 * width, 3, padding="same", activation="relu"),
        keras.layers.MaxPooling2D(),
        keras.layers.Conv2D(4 * width, 3, padding="same", activation="relu"),
        keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(8 * width, activation="relu"),
        keras.layers.Dense(10),
    ])


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True, help="folder of .tfrecord files (searched recursively)")
    p.add_argument("--checkpoints", required=True, help="CheckpointManager directory")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--width", type=int, default=32)
    p.add_argument("--side", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--metrics", default="")
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    tf.random.set_seed(args.seed)
    pattern = os.path.join(args.data, "**", "*.tfrecord") if tf.io.gfile.glob(os.path.join(args.data, "**", "*.tfrecord")) \
        else os.path.join(args.data, "*", "*", "*.tfrecord")
    dataset = make_dataset(pattern, args.batch_size, args.side, args.seed)
    net = make_model(args.width, args.side)
    opt = keras.optimizers.Adam(1e-3)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    ckpt = tf.train.Checkpoint(step=tf.Variable(0, dtype=tf.int64), optimizer=opt, net=net)
    manager = tf.train.CheckpointManager(ckpt, args.checkpoints, max_to_keep=3)

    @tf.function
    def train_step(images, labels):
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, net(images, training=True))
        grads = tape.gradient(loss, net.trainable_variables)
        opt.apply_gradients(zip(grads, net.trainable_variables))
        return loss

    samples = 0
    clock = LoopClock()
    for _ in range(args.epochs):
        for images, labels in clock.batches(dataset):
            train_step(images, labels).numpy()
            ckpt.step.assign_add(1)
            samples += int(images.shape[0])
        with clock.save():
            manager.save()
    report({"program": "keras_tfdata", "samples": samples, **clock.figures()}, args.metrics)

if __name__ == "__main__":
    main()
