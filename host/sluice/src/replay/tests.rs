use super::report::{SimReport, VariantReport};
use super::*;
use crate::trace::TraceTask;

fn options(workers: &str) -> ReplayOptions {
    ReplayOptions {
        workers: workers.parse().unwrap(),
        ..ReplayOptions::default()
    }
}

fn defaults() -> Variant {
    Variant::pair(Vec::new(), Vec::new()).unwrap().remove(0)
}

fn report(trace: &Trace, variant: &Variant, options: &ReplayOptions) -> VariantReport {
    VariantReport::new(variant, trace, run(trace, variant, options).unwrap())
}

#[test]
fn one_gpu_runs_a_trace_back_to_back_and_counts_every_wait() {
    let trace = Trace::from_tasks((0..10).map(|_| TraceTask::at(0, 1_000))).unwrap();
    let figures = report(&trace, &defaults(), &options("1x1"));
    assert_eq!(figures.completed, 10);
    assert!(figures.drained);
    assert_eq!(figures.makespan_ms, 10_000);
    assert_eq!(figures.utilisation, 1.0);
    let normal = &figures.wait_ms[&Priority::Normal];
    // Claimed one after another, each as the one before ends.
    assert_eq!(normal.claimed, 10);
    assert_eq!(normal.p50_ms, 4_000);
    assert_eq!(normal.max_ms, 9_000);
    assert_eq!(normal.mean_ms, 4_500.0);
    assert_eq!(figures.wait_ms[&Priority::Urgent].claimed, 0);
    assert_eq!(figures.attempts_per_task, 1.0);
}

#[test]
fn scripted_failures_are_retried_or_end_the_task_as_the_retry_policy_says() {
    let mut retried = TraceTask::at(0, 500);
    retried.failures = vec![FailureClass::Transient, FailureClass::NodeBusy];
    let mut permanent = TraceTask::at(0, 500);
    permanent.failures = vec![FailureClass::Permanent];
    let mut exhausted = TraceTask::at(0, 500);
    exhausted.failures = vec![FailureClass::Transient; 3];
    let trace = Trace::from_tasks([retried, permanent, exhausted]).unwrap();
    let figures = report(&trace, &defaults(), &options("2x1"));
    // The first completes at its third attempt; the others end dead (max_attempts 3).
    assert_eq!(figures.completed, 1);
    assert_eq!(figures.dead, 2, "{figures:?}");
    assert_eq!(figures.retries, 4);
    assert_eq!(figures.attempts_per_task, 2.333);
    assert!(figures.drained);
}

#[test]
fn a_task_no_worker_fits_is_reported_stranded_and_the_run_still_ends() {
    let mut huge = TraceTask::at(0, 100);
    huge.gpu_memory_mb = 80_000;
    let trace = Trace::from_tasks([huge, TraceTask::at(10, 100)]).unwrap();
    let figures = report(&trace, &defaults(), &options("1x2:40000"));
    assert_eq!(figures.completed, 1);
    assert_eq!(figures.stranded, 1);
    assert_eq!(figures.unfinished, 1);
    assert!(!figures.drained);
}

