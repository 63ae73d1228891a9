//! The server's own latency histograms, read from `/metrics` before and after a bench run, so
//! the bench can say how much of the latency its clients saw was the server's. (The clients
//! share the machine with the server; what they measure also holds their own waits.)

use anyhow::Context;

/// One histogram's cumulative buckets (upper bound in seconds, count), `+Inf` last.
#[derive(Clone, Debug, Default)]
pub struct Buckets(Vec<(f64, u64)>);

impl Buckets {
    /// The buckets of the histogram `name` in an OpenMetrics text; empty when it is absent.
    pub fn parse(text: &str, name: &str) -> Buckets {
        let prefix = format!("{name}_bucket{{le=\"");
        let buckets = text
            .lines()
            .filter_map(|line| {
                let rest = line.strip_prefix(&prefix)?;
                let (bound, count) = rest.split_once("\"} ")?;
                let bound = if bound == "+Inf" {
                    f64::INFINITY
                } else {
                    bound.parse().ok()?
                };
                Some((bound, count.trim().parse().ok()?))
            })
            .collect();
        Buckets(buckets)
    }

    /// What was observed between `earlier` and `self`.
    pub fn since(&self, earlier: &Buckets) -> Buckets {
        Buckets(
            self.0
                .iter()
                .map(|&(bound, count)| {
                    let before = earlier
                        .0
                        .iter()
                        .find(|(b, _)| *b == bound)
                        .map_or(0, |(_, c)| *c);
                    (bound, count.saturating_sub(before))
                })
                .collect(),
        )
    }

    pub fn count(&self) -> u64 {
        self.0.last().map_or(0, |(_, count)| *count)
    }

    /// The share of observations at or under `bound_s` (a bucket bound).
    pub fn share_within(&self, bound_s: f64) -> f64 {
        let within = self
            .0
            .iter()
            .find(|(bound, _)| (*bound - bound_s).abs() < 1e-12)
            .map_or(0, |(_, count)| *count);
        within as f64 / self.count().max(1) as f64
    }

    /// The smallest bucket bound that holds quantile `q` of the observations.
    pub fn quantile_bound_s(&self, q: f64) -> f64 {
        let want = (self.count() as f64 * q).ceil() as u64;
        self.0
            .iter()
            .find(|(_, count)| *count >= want)
            .map_or(f64::NAN, |(bound, _)| *bound)
    }
}

pub async fn scrape(http: &reqwest::Client, url: &str) -> anyhow::Result<String> {
    http.get(format!("{url}/metrics"))
        .send()
        .await
        .and_then(reqwest::Response::error_for_status)
        .context("read the server's /metrics")?
        .text()
        .await
        .context("read the server's /metrics")
}

/// "p50 ≤ 1 ms, p99 ≤ 25 ms, 97.1 % ≤ 5 ms" for the observations in `buckets`.
pub fn describe(buckets: &Buckets) -> String {
    let ms = |s: f64| {
        if s.is_finite() {
            format!("≤ {} ms", s * 1000.0)
        } else {
            "over the last bucket".to_owned()
        }
    };
    format!(
        "p50 {}, p99 {}, {:.1} % ≤ 5 ms",
        ms(buckets.quantile_bound_s(0.50)),
        ms(buckets.quantile_bound_s(0.99)),
        100.0 * buckets.share_within(0.005)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const BEFORE: &str = "sluice_claim_grant_seconds_bucket{le=\"0.001\"} 1\n\
        sluice_claim_grant_seconds_bucket{le=\"0.005\"} 2\n\
        sluice_claim_grant_seconds_bucket{le=\"0.025\"} 2\n\
        sluice_claim_grant_seconds_bucket{le=\"+Inf\"} 2\n";
    const AFTER: &str = "sluice_claim_grant_seconds_bucket{le=\"0.001\"} 41\n\
        sluice_claim_grant_seconds_bucket{le=\"0.005\"} 92\n\
        sluice_claim_grant_seconds_bucket{le=\"0.025\"} 101\n\
        sluice_claim_grant_seconds_bucket{le=\"+Inf\"} 102\n\
        sluice_store_sync_seconds_bucket{le=\"0.001\"} 7\n";

    #[test]
    fn the_difference_of_two_scrapes_gives_the_run_s_quantiles() {
        let name = "sluice_claim_grant_seconds";
        let run = Buckets::parse(AFTER, name).since(&Buckets::parse(BEFORE, name));
        assert_eq!(run.count(), 100);
        assert_eq!(run.share_within(0.005), 0.9);
        assert_eq!(run.quantile_bound_s(0.40), 0.001);
        assert_eq!(run.quantile_bound_s(0.50), 0.005);
        assert_eq!(run.quantile_bound_s(0.99), 0.025);
        assert!(run.quantile_bound_s(1.0).is_infinite());
        assert_eq!(describe(&run), "p50 ≤ 5 ms, p99 ≤ 25 ms, 90.0 % ≤ 5 ms");
    }

    #[test]
    fn an_absent_histogram_has_no_observations() {
        let run = Buckets::parse(AFTER, "sluice_nothing_seconds");
        assert_eq!(run.count(), 0);
        assert_eq!(run.share_within(0.005), 0.0);
    }
}
