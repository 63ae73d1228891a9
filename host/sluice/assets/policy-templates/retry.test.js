// The policy's rules, run natively: `node --test` (no component is built).

import assert from "node:assert/strict";
import test from "node:test";
import * as sp from "./sluice_policy.js";
import { policy } from "./app.js";

const failure = (attempt, errorClass) =>
  sp.Failure.of({ task: sp.Task.of({ attempt, kind: "oct.qa" }), errorClass, maxAttempts: 3 });

test("transient failures wait longer each attempt; the last attempt is dead", () => {
  const rule = policy.configured("delay_ms=500");
  assert.deepEqual(rule.decide(failure(1, sp.TRANSIENT)), { retryAfterMs: 500 });
  assert.deepEqual(rule.decide(failure(2, sp.NODE_BUSY)), { retryAfterMs: 1000 });
  assert.deepEqual(rule.decide(failure(3, sp.TRANSIENT)), { dead: sp.DEAD_ATTEMPTS_SPENT });
  assert.deepEqual(rule.decide(failure(1, sp.PERMANENT)), { dead: sp.DEAD_PERMANENT });
});

test("a delay of 0 is refused with why", () => {
  assert.throws(() => policy.configured("delay_ms=0"), /delay_ms must be at least 1/);
});
