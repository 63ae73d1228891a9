// Sluice's policy SDK for JavaScript (built into a component with componentize-js): the
// packed layouts of `wit/policy.wit` as plain objects with each task's names (kind, tenant,
// device, labels), the `name=value` config format with typed settings and errors, and one
// function per kind that turns a single per-task rule into the kind's exports — the batch
// call, its `-one` twin and the named export — so the three always agree.
//
//   import * as sp from "./sluice_policy.js";
//   export const policy = sp.retryPolicy({
//     settings: { initial_delay_ms: 1000, urgent_kinds: ["oct.qa"] },
//     decide(nowMs, failure, settings) { ... },   // failure.task.kind, .label("ed")
//   });
//   export const { retry, namedRetry } = policy;
//
// Build: `componentize-js app.js --wit wit --world-name named-retry-policy -d http -d fetch-event
// -o app.wasm` (see policies/README.md). Every decision must be a pure function of its
// arguments: the host freezes the clock at the call's `nowMs` and seeds the random bits.
//
// Numbers: a task's `seq` and a failure's `random` are BigInt (64 bits); times, estimates and
// counts are Numbers.

// Buckets, coded as in the WIT `bucket` enum.
export const URGENT = 0;
export const NORMAL = 1;
export const LOW = 2;
export const BUCKET_NAMES = ["urgent", "normal", "low"];

// Error classes of a failure.
export const TRANSIENT = 0;
export const NODE_BUSY = 1;
export const LEASE_EXPIRED = 2;
export const TIMEOUT = 3;
export const PERMANENT = 4;
export const INVALID_INPUT = 5;

// Why a task is dead.
export const DEAD_PERMANENT = 0;
export const DEAD_INVALID_INPUT = 1;
export const DEAD_ATTEMPTS_SPENT = 2;
export const DEAD_POLICY = 3;

export const VIEW_WORDS = 6;
export const FAILURE_WORDS = 8;
const DEAD = 1n << 63n;
const U32 = 0xffffffffn;

/** A config the policy refuses: the message is what the uploader sees. */
export class ConfigError extends Error {}

/** The 32-bit code a task view carries for a tenant or kind name (FNV-1a). */
export function fnv1a32(name) {
  let code = 0x811c9dc5;
  for (const byte of new TextEncoder().encode(name)) {
    code = Math.imul(code ^ byte, 0x01000193) >>> 0;
  }
  return code;
}

/** A task's names: kind, tenant and device as submitted, and its labels sorted by name. */
export const NO_NAMES = Object.freeze({ kind: "", tenant: "", device: "", labels: [] });

/** A task as a policy sees it: its packed view and its names. */
export class Task {
  constructor(fields) {
    Object.assign(this, fields);
    Object.freeze(this);
  }

  /** The value of label `name`, or undefined. */
  label(name) {
    const hit = this.labels.find(([key]) => key === name);
    return hit === undefined ? undefined : hit[1];
  }

  /** From six packed words (BigInt) and the task's names. */
  static unpack(words, names = NO_NAMES) {
    const [seq, tenantKind, created, since, est, packed] = words;
    return new Task({
      seq: BigInt(seq),
      tenantCode: Number(BigInt(tenantKind) >> 32n),
      kindCode: Number(BigInt(tenantKind) & U32),
      createdMs: Number(created),
      bucketSinceMs: Number(since),
      estExecMs: Number(est),
      attempt: Number(BigInt(packed) >> 32n),
      bucket: Number((BigInt(packed) >> 8n) & 0xffn),
      submittedBucket: Number(BigInt(packed) & 0xffn),
      kind: names.kind,
      tenant: names.tenant,
      device: names.device,
      labels: names.labels,
    });
  }

  /** A task for a unit test: `Task.of({ kind: "oct.qa", bucket: sp.LOW, labels: { ed: "true" } })`. */
  static of({ seq = 0, bucket = NORMAL, kind = "", tenant = "", device = "", labels = {}, ...view } = {}) {
    return new Task({
      seq: BigInt(seq),
      tenantCode: fnv1a32(tenant),
      kindCode: fnv1a32(kind),
      createdMs: 0,
      bucketSinceMs: 0,
      estExecMs: 0,
      attempt: 0,
      submittedBucket: bucket,
      ...view,
      bucket,
      kind,
      tenant,
      device,
      labels: Object.entries(labels).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0)),
    });
  }
}

/** A failed attempt: the task, its error class, its attempt budget and random bits. */
export class Failure {
  constructor(fields) {
    Object.assign(this, fields);
    Object.freeze(this);
  }

