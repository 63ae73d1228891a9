// A retry policy: transient failures wait `delay_ms` times the attempt number; anything else,
// or the task's last attempt, is dead.

import * as sp from "./sluice_policy.js";

export const policy = sp.retryPolicy({
  settings: { delay_ms: 1000 },

  configure(settings) {
    if (settings.delay_ms === 0) throw new sp.ConfigError("delay_ms must be at least 1");
  },

  // failure.task has the task's names too: .kind, .tenant, .device, .label("ed").
  decide(nowMs, failure, settings) {
    if (failure.task.attempt >= failure.maxAttempts) return sp.dead(sp.DEAD_ATTEMPTS_SPENT);
    if ([sp.TRANSIENT, sp.NODE_BUSY, sp.LEASE_EXPIRED].includes(failure.errorClass)) {
      return sp.retryAfterMs(settings.delay_ms * Math.max(failure.task.attempt, 1));
    }
    if (failure.errorClass === sp.INVALID_INPUT) return sp.dead(sp.DEAD_INVALID_INPUT);
    return sp.dead(sp.DEAD_PERMANENT);
  },
});

export const { retry, namedRetry } = policy;