#[test]
fn crashed_workers_lose_nothing_and_the_same_seed_gives_the_same_bytes() {
    let tasks = crate::trace::generate::generate(crate::trace::generate::Shape::Burst, 1_500, 11);
    let trace = Trace::from_tasks(tasks).unwrap();
    let options = ReplayOptions {
        fail_per_mille: 50,
        mean_ms_between_crashes: Some(20_000),
        restart_ms: 5_000,
        ..options("6x2")
    };
    let variants = Variant::pair(
        vec![
            "aging=builtin:aging-threshold?low_to_normal_ms=5000"
                .parse()
                .unwrap(),
        ],
        vec![
            "aging=builtin:aging-age-factor?max_age_ms=10000"
                .parse()
                .unwrap(),
        ],
    )
    .unwrap();
    let json = |seed: u64| {
        let options = ReplayOptions {
            seed,
            ..options.clone()
        };
        let reports = variants
            .iter()
            .map(|v| report(&trace, v, &options))
            .collect();
        let report = SimReport::new(&trace, seed, "6x2".into(), reports);
        (serde_json::to_string(&report).unwrap(), report)
    };
    let (first, report) = json(3);
    for variant in &report.variants {
        assert!(variant.crashes > 0, "{}", variant.name);
        // Crashed attempts' leases expire and are run again: every task ends.
        assert!(variant.drained, "{}", variant.name);
        let ended = variant.completed + variant.dead + variant.other_ended;
        assert_eq!(ended, 1_500, "{}", variant.name);
        assert!(variant.retries > 0);
        assert!(variant.promotions > 0, "{}", variant.name);
    }
    assert_ne!(
        report.variants[0].wait_ms, report.variants[1].wait_ms,
        "two aging policies, one answer"
    );
    assert!(report.verdict.as_deref().unwrap().starts_with("B "));
    // Each p50 and p99 change has its interval, and the interval holds the change.
    for difference in report.differences.iter().filter(|d| d.figure != "max") {
        let (Some(change), Some([low, high])) =
            (difference.change_percent, difference.interval_percent)
        else {
            continue;
        };
        assert!(low <= change && change <= high, "{difference:?}");
    }
    assert!(
        report
            .differences
            .iter()
            .any(|d| d.interval_percent.is_some()),
        "{:?}",
        report.differences
    );
    let (again, _) = json(3);
    assert_eq!(first, again, "the same seed gives the same report");
    let (other, _) = json(4);
    assert_ne!(first, other, "the seed drives the draws");
}

#[test]
fn a_component_of_another_kind_is_refused_as_an_upload_would_be() {
    let trace = Trace::from_tasks([TraceTask::at(0, 100)]).unwrap();
    let variant = Variant::pair(
        vec!["aging=builtin:retry-backoff".parse().unwrap()],
        Vec::new(),
    )
    .unwrap()
    .remove(0);
    let error = run(&trace, &variant, &options("1x1")).unwrap_err();
    assert!(
        matches!(error, ReplayError::Load { .. }),
        "{error}: a retry component is no aging policy"
    );
    let missing = Variant::pair(
        vec!["aging=/nonexistent/aging.wasm".parse().unwrap()],
        Vec::new(),
    )
    .unwrap()
    .remove(0);
    assert!(matches!(
        run(&trace, &missing, &options("1x1")),
        Err(ReplayError::Component { .. })
    ));
}

/// A replay splits no task, so a split or merge choice would print "unchanged" for a policy
/// that never ran: it is refused, naming what does compare them.
#[test]
fn a_split_or_merge_choice_is_refused_naming_what_compares_them() {
    for choice in ["merge=builtin:merge-threshold", "split=builtin:split-hash"] {
        let error = Variant::pair(Vec::new(), vec![choice.parse().unwrap()]).unwrap_err();
        let text = error.to_string();
        assert!(
            text.contains("splits no task") && text.contains("sluice experiment start"),
            "{text}"
        );
    }
    assert!(
        Variant::pair(
            vec!["merge=builtin:merge-topk".parse().unwrap()],
            Vec::new()
        )
        .is_err()
    );
}