  static unpack(words, names = NO_NAMES) {
    const classMax = BigInt(words[6]);
    return new Failure({
      task: Task.unpack(words.slice(0, 6), names),
      errorClass: Number(classMax >> 32n),
      maxAttempts: Number(classMax & U32),
      random: BigInt(words[7]),
    });
  }

  /** A failure for a unit test: `Failure.of({ task: Task.of({ attempt: 1 }), errorClass: sp.TRANSIENT })`. */
  static of({ task = Task.of(), errorClass = TRANSIENT, maxAttempts = 3, random = 0 } = {}) {
    return new Failure({ task, errorClass, maxAttempts, random: BigInt(random) });
  }
}

/** A priority decision: the bucket to wait in, the rank there (lower first), and how long one
 * attempt may run (at least 1 ms). */
export function admission(bucket, rank, attemptTimeoutMs) {
  const words = [BigInt(bucket), BigInt(rank), BigInt(Math.floor(Number(attemptTimeoutMs)))];
  if (![URGENT, NORMAL, LOW].includes(Number(bucket)) || words[1] < 0n || words[2] < 1n) {
    throw new RangeError(`admission (${bucket}, ${rank}, ${attemptTimeoutMs}) out of range`);
  }
  return words;
}

/** A retry decision: wait `delayMs`, then run again. */
export function retryAfterMs(delayMs) {
  const delay = BigInt(Math.floor(Number(delayMs)));
  if (delay < 0n || delay >= DEAD) {
    throw new RangeError(`delay ${delayMs} ms out of range`);
  }
  return delay;
}

/** A retry decision: the task is dead for `reason` (one of the DEAD_* codes). */
export function dead(reason) {
  return DEAD | BigInt(reason);
}

function typed(name, value, fallback) {
  if (typeof fallback === "boolean") {
    if (value !== "true" && value !== "false") {
      throw new ConfigError(`${name}: \`${value}\` is not true or false`);
    }
    return value === "true";
  }
  if (typeof fallback === "number") {
    if (!/^[0-9]+$/.test(value) || !Number.isSafeInteger(Number(value))) {
      throw new ConfigError(`${name}: \`${value}\` is not a non-negative integer`);
    }
    return Number(value);
  }
  if (Array.isArray(fallback)) {
    const item = fallback.length > 0 ? fallback[0] : "";
    const items = value === "" ? [] : value.split(",").map((part) => part.trim());
    return items.map((part) => typed(name, part, item));
  }
  if (fallback !== null && typeof fallback === "object") {
    // A setting of any shape: its value is JSON, checked by the policy's `configure`.
    let parsed;
    try {
      parsed = JSON.parse(value);
    } catch (error) {
      throw new ConfigError(`${name}: not JSON (${error.message})`);
    }
    if (parsed === null || typeof parsed !== "object" || Array.isArray(parsed) !== Array.isArray(fallback)) {
      throw new ConfigError(`${name}: a JSON ${Array.isArray(fallback) ? "array" : "object"} is expected`);
    }
    return parsed;
  }
  return value;
}

/** `name=value` lines (blank lines and `#` comments skipped) over `defaults`, each value read
 * as its default's type: a non-negative integer, text, true/false, a comma-separated list, or
 * JSON for an object default. An unknown name, a name set twice, or a value of the wrong type
 * is refused with a ConfigError. */
export function parseConfig(config, defaults) {
  let text = config;
  if (typeof config !== "string") {
    try {
      text = new TextDecoder("utf-8", { fatal: true }).decode(config);
    } catch {
      throw new ConfigError("config is not UTF-8");
    }
  }
  const settings = JSON.parse(JSON.stringify(defaults));
  const seen = new Set();
  text.split(/\r?\n/).forEach((raw, index) => {
    const line = raw.trim();
    if (line === "" || line.startsWith("#")) return;
    const at = line.indexOf("=");
    if (at < 0) throw new ConfigError(`line ${index + 1}: expected name=value`);
    const name = line.slice(0, at).trim();
    const value = line.slice(at + 1).trim();
    if (!Object.hasOwn(defaults, name)) {
      const known = Object.keys(defaults).sort().join(", ") || "none";
      throw new ConfigError(`unknown setting \`${name}\` (known: ${known})`);
    }
    if (seen.has(name)) throw new ConfigError(`${name} is set twice`);
    seen.add(name);
    settings[name] = typed(name, value, defaults[name]);
  });
  return settings;
}

