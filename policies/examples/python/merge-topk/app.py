"""Merge in Python: the `k` nearest hits of all the children, each id once (at its nearest
distance), ties broken by id; with `max_distance` set (a float, e.g. `max_distance=0.8`),
hits farther than it are left out."""

import sluice_policy as sp
from wit_world import exports


class Merge(sp.MergePolicy, exports.Merge):
    SETTINGS = {"max_distance": ""}

    def configure(self, settings):
        bound = settings["max_distance"]
        if bound:
            try:
                if float(bound) < 0:
                    raise ValueError
            except ValueError:
                raise sp.ConfigError(f"max_distance: `{bound}` is not a distance (a number from 0)")

    def merge_hits(self, k, weights, hits):
        bound = float(self.settings["max_distance"] or "inf")
        nearest = {}
        for hit in hits:
            if hit.distance <= bound and (hit.id not in nearest or hit.distance < nearest[hit.id].distance):
                nearest[hit.id] = hit
        return sorted(nearest.values(), key=lambda hit: (hit.distance, hit.id))[:k]
