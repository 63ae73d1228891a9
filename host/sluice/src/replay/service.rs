//! Where a replay's service times come from: the trace, or a distribution drawn once per task
//! from the seed (`--service`), so every variant runs each task for the same time and a
//! difference between them is the policies', not the draws'.

use super::{ReplayError, Trace};
use crate::trace::MAX_SERVICE_MS;
use rand::SeedableRng;
use rand::rngs::StdRng;
use rand_distr::{Distribution, Exp, LogNormal};
use std::fmt;
use std::str::FromStr;

/// A lognormal's sigma past this is a distribution of a few giant tasks among instant ones.
const MAX_SIGMA: f64 = 4.0;

#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub enum ServiceModel {
    /// Each task's `service_ms` as the trace has it.
    #[default]
    Trace,
    Fixed {
        ms: u64,
    },
    Exponential {
        mean_ms: u64,
    },
    LogNormal {
        median_ms: u64,
        sigma: f64,
    },
}

impl fmt::Display for ServiceModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ServiceModel::Trace => write!(f, "trace"),
            ServiceModel::Fixed { ms } => write!(f, "fixed:{ms}"),
            ServiceModel::Exponential { mean_ms } => write!(f, "exp:{mean_ms}"),
            ServiceModel::LogNormal { median_ms, sigma } => {
                write!(f, "lognormal:{median_ms}:{sigma}")
            }
        }
    }
}

impl FromStr for ServiceModel {
    type Err = ReplayError;

    fn from_str(text: &str) -> Result<Self, ReplayError> {
        let refuse = |detail: &str| ReplayError::Service {
            spec: text.chars().take(64).collect(),
            detail: detail.into(),
        };
        let ms = |value: &str| -> Result<u64, ReplayError> {
            match value.parse::<u64>() {
                Ok(ms @ 1..=MAX_SERVICE_MS) => Ok(ms),
                _ => Err(refuse("a time is 1 ms to a day, in whole ms")),
            }
        };
        let mut parts = text.split(':');
        let model = match (parts.next(), parts.next(), parts.next()) {
            (Some("trace"), None, None) => ServiceModel::Trace,
            (Some("fixed"), Some(value), None) => ServiceModel::Fixed { ms: ms(value)? },
            (Some("exp"), Some(value), None) => ServiceModel::Exponential {
                mean_ms: ms(value)?,
            },
            (Some("lognormal"), Some(median), Some(sigma)) => {
                let sigma = match sigma.parse::<f64>() {
                    Ok(sigma) if sigma > 0.0 && sigma <= MAX_SIGMA => sigma,
                    _ => return Err(refuse("sigma is over 0 and at most 4")),
                };
                ServiceModel::LogNormal {
                    median_ms: ms(median)?,
                    sigma,
                }
            }
            _ => {
                return Err(refuse(
                    "use trace, fixed:MS, exp:MEAN_MS or lognormal:MEDIAN_MS:SIGMA",
                ));
            }
        };
        if parts.next().is_some() {
            return Err(refuse("too many fields"));
        }
        Ok(model)
    }
}

impl Trace {
    /// Gives every task a service time drawn from `model` (nothing for `Trace`): one draw per
    /// task in trace order from `seed`, at least 1 ms and at most a day.
    pub fn draw_service(&mut self, model: ServiceModel, seed: u64) -> Result<(), ReplayError> {
        let mut rng = StdRng::seed_from_u64(seed ^ 0x5e41_1ce0_5e41_1ce0);
        let invalid = |detail: String| ReplayError::Service {
            spec: model.to_string(),
            detail,
        };
        let mut draw: Box<dyn FnMut(&mut StdRng) -> f64> = match model {
            ServiceModel::Trace => return Ok(()),
            ServiceModel::Fixed { ms } => Box::new(move |_| ms as f64),
            ServiceModel::Exponential { mean_ms } => {
                let exp = Exp::new(1.0 / mean_ms as f64).map_err(|e| invalid(e.to_string()))?;
                Box::new(move |rng| exp.sample(rng))
            }
            ServiceModel::LogNormal { median_ms, sigma } => {
                let lognormal = LogNormal::new((median_ms as f64).ln(), sigma)
                    .map_err(|e| invalid(e.to_string()))?;
                Box::new(move |rng| lognormal.sample(rng))
            }
        };
        for arrival in &mut self.arrivals {
            arrival.service_ms = (draw(&mut rng).round() as u64).clamp(1, MAX_SERVICE_MS);
        }
        self.service = model;
        Ok(())
    }

    /// Where its service times come from.
    pub fn service(&self) -> ServiceModel {
        self.service
    }

    /// Each task's service time, in trace order.
    pub fn service_ms(&self) -> impl Iterator<Item = u64> + '_ {
        self.arrivals.iter().map(|arrival| arrival.service_ms)
    }
}