#[test]
fn choices_and_worker_specs_are_parsed_or_refused_with_a_reason() {
    let choice: PolicyChoice =
        "aging=builtin:aging-threshold?low_to_normal_ms=60000&normal_to_urgent_ms=5"
            .parse()
            .unwrap();
    assert_eq!(
        choice.config.as_deref(),
        Some("low_to_normal_ms=60000\nnormal_to_urgent_ms=5")
    );
    for bad in [
        "aging",
        "ageing=builtin:aging-threshold",
        "aging=builtin:nope",
        "aging=",
        "aging=builtin:aging-threshold?oops",
    ] {
        assert!(bad.parse::<PolicyChoice>().is_err(), "{bad}");
    }
    // B keeps A's choices of the kinds it does not name.
    let pair = Variant::pair(
        vec![
            "retry=builtin:retry-backoff?initial_delay_ms=10"
                .parse()
                .unwrap(),
            "aging=builtin:aging-threshold".parse().unwrap(),
        ],
        vec!["aging=builtin:aging-deadline".parse().unwrap()],
    )
    .unwrap();
    assert_eq!(
        pair[1].label(),
        "aging=builtin:aging-deadline retry=builtin:retry-backoff?initial_delay_ms=10"
    );
    let twice = Variant::pair(
        vec![
            "aging=builtin:aging-threshold".parse().unwrap(),
            "aging=builtin:aging-deadline".parse().unwrap(),
        ],
        Vec::new(),
    );
    assert!(twice.is_err());

    let spec: WorkerSpec = "16x4:80000, 2x1".parse().unwrap();
    assert_eq!(
        spec.groups,
        [
            WorkerGroup {
                count: 16,
                gpus: 4,
                gpu_memory_mb: 80_000
            },
            WorkerGroup {
                count: 2,
                gpus: 1,
                gpu_memory_mb: 40_000
            }
        ]
    );
    for bad in ["", "16", "0x4", "4x0", "4x65", "ax4", "4x4:big", "10001x1"] {
        assert!(bad.parse::<WorkerSpec>().is_err(), "{bad}");
    }
}

#[test]
fn the_plots_draw_a_line_per_bucket_and_variant() {
    let trace = Trace::from_tasks((0..50).map(|n| {
        let mut task = TraceTask::at(n * 10, 300);
        task.priority = Priority::ALL[n as usize % 3];
        task
    }))
    .unwrap();
    let figures = report(&trace, &defaults(), &options("1x2"));
    let report = SimReport::new(&trace, 1, "1x2".into(), vec![figures]);
    let cdf = svg::wait_cdf(&report);
    assert!(cdf.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""));
    assert_eq!(cdf.matches("<polyline").count(), 3);
    assert!(cdf.contains("A low"));
    let depth = svg::queue_depth(&report);
    assert_eq!(depth.matches("<polyline").count(), 3);
    assert!(depth.trim_end().ends_with("</svg>"));
}

#[test]
fn service_models_are_parsed_or_refused_with_a_reason() {
    for (text, model) in [
        ("trace", ServiceModel::Trace),
        ("fixed:250", ServiceModel::Fixed { ms: 250 }),
        ("exp:1000", ServiceModel::Exponential { mean_ms: 1_000 }),
        (
            "lognormal:800:0.5",
            ServiceModel::LogNormal {
                median_ms: 800,
                sigma: 0.5,
            },
        ),
    ] {
        assert_eq!(text.parse::<ServiceModel>().unwrap(), model, "{text}");
        assert_eq!(model.to_string(), text);
    }
    for bad in [
        "",
        "fixed",
        "fixed:0",
        "fixed:-3",
        "exp:1.5",
        "exp:86400001",
        "lognormal:800",
        "lognormal:800:0",
        "lognormal:800:9",
        "lognormal:800:nan",
        "fixed:5:6",
        "uniform:5",
    ] {
        let error = bad.parse::<ServiceModel>().unwrap_err();
        assert!(
            matches!(error, ReplayError::Service { .. }),
            "{bad}: {error}"
        );
    }
}