/** Settings from `config`, checked by the spec's `configure(settings)` (which throws a
 * ConfigError to refuse them). */
function configure(spec, config) {
  const settings = parseConfig(config, spec.settings ?? {});
  spec.configure?.(settings);
  return Object.freeze(settings);
}

/** `init`: a refusal's message is the component's answer to the uploader. */
function init(spec, config) {
  try {
    return configure(spec, config);
  } catch (error) {
    throw error instanceof Error ? error.message : String(error);
  }
}

function eachName(names, which) {
  return which ? Array.from(which, (index) => names[index]) : null;
}

/** A priority policy from `spec`: `{ settings, configure?(settings), admit(nowMs, task, settings)
 * -> sp.admission(...), weights?(settings) -> [urgent, normal, low], tenantWeights?(settings)
 * -> [[tenant, weight], ...] }`. Export its `priority`, `fairness` and `namedPriority`; its
 * `configured(config)` gives the rule with a config applied, for unit tests. */
export function priorityPolicy(spec) {
  let settings = configure(spec, "");
  const admitAll = (nowMs, tasks, names) => {
    const answers = [];
    for (let at = 0, index = 0; at + VIEW_WORDS <= tasks.length; at += VIEW_WORDS, index += 1) {
      const task = Task.unpack(Array.from(tasks.slice(at, at + VIEW_WORDS)), names ? names[index] : NO_NAMES);
      answers.push(...spec.admit(nowMs, task, settings));
    }
    return answers;
  };
  return {
    priority: {
      init(config) {
        settings = init(spec, config);
      },
      bucketWeights() {
        return Array.from(spec.weights?.(settings) ?? [60, 35, 5]);
      },
      admit(nowMs, tasks) {
        return admitAll(nowMs, tasks, null);
      },
      admitOne(nowMs, task) {
        return spec.admit(nowMs, Task.unpack(task), settings);
      },
    },
    fairness: {
      tenantWeights() {
        return Array.from(spec.tenantWeights?.(settings) ?? []);
      },
    },
    namedPriority: {
      readsNames() {
        return true;
      },
      admit(nowMs, tasks, names, which) {
        return admitAll(nowMs, tasks, eachName(names, which));
      },
      admitOne(nowMs, task, names) {
        return spec.admit(nowMs, Task.unpack(task, names), settings);
      },
    },
    configured(config = "") {
      const applied = configure(spec, config);
      return {
        settings: applied,
        admit(task, nowMs = 0) {
          const [bucket, rank, attemptTimeoutMs] = spec.admit(nowMs, task, applied);
          return { bucket: Number(bucket), rank, attemptTimeoutMs: Number(attemptTimeoutMs) };
        },
      };
    },
  };
}

/** A retry policy from `spec`: `{ settings, configure?(settings), decide(nowMs, failure,
 * settings) -> sp.retryAfterMs(ms) or sp.dead(reason) }`. Export its `retry` and `namedRetry`;
 * its `configured(config)` gives the rule with a config applied, for unit tests. */
export function retryPolicy(spec) {
  let settings = configure(spec, "");
  const decideAll = (nowMs, failures, names) => {
    const answers = [];
    for (let at = 0, index = 0; at + FAILURE_WORDS <= failures.length; at += FAILURE_WORDS, index += 1) {
      const failure = Failure.unpack(Array.from(failures.slice(at, at + FAILURE_WORDS)), names ? names[index] : NO_NAMES);
      answers.push(spec.decide(nowMs, failure, settings));
    }
    return answers;
  };
  return {
    retry: {
      init(config) {
        settings = init(spec, config);
      },
      decide(nowMs, failures) {
        return decideAll(nowMs, failures, null);
      },
      decideOne(nowMs, failure) {
        return spec.decide(nowMs, Failure.unpack(failure), settings);
      },
    },
    namedRetry: {
      readsNames() {
        return true;
      },
      decide(nowMs, failures, names, which) {
        return decideAll(nowMs, failures, eachName(names, which));
      },
      decideOne(nowMs, failure, names) {
        return spec.decide(nowMs, Failure.unpack(failure, names), settings);
      },
    },
    configured(config = "") {
      const applied = configure(spec, config);
      return {
        settings: applied,
        decide(failure, nowMs = 0) {
          const word = BigInt(spec.decide(nowMs, failure, applied));
          return (word & DEAD) !== 0n
            ? { dead: Number(word & U32) }
            : { retryAfterMs: Number(word) };
        },
      };
    },
  };
}
