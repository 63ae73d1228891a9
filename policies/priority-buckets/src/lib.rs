//! Priority policy: a task waits in the bucket of its submitted priority, first come first
//! served (rank = arrival sequence), and one attempt may run `est_exec_ms` times a factor per
//! bucket (1.5 urgent, 2 normal, 3 low: urgent work is given up on sooner). Claims are shared
//! among buckets by weight, 60/35/5 by default; inside a bucket, among tenants by the weights
//! of `tenant_weights` (`site-a:3,site-b:1`; a tenant not named weighs 1).

// no_std in the component: std's runtime was half of each one's size. Native builds (the
// tests, the host's benchmark) keep std.
#![cfg_attr(target_arch = "wasm32", no_std)]

extern crate alloc;

use alloc::format;
use alloc::string::String;
use alloc::string::ToString;
use alloc::vec::Vec;

use sluice_policy::packed::{Admission, View};

#[derive(Clone, Debug, PartialEq)]
pub struct Settings {
    /// Timeout factors in thousandths, by bucket: urgent, normal, low.
    pub timeout_factor_milli: [u64; 3],
    pub weights: [u32; 3],
    /// Fair-share weights by tenant name; a tenant not named weighs 1.
    pub tenant_weights: Vec<(String, u32)>,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            timeout_factor_milli: [1500, 2000, 3000],
            weights: [60, 35, 5],
            tenant_weights: Vec::new(),
        }
    }
}

const NAMES: [&str; 5] = [
    "urgent_timeout_factor",
    "normal_timeout_factor",
    "low_timeout_factor",
    "weights",
    "tenant_weights",
];

/// The most tenants `tenant_weights` may name, and the largest weight.
const MAX_TENANT_WEIGHTS: usize = 10_000;
const MAX_TENANT_WEIGHT: u32 = 10_000;

/// `site-a:3,site-b:1`: each tenant once, each weight 1 to 10,000.
fn parse_tenant_weights(text: &str) -> Result<Vec<(String, u32)>, String> {
    let mut weights: Vec<(String, u32)> = Vec::new();
    for item in text
        .split(',')
        .map(str::trim)
        .filter(|item| !item.is_empty())
    {
        let (tenant, weight) = item
            .rsplit_once(':')
            .ok_or_else(|| format!("`tenant_weights`: `{item}` is not tenant:weight"))?;
        let weight: u32 = weight
            .trim()
            .parse()
            .ok()
            .filter(|w| (1..=MAX_TENANT_WEIGHT).contains(w))
            .ok_or_else(|| {
                format!(
                    "`tenant_weights`: the weight of `{tenant}` must be 1 to {MAX_TENANT_WEIGHT}"
                )
            })?;
        let tenant = tenant.trim();
        if tenant.is_empty() || weights.iter().any(|(named, _)| named == tenant) {
            return Err(format!(
                "`tenant_weights`: `{tenant}` is empty or named twice"
            ));
        }
        weights.push((tenant.to_string(), weight));
    }
    if weights.len() > MAX_TENANT_WEIGHTS {
        return Err(format!(
            "`tenant_weights` names at most {MAX_TENANT_WEIGHTS} tenants"
        ));
    }
    Ok(weights)
}

impl Settings {
    pub fn parse(bytes: &[u8]) -> Result<Settings, String> {
        Self::from_config(&sluice_policy::Config::parse(bytes, &NAMES)?)
    }

    pub fn from_config(config: &sluice_policy::Config) -> Result<Settings, String> {
        let defaults = Settings::default();
        let mut timeout_factor_milli = defaults.timeout_factor_milli;
        for (slot, name) in timeout_factor_milli.iter_mut().zip(&NAMES[..3]) {
            let factor = config.f64_or(name, *slot as f64 / 1000.0)?;
            if !(0.1..=100.0).contains(&factor) {
                return Err(format!("`{name}` must be 0.1 to 100"));
            }
            // Rounded to the nearest thousandth (`f64::round` is not in core; factor > 0).
            *slot = (factor * 1000.0 + 0.5) as u64;
        }
        let weights: Vec<u32> = config.list_or("weights", &defaults.weights)?;
        let weights: [u32; 3] = weights
            .try_into()
            .map_err(|_| "`weights` needs three values: urgent, normal, low".to_string())?;
        if weights.iter().sum::<u32>() == 0 || weights.iter().any(|&w| w > 1000) {
            return Err("`weights` must each be 0 to 1000 and not all 0".into());
        }
        let tenant_weights = match config.text("tenant_weights") {
            Some(text) => parse_tenant_weights(text)?,
            None => Vec::new(),
        };
        Ok(Settings {
            timeout_factor_milli,
            weights,
            tenant_weights,
        })
    }

