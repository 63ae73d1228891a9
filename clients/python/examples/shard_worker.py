"""A vector shard worker in Python: holds shard I of N of an `.npy` file (rows
[I·n/N, (I+1)·n/N), ids = row numbers, as `sluice worker --vectors` does) and answers the
`vector.search` children of that shard with an exact numpy scan.

    python shard_worker.py --server http://127.0.0.1:7700 --vectors base.npy --shard 0/4
"""

from __future__ import annotations

import argparse

import numpy as np

from sluice_client import Client, InvalidInputError, Job, ShardAnnouncement, Worker


class ShardSearch:
    def __init__(self, path: str, shard: int, shards: int):
        data = np.load(path, mmap_mode="r")
        if data.ndim != 2:
            raise SystemExit(f"{path}: a 2-D array of vectors is needed, not {data.ndim}-D")
        rows = data.shape[0]
        self.first, last = rows * shard // shards, rows * (shard + 1) // shards
        self.data = np.ascontiguousarray(data[self.first:last], dtype=np.float32)
        self.ids = np.arange(self.first, last, dtype=np.int64)
        self.shard, self.shards = shard, shards

    def execute(self, job: Job) -> dict:
        query = job.payload or {}
        vector = np.asarray(query.get("vector", []), dtype=np.float32)
        if vector.shape != (self.data.shape[1],):
            raise InvalidInputError(f"the query has {vector.size} dimensions; "
                                    f"this shard holds {self.data.shape[1]}")
        selected = self.select(query.get("filter", {}))
        data, ids = self.data[selected], self.ids[selected]
        if query.get("metric", "l2") == "ip":
            distances = -(data @ vector)
        else:
            diff = data - vector
            distances = np.einsum("ij,ij->i", diff, diff)
        k = min(int(query.get("k", 10)), len(ids))
        # Nearest first, ties to the lower id (as the Rust worker breaks them).
        nearest = np.lexsort((ids, distances))[:k]
        hits = [{"id": int(ids[i]), "distance": float(distances[i])} for i in nearest]
        return {"hits": hits, "scanned": int(len(ids))}

    def select(self, filter_: dict) -> slice | np.ndarray:
        if "shard" in filter_:
            if self.shards > 1 and filter_["shard"] != self.shard:
                raise InvalidInputError(f"a child of shard {filter_['shard']}; "
                                        f"this worker holds shard {self.shard}")
            return slice(None)
        if "id_range" in filter_ and self.shards == 1:
            low, high = filter_["id_range"]
            return (self.ids >= low) & (self.ids < high)
        raise InvalidInputError(f"this example answers shard and id-range children, not {filter_}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", default="http://127.0.0.1:7700")
    parser.add_argument("--id", default=None)
    parser.add_argument("--vectors", required=True, help="a 2-D float32 .npy file")
    parser.add_argument("--collection", default="default")
    parser.add_argument("--shard", default="0/1", help="I/N: hold shard I of N")
    parser.add_argument("--token")
    parser.add_argument("--ca-file")
    args = parser.parse_args()
    shard, shards = (int(part) for part in args.shard.split("/"))
    search = ShardSearch(args.vectors, shard, shards)
    worker = Worker(
        Client(args.server, token=args.token, ca_file=args.ca_file),
        args.id or f"py-shard-{shard}-of-{shards}",
        search,
        gpus=1,
        per_gpu=2,
        kinds=["vector.search"],
        labels={"collection": args.collection, "shard": str(shard) if shards > 1 else "all"},
        vectors=ShardAnnouncement(collection=args.collection, shard=shard, shards=shards,
                                  dim=search.data.shape[1], vectors=len(search.ids)),
    )
    print(f"holding rows {search.first}..{search.first + len(search.ids)} of {args.vectors}",
          flush=True)
    stats = worker.run()
    print(f"drained: {stats.line()}", flush=True)


if __name__ == "__main__":
    main()
