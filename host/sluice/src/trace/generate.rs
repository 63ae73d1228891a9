//! Synthetic traces from a seed (`sluice trace gen`): the same shape, count and seed give the
//! same trace, byte for byte.

use super::TraceTask;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use sluice_model::{FailureClass, Priority};

/// How arrivals are spread over time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Shape {
    /// 100 arrivals a second, exponential gaps.
    Steady,
    /// 20 a second, with 6 s bursts of 200 a second every minute.
    Burst,
    /// A day's cycle: from 10 to 190 a second and back, peaking at midday.
    Diurnal,
    /// The field report's load test: everything submitted at once (800 concurrent tasks
    /// there), with a worker fault in every twentieth attempt.
    #[value(name = "seed-800")]
    Seed800,
    /// GPU inference for batching: 40 a second of two models (`seg-v3`, `denoise-v2`) over two
    /// input shapes (batch keys), 150-250 ms each alone, 2,000 MB of GPU memory, three sites.
    #[value(name = "gpu-batches")]
    GpuBatches,
}

/// Arrival rate of `shape` at `at_ms`, in tasks a second.
fn rate_per_s(shape: Shape, at_ms: u64) -> f64 {
    match shape {
        Shape::Steady => 100.0,
        Shape::Burst if at_ms % 60_000 < 6_000 => 200.0,
        Shape::Burst => 20.0,
        Shape::Diurnal => {
            let day = (at_ms % 86_400_000) as f64 / 86_400_000.0;
            // Lowest at midnight, highest at midday.
            100.0 - 90.0 * (2.0 * std::f64::consts::PI * day).cos()
        }
        Shape::Seed800 => f64::INFINITY,
        Shape::GpuBatches => 40.0,
    }
}

/// `tasks` tasks of `shape` from `seed`, in submission order.
pub fn generate(shape: Shape, tasks: usize, seed: u64) -> impl Iterator<Item = TraceTask> {
    let mut chance = SmallRng::seed_from_u64(seed);
    let mut at_ms = 0f64;
    (0..tasks).map(move |n| {
        let rate = rate_per_s(shape, at_ms as u64);
        if rate.is_finite() {
            // Exponential gaps: a Poisson process at the current rate.
            let uniform: f64 = chance.random_range(f64::EPSILON..1.0);
            at_ms += -uniform.ln() * 1_000.0 / rate;
        }
        task(shape, n, at_ms as u64, &mut chance)
    })
}

fn task(shape: Shape, n: usize, submit_ms: u64, chance: &mut SmallRng) -> TraceTask {
    if shape == Shape::GpuBatches {
        return inference_task(submit_ms, chance);
    }
    // A tenth urgent, just over half normal, a third low.
    let priority = match chance.random_range(0..100) {
        0..10 => Priority::Urgent,
        10..65 => Priority::Normal,
        _ => Priority::Low,
    };
    // Service times: mostly 0.2-2 s, a tail of long analyses up to 20 s.
    let service_ms = if chance.random_bool(0.9) {
        chance.random_range(200..=2_000)
    } else {
        chance.random_range(2_000..=20_000)
    };
    // Devices estimate within ±25 %.
    let estimate = service_ms as f64 * chance.random_range(0.75..=1.25);
    let fault_per_mille = if shape == Shape::Seed800 { 50 } else { 20 };
    let mut failures = Vec::new();
    while failures.len() < 2 && chance.random_range(0..1_000) < fault_per_mille {
        failures.push(if chance.random_bool(0.8) {
            FailureClass::Transient
        } else {
            FailureClass::NodeBusy
        });
    }
    TraceTask {
        priority,
        kind: if n % 10 == 9 {
            "oct.report"
        } else {
            "oct.scan"
        }
        .into(),
        tenant: format!("site-{}", chance.random_range(0..4)),
        device: format!("scanner-{}", chance.random_range(0..32)),
        est_exec_ms: Some(estimate as u64),
        gpus: 1,
        gpu_memory_mb: if chance.random_bool(0.2) {
            40_000
        } else {
            16_000
        },
        failures,
        ..TraceTask::at(submit_ms, service_ms)
    }
}

/// A task of the `gpu-batches` shape: one inference of a few models and input shapes, the same
/// work within ±25 %, so that tasks of one model and shape batch well.
fn inference_task(submit_ms: u64, chance: &mut SmallRng) -> TraceTask {
    let priority = match chance.random_range(0..100) {
        0..10 => Priority::Urgent,
        10..65 => Priority::Normal,
        _ => Priority::Low,
    };
    let service_ms = chance.random_range(150..=250);
    let estimate = service_ms as f64 * chance.random_range(0.9..=1.1);
    let model = if chance.random_bool(0.6) {
        "seg-v3"
    } else {
        "denoise-v2"
    };
    let shape = if chance.random_bool(0.7) {
        "512x496"
    } else {
        "1024x496"
    };
    let failures = if chance.random_range(0..1_000) < 10 {
        vec![FailureClass::Transient]
    } else {
        Vec::new()
    };
    TraceTask {
        priority,
        kind: "oct.infer".into(),
        tenant: format!("site-{}", chance.random_range(0..3)),
        device: format!("scanner-{}", chance.random_range(0..32)),
        est_exec_ms: Some(estimate as u64),
        gpus: 1,
        gpu_memory_mb: 2_000,
        model: Some(model.into()),
        batch_key: Some(shape.into()),
        failures,
        ..TraceTask::at(submit_ms, service_ms)
    }
}
