// The policy's rules, run natively: `node --test` (no component is built).

import assert from "node:assert/strict";
import test from "node:test";
import * as sp from "./sluice_policy.js";
import { policy } from "./app.js";

const bucketOf = (rule, kind, more = {}) =>
  rule.admit(sp.Task.of({ seq: 1, bucket: sp.LOW, kind, ...more })).bucket;

test("listed kinds and emergencies are urgent, the rest keep their bucket", () => {
  const rule = policy.configured("urgent_prefixes=oct.");
  assert.equal(bucketOf(rule, "oct.qa"), sp.URGENT);
  assert.equal(bucketOf(rule, "ct.scan"), sp.LOW);
  assert.equal(bucketOf(rule, "ct.scan", { labels: { ed: "true" } }), sp.URGENT);
});

test("a site sent to a bucket of its own", () => {
  const rule = policy.configured('sites={"site-er": "normal"}');
  assert.equal(bucketOf(rule, "ct.scan", { tenant: "site-er" }), sp.NORMAL);
  assert.equal(bucketOf(rule, "ct.scan", { tenant: "site-a" }), sp.LOW);
});

test("settings it does not know, or cannot read, are refused with why", () => {
  assert.throws(() => policy.configured("urgent_prefix=oct."), /unknown setting `urgent_prefix`/);
  assert.throws(() => policy.configured('sites={"site-er": "soon"}'), /a bucket is urgent, normal or low/);
  assert.throws(() => policy.configured("sites=[1]"), /a JSON object is expected/);
});
