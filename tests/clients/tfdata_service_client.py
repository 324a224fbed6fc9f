"""A tf.data service job on one machine: the main process runs the
dispatcher and reads a distributed dataset; a second process (this file
with --worker) runs the tf.data service worker that produces its elements.
With --leak worker, the worker process keeps 64 KiB every 10 ms on a thread
of its own (a metrics buffer that is never trimmed), as long as it serves.

    tfdata_service_client.py [--elements N] [--leak worker|none]

Prints ELEMENTS (how many the main process read), then DONE."""

import argparse
import os
import subprocess
import sys
import threading
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

KEPT = []


def keep_metrics():
    while True:
        KEPT.append(np.full((128, 128), float(len(KEPT)), dtype=np.float32))  # LEAK_SITE(worker): 64 KiB
        time.sleep(0.01)


def run_worker(dispatcher, leak):
    worker = tf.data.experimental.service.WorkerServer(
        tf.data.experimental.service.WorkerConfig(dispatcher_address=dispatcher))
    if leak == "worker":
        threading.Thread(target=keep_metrics, daemon=True).start()
    worker.join()


def make_element(i):
    return tf.fill((128, 128), tf.cast(i, tf.float32))


def run_main(args):
    dispatcher = tf.data.experimental.service.DispatchServer()
    address = dispatcher.target.split("://")[1]
    worker = subprocess.Popen([sys.executable, __file__, "--worker", address, "--leak", args.leak])
    try:
        dataset = tf.data.Dataset.range(args.elements).map(make_element)
        dataset = dataset.apply(tf.data.experimental.service.distribute(
            processing_mode="parallel_epochs", service=dispatcher.target))
        count = 0
        for element in dataset:
            assert element.shape == (128, 128)
            count += 1
            time.sleep(0.01)  # the training step
        print("ELEMENTS=%d" % count, flush=True)
    finally:
        worker.terminate()
        worker.wait()
    print("DONE", flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--worker")
    parser.add_argument("--elements", type=int, default=800)
    parser.add_argument("--leak", choices=("worker", "none"), default="worker")
    args = parser.parse_args()
    if args.worker:
        run_worker(args.worker, args.leak)
    else:
        run_main(args)


if __name__ == "__main__":
    main()