#[test]
fn drawn_service_times_follow_their_model_from_the_seed_and_every_variant_shares_them() {
    let tasks = || (0..20_000).map(|n| TraceTask::at(n, 5));
    let drawn = |model: &str, seed: u64| -> Vec<u64> {
        let mut trace = Trace::from_tasks(tasks()).unwrap();
        trace.draw_service(model.parse().unwrap(), seed).unwrap();
        trace.service_ms().collect()
    };
    assert!(drawn("fixed:250", 1).iter().all(|&ms| ms == 250));
    assert!(drawn("trace", 1).iter().all(|&ms| ms == 5));
    let exp = drawn("exp:1000", 1);
    let mean = exp.iter().sum::<u64>() as f64 / exp.len() as f64;
    assert!((mean - 1_000.0).abs() < 30.0, "mean {mean}");
    assert!(exp.iter().all(|&ms| ms >= 1));
    let mut lognormal = drawn("lognormal:800:0.5", 1);
    lognormal.sort_unstable();
    let median = lognormal[lognormal.len() / 2];
    assert!(median.abs_diff(800) < 25, "median {median}");
    assert_eq!(drawn("exp:1000", 1), exp, "one seed, one set of draws");
    assert_ne!(drawn("exp:1000", 2), exp, "the seed drives the draws");

    // A replay runs the drawn times: ten 5 s tasks drawn at 100 ms run back to back on one GPU.
    let mut trace = Trace::from_tasks((0..10).map(|_| TraceTask::at(0, 5_000))).unwrap();
    trace
        .draw_service(ServiceModel::Fixed { ms: 100 }, 1)
        .unwrap();
    let figures = report(&trace, &defaults(), &options("1x1"));
    assert_eq!(figures.makespan_ms, 1_000);
    let json =
        serde_json::to_value(SimReport::new(&trace, 1, "1x1".into(), vec![figures])).unwrap();
    assert_eq!(json["service"], "fixed:100");
}

#[test]
fn preemption_in_a_simulation_starts_urgent_work_sooner_and_loses_nothing() {
    // Two GPUs busy with ten-minute low tasks; urgent tasks of a second each arrive behind.
    let mut tasks: Vec<TraceTask> = (0..4)
        .map(|_| {
            let mut low = TraceTask::at(0, 600_000);
            low.priority = Priority::Low;
            low
        })
        .collect();
    for n in 0..4 {
        let mut urgent = TraceTask::at(1_000 + n * 10_000, 1_000);
        urgent.priority = Priority::Urgent;
        tasks.push(urgent);
    }
    let trace = Trace::from_tasks(tasks).unwrap();
    let waiting = report(&trace, &defaults(), &options("1x2"));
    let preempting = ReplayOptions {
        engine: sluice_engine::EngineOptions {
            preempt_after_ms: Some(5_000),
            ..sluice_engine::EngineOptions::default()
        },
        ..options("1x2")
    };
    let preempted = report(&trace, &defaults(), &preempting);
    for figures in [&waiting, &preempted] {
        assert_eq!(figures.completed, 8, "{figures:?}");
        assert!(figures.drained);
    }
    let urgent_max_ms = |f: &VariantReport| f.wait_ms[&Priority::Urgent].max_ms;
    // Without preemption an urgent task waits for a low one to end; with it, for
    // preempt_after_ms and the victim's next lease heartbeat (every 10 s here).
    assert!(urgent_max_ms(&waiting) >= 599_000, "{waiting:?}");
    assert!(
        urgent_max_ms(&preempted) <= 5_000 + 10_000 + 200,
        "{preempted:?}"
    );
    // Preempted attempts are not spent: the same attempts per task as scripted (none failed)
    // plus the stopped ones, and nothing completes twice.
    assert!(preempted.attempts_per_task > 1.0);
    assert_eq!(preempted.dead, 0);
}

