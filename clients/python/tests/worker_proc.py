"""A worker process for the tests: runs `exec_ms` of stand-in GPU work per task, fails a
deterministic `fail_percent` of attempts as transient, and prints its stats when it drains."""

from __future__ import annotations

import argparse
import logging
import time
import zlib

from sluice_client import Client, Job, TransientError, Worker


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--server", required=True)
    parser.add_argument("--id", required=True)
    parser.add_argument("--gpus", type=int, default=2)
    parser.add_argument("--exec-ms", type=int, default=20)
    parser.add_argument("--fail-percent", type=int, default=0)
    parser.add_argument("--token")
    parser.add_argument("--ca-file")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)

    def execute(job: Job) -> dict:
        # Stand-in GPU work that notices a cancel between steps.
        ends = time.monotonic() + args.exec_ms / 1000
        while time.monotonic() < ends:
            job.check()
            time.sleep(min(0.01, max(0.0, ends - time.monotonic())))
        roll = zlib.crc32(f"{job.task.id}:{job.attempt}".encode()) % 100
        if roll < args.fail_percent:
            raise TransientError(f"simulated GPU fault on attempt {job.attempt}")
        return {"worker": args.id, "attempt": job.attempt, "gpu": job.gpu}

    client = Client(args.server, token=args.token, ca_file=args.ca_file)
    worker = Worker(client, args.id, execute, gpus=args.gpus, claim_wait_ms=1000)
    print(f"worker {args.id} running", flush=True)
    stats = worker.run()
    print(f"drained: {stats.line()}", flush=True)


if __name__ == "__main__":
    main()