    pub fn admit(&self, task: &View) -> Admission {
        let bucket = task.submitted_bucket;
        let factor = self.timeout_factor_milli[bucket as usize];
        let timeout = task.est_exec_ms.saturating_mul(factor) / 1000;
        Admission {
            bucket,
            rank: task.seq,
            attempt_timeout_ms: timeout.max(1),
        }
    }
}

impl sluice_policy::Priority for Settings {
    fn init(config: &sluice_policy::Config) -> Result<Self, String> {
        Settings::from_config(config)
    }

    fn bucket_weights(&self) -> [u32; 3] {
        self.weights
    }

    fn admit(&self, _now_ms: u64, task: &sluice_policy::Task) -> Admission {
        Settings::admit(self, &task.view())
    }

    fn tenant_weights(&self) -> Vec<(String, u32)> {
        self.tenant_weights.clone()
    }
}

sluice_policy::priority_policy!(Settings, settings = NAMES, names = false);

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_policy::packed::Bucket;

    fn task(seq: u64, bucket: Bucket, est_exec_ms: u64) -> View {
        View {
            est_exec_ms,
            ..View::in_bucket(seq, bucket)
        }
    }

    #[test]
    fn bucket_rank_and_timeout_follow_the_seed_formula() {
        let settings = Settings::default();
        let urgent = settings.admit(&task(7, Bucket::Urgent, 5));
        assert_eq!(
            (urgent.bucket, urgent.rank, urgent.attempt_timeout_ms),
            (Bucket::Urgent, 7, 7)
        );
        let normal = settings.admit(&task(8, Bucket::Normal, 600_000));
        assert_eq!(
            (normal.bucket, normal.attempt_timeout_ms),
            (Bucket::Normal, 1_200_000)
        );
        let low = settings.admit(&task(9, Bucket::Low, 30_000));
        assert_eq!((low.bucket, low.attempt_timeout_ms), (Bucket::Low, 90_000));
        assert_eq!(
            settings.admit(&task(1, Bucket::Low, 0)).attempt_timeout_ms,
            1
        );
        assert_eq!(
            settings
                .admit(&task(1, Bucket::Low, u64::MAX))
                .attempt_timeout_ms,
            u64::MAX / 1000
        );
    }

    #[test]
    fn tenant_weights_are_named_once_each_with_a_weight_of_1_to_10000() {
        let settings = Settings::parse(b"tenant_weights=site-a:3, site-b:1").unwrap();
        assert_eq!(
            settings.tenant_weights,
            [("site-a".to_string(), 3), ("site-b".to_string(), 1)]
        );
        assert!(Settings::parse(b"").unwrap().tenant_weights.is_empty());
        for bad in [
            "tenant_weights=site-a",
            "tenant_weights=site-a:0",
            "tenant_weights=site-a:10001",
            "tenant_weights=site-a:2,site-a:3",
            "tenant_weights=:2",
        ] {
            assert!(Settings::parse(bad.as_bytes()).is_err(), "{bad}");
        }
    }

    #[test]
    fn config_sets_factors_and_weights_and_refuses_nonsense() {
        let custom = Settings::parse(b"urgent_timeout_factor=1.25\nweights=70,25,5").unwrap();
        assert_eq!(custom.timeout_factor_milli, [1250, 2000, 3000]);
        assert_eq!(custom.weights, [70, 25, 5]);
        assert_eq!(Settings::parse(b"").unwrap(), Settings::default());
        assert!(Settings::parse(b"weights=1,2").is_err());
        assert!(Settings::parse(b"weights=0,0,0").is_err());
        assert!(Settings::parse(b"low_timeout_factor=0").is_err());
        assert!(Settings::parse(b"low_timeout_factor=inf").is_err());
        assert!(Settings::parse(b"timeout=2").is_err());
    }
}