/// Two models on two one-GPU workers: waiting for the warm GPU (`affinity_wait_ms`) loads each
/// model about once, taking whichever GPU is free loads on most attempts, and a load lengthens
/// the attempt by `model_load_ms`.
#[test]
fn warm_model_placement_in_a_simulation_saves_loads() {
    const LOAD_MS: u64 = 2_000;
    let tasks: Vec<TraceTask> = (0..100u64)
        .map(|n| {
            let mut task = TraceTask::at(n * 400, 300);
            // A load counts against the attempt's timeout, as it does live.
            task.est_exec_ms = Some(3_000);
            task.model = Some(if n % 2 == 0 { "seg-a" } else { "seg-b" }.into());
            task
        })
        .collect();
    let trace = Trace::from_tasks(tasks).unwrap();
    let run_with = |affinity_wait_ms| {
        let options = ReplayOptions {
            model_load_ms: LOAD_MS,
            engine: EngineOptions {
                affinity_wait_ms,
                ..EngineOptions::default()
            },
            ..options("2x1")
        };
        run(&trace, &defaults(), &options).unwrap()
    };
    let warm = run_with(10_000);
    let anywhere = run_with(0);
    for outcome in [&warm, &anywhere] {
        assert!(outcome.drained);
        assert_eq!(outcome.tally.ended.get(&State::Completed), Some(&100));
        // Busy time is the service time plus a load for each load.
        assert_eq!(
            outcome.busy_slot_ms,
            100 * 300 + outcome.model_loads * LOAD_MS
        );
    }
    assert!(
        warm.model_loads <= 4,
        "each GPU keeps its model: {} loads",
        warm.model_loads
    );
    assert!(
        anywhere.model_loads >= 20,
        "without waiting, models move between GPUs: {} loads",
        anywhere.model_loads
    );
    // A trace without models loads nothing, whatever the load time.
    let plain = Trace::from_tasks((0..10).map(|n| TraceTask::at(n * 400, 300))).unwrap();
    let options = ReplayOptions {
        model_load_ms: LOAD_MS,
        ..options("2x1")
    };
    assert_eq!(run(&plain, &defaults(), &options).unwrap().model_loads, 0);
}

/// Eight tasks at once on one GPU: as one batch of eight they take 1.7 times one task's time
/// (alpha 0.1) instead of eight times, and every task still completes once.
#[test]
fn a_gpu_batch_runs_its_tasks_together_for_one_batch_time() {
    let tasks = (0..8).map(|_| {
        let mut task = TraceTask::at(0, 1_000);
        task.model = Some("seg".into());
        task
    });
    let trace = Trace::from_tasks(tasks).unwrap();
    let batched = ReplayOptions {
        batch: Some(SimBatch::parse("8:20", 0.1).unwrap()),
        ..options("1x1")
    };
    let figures = report(&trace, &defaults(), &batched);
    assert_eq!(figures.completed, 8);
    assert_eq!(figures.makespan_ms, 1_700);
    assert_eq!(figures.utilisation, 1.0);
    assert_eq!(figures.tasks_per_gpu_s, 4.706);
    assert_eq!(
        figures.wait_ms[&Priority::Normal].max_ms,
        0,
        "a full batch goes at once"
    );
    let single = report(&trace, &defaults(), &options("1x1"));
    assert_eq!(single.makespan_ms, 8_000);
    assert_eq!(single.tasks_per_gpu_s, 1.0);
}

/// Over a generated inference trace on a saturated fleet, batches of up to eight get more
/// than three times the tasks per GPU-second of single tasks, and both runs end every task.
#[test]
fn batches_raise_tasks_per_gpu_second_on_a_saturated_inference_trace() {
    let tasks =
        crate::trace::generate::generate(crate::trace::generate::Shape::GpuBatches, 3_000, 5);
    let trace = Trace::from_tasks(tasks).unwrap();
    let batched = ReplayOptions {
        batch: Some(SimBatch::parse("8:20", 0.1).unwrap()),
        ..options("2x1")
    };
    let with_batches = report(&trace, &defaults(), &batched);
    let single = report(&trace, &defaults(), &options("2x1"));
    for figures in [&with_batches, &single] {
        assert!(figures.drained);
        assert_eq!(figures.completed, 3_000);
    }
    assert!(
        with_batches.tasks_per_gpu_s > 3.0 * single.tasks_per_gpu_s,
        "{} against {}",
        with_batches.tasks_per_gpu_s,
        single.tasks_per_gpu_s
    );
}

#[test]
fn a_batch_spec_is_checked() {
    assert!(SimBatch::parse("0", 0.1).is_err());
    assert!(SimBatch::parse("65", 0.1).is_err());
    assert!(SimBatch::parse("8:x", 0.1).is_err());
    assert!(SimBatch::parse("8:20000", 0.1).is_err());
    assert!(SimBatch::parse("8", 11.0).is_err());
    let batch = SimBatch::parse("8", 0.25).unwrap();
    assert_eq!((batch.max_size, batch.max_wait_ms), (8, 0));
    assert_eq!(batch.batch_ms(100, 5), 200);
}
