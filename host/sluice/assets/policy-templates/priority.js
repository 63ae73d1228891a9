// A priority policy: tasks whose kind starts with one of `urgent_prefixes` (a setting, e.g.
// `urgent_prefixes=oct.,ed.`), or that carry the label `ed=true`, wait in urgent; the rest in
// the bucket they were submitted to. First come first served in each bucket; an attempt may run
// twice its estimate. `sites` (JSON, e.g. `sites={"site-er": "urgent"}`) sends a tenant's tasks
// to a bucket of its own.

import * as sp from "./sluice_policy.js";

export const policy = sp.priorityPolicy({
  settings: { urgent_prefixes: [], sites: {} },

  configure(settings) {
    for (const [site, bucket] of Object.entries(settings.sites)) {
      if (!sp.BUCKET_NAMES.includes(bucket)) {
        throw new sp.ConfigError(`sites: ${site} goes to \`${bucket}\`; a bucket is urgent, normal or low`);
      }
    }
  },

  admit(nowMs, task, settings) {
    const site = settings.sites[task.tenant];
    const urgent =
      settings.urgent_prefixes.some((prefix) => task.kind.startsWith(prefix)) || task.label("ed") === "true";
    const bucket = urgent ? sp.URGENT : site ? sp.BUCKET_NAMES.indexOf(site) : task.submittedBucket;
    return sp.admission(bucket, task.seq, Math.max(task.estExecMs * 2, 1));
  },
});

export const { priority, fairness, namedPriority } = policy;
