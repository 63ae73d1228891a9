"""Split in Python: one child per shard of the collection that has a live worker, from the
layout the host gives (shard 0 alone from a host that gives none); a collection with no live
shard, or more live shards than `max_children`, is refused."""

import sluice_policy as sp
from wit_world import exports


class Split(sp.SplitPolicy, exports.Split):
    SETTINGS = {"max_children": 256}

    def children(self, vector, k, nprobe, layout):
        if layout.shards == 0:
            return [(sp.shard(0), 1.0)]
        if not layout.live:
            raise sp.Refuse(f"no shard of collection `{layout.collection}` has a live worker")
        if len(layout.live) > self.settings["max_children"]:
            raise sp.Refuse(f"{len(layout.live)} live shards; max_children is {self.settings['max_children']}")
        return [(sp.shard(s), 1.0) for s in layout.live]


class SplitLayout(sp.SplitLayoutPolicy, exports.SplitLayout):
    POLICY = Split
