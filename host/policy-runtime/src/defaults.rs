//! The policy components shipped in the binary, built from `policies/` by the build script:
//! one default per kind, and the alternatives (`split-ivf`, `merge-threshold`, ...) for upload.

include!(concat!(env!("OUT_DIR"), "/default_policies.rs"));

/// Every embedded component by its crate name, for `sluice policy upload --builtin NAME`.
pub const BY_NAME: [(&str, &[u8]); 12] = [
    ("priority-buckets", PRIORITY_BUCKETS),
    ("aging-threshold", AGING_THRESHOLD),
    ("aging-age-factor", AGING_AGE_FACTOR),
    ("aging-deadline", AGING_DEADLINE),
    ("retry-backoff", RETRY_BACKOFF),
    ("split-shards", SPLIT_SHARDS),
    ("split-hash", SPLIT_HASH),
    ("split-range", SPLIT_RANGE),
    ("split-ivf", SPLIT_IVF),
    ("merge-topk", MERGE_TOPK),
    ("merge-threshold", MERGE_THRESHOLD),
    ("merge-weighted", MERGE_WEIGHTED),
];

/// The embedded component named `name`.
pub fn by_name(name: &str) -> Option<&'static [u8]> {
    BY_NAME
        .iter()
        .find(|(known, _)| *known == name)
        .map(|(_, bytes)| *bytes)
}
