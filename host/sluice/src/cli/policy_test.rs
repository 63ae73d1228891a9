//! `sluice policy test FILE.wasm --cases CASES.toml`: a component run offline against a table
//! of cases — tasks with names, labels and failures, and the bucket, rank, timeout, promotion
//! or retry decision each should get — printing what differs for each case that does.

use anyhow::{Context, bail};
use policy_packed::{Bucket, DeadReason, Decision, ErrorClass, Failure, View};
use sluice_model::{NamesRef, TaskNames};
use sluice_policy_runtime::{Kind, PolicyRegistry};
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// A case table larger than this is refused: it is read whole.
pub const MAX_CASES_BYTES: u64 = 4 << 20;
pub const MAX_CASES: usize = 10_000;
/// The moment every case is decided at; a task's times are given relative to it.
const NOW_MS: u64 = 1_800_000_000_000;

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Table {
    #[serde(default, rename = "case")]
    cases: Vec<Case>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Case {
    name: String,
    task: CaseTask,
    /// For a retry policy: the failed attempt.
    failure: Option<CaseFailure>,
    expect: Expect,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct CaseTask {
    #[serde(default)]
    kind: String,
    #[serde(default)]
    tenant: String,
    #[serde(default)]
    device: String,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    /// The bucket it was submitted to.
    #[serde(default = "normal")]
    priority: String,
    /// The bucket it waits in now (aging, retry); by default the one it was submitted to.
    bucket: Option<String>,
    #[serde(default)]
    seq: u64,
    /// How long it has waited in its bucket (and since it was created).
    #[serde(default)]
    waited_ms: u64,
    #[serde(default)]
    est_exec_ms: u64,
    #[serde(default)]
    attempt: u32,
}

fn normal() -> String {
    "normal".into()
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct CaseFailure {
    class: String,
    #[serde(default = "three")]
    max_attempts: u32,
    #[serde(default)]
    random: u64,
}

fn three() -> u32 {
    3
}

/// What the case should get; only what is given is compared.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Expect {
    bucket: Option<String>,
    rank: Option<u64>,
    attempt_timeout_ms: Option<u64>,
    /// Aging: the bucket it moves to, or "none".
    promote: Option<String>,
    /// Retry: the delay, or the reason it is dead (permanent, invalid-input, attempts-spent,
    /// policy).
    retry_after_ms: Option<u64>,
    dead: Option<String>,
}

fn bucket(name: &str) -> anyhow::Result<Bucket> {
    match name {
        "urgent" => Ok(Bucket::Urgent),
        "normal" => Ok(Bucket::Normal),
        "low" => Ok(Bucket::Low),
        other => bail!("`{other}` is not a bucket (urgent, normal or low)"),
    }
}

fn bucket_name(bucket: Bucket) -> &'static str {
    match bucket {
        Bucket::Urgent => "urgent",
        Bucket::Normal => "normal",
        Bucket::Low => "low",
    }
}

fn class(name: &str) -> anyhow::Result<ErrorClass> {
    Ok(match name.replace('_', "-").as_str() {
        "transient" => ErrorClass::Transient,
        "node-busy" => ErrorClass::NodeBusy,
        "lease-expired" => ErrorClass::LeaseExpired,
        "timeout" => ErrorClass::Timeout,
        "permanent" => ErrorClass::Permanent,
        "invalid-input" => ErrorClass::InvalidInput,
        other => bail!(
            "`{other}` is not an error class (transient, node-busy, lease-expired, timeout, \
             permanent or invalid-input)"
        ),
    })
}

fn dead_name(reason: DeadReason) -> &'static str {
    match reason {
        DeadReason::Permanent => "permanent",
        DeadReason::InvalidInput => "invalid-input",
        DeadReason::AttemptsSpent => "attempts-spent",
        DeadReason::Policy => "policy",
    }
}

impl CaseTask {
    fn view(&self) -> anyhow::Result<View> {
        let submitted = bucket(&self.priority)?;
        let since_ms = NOW_MS.saturating_sub(self.waited_ms);
        Ok(View {
            seq: self.seq,
            tenant: policy_packed::name_code(&self.tenant),
            kind: policy_packed::name_code(&self.kind),
            bucket: self.bucket.as_deref().map_or(Ok(submitted), bucket)?,
            submitted_bucket: submitted,
            created_ms: since_ms,
            bucket_since_ms: since_ms,
            attempt: self.attempt,
            est_exec_ms: self.est_exec_ms,
        })
    }

    fn names(&self) -> TaskNames {
        TaskNames {
            kind: self.kind.clone(),
            tenant: self.tenant.clone(),
            device: self.device.clone(),
            labels: self.labels.clone(),
        }
    }
}

/// Reads and checks a case table.
fn read_table(path: &std::path::Path) -> anyhow::Result<Vec<Case>> {
    let size = std::fs::metadata(path)
        .with_context(|| format!("cannot read {}", path.display()))?
        .len();
    if size > MAX_CASES_BYTES {
        bail!(
            "{} is {size} bytes; a case table may have {MAX_CASES_BYTES}",
            path.display()
        );
    }
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read {} as UTF-8 text", path.display()))?;
    let table: Table = toml::from_str(&text).map_err(|e| {
        let line = e
            .span()
            .map_or(0, |span| text[..span.start].lines().count().max(1));
        anyhow::anyhow!("{} line {line}: {}", path.display(), e.message())
    })?;
    if table.cases.is_empty() {
        bail!("{} has no [[case]]", path.display());
    }
    if table.cases.len() > MAX_CASES {
        bail!(
            "{} has {} cases; at most {MAX_CASES}",
            path.display(),
            table.cases.len()
        );
    }
    Ok(table.cases)
}

/// One line per field that differs, `- expected` then `+ got`.
fn differ(
    diff: &mut String,
    field: &str,
    expected: impl std::fmt::Display,
    got: impl std::fmt::Display,
) {
    let expected = expected.to_string();
    let got = got.to_string();
    if expected != got {
        let _ = writeln!(diff, "  - {field}: {expected}\n  + {field}: {got}");
    }
}

/// What the component decides for `case`, against what it should: empty when they agree.
fn run_case(registry: &PolicyRegistry, kind: Kind, case: &Case) -> anyhow::Result<String> {
    let view = case.task.view()?;
    let names = case.task.names();
    let names: [NamesRef; 1] = [names.borrowed()];
    let expect = &case.expect;
    let mut diff = String::new();
    match kind {
        Kind::Priority => {
            let decided = registry.admit(NOW_MS, None, &[view], &names)?;
            let Some(admission) = decided.answer.first() else {
                bail!("the policy answered no admission");
            };
            if let Some(want) = &expect.bucket {
                differ(&mut diff, "bucket", want, bucket_name(admission.bucket));
            }
            if let Some(want) = expect.rank {
                differ(&mut diff, "rank", want, admission.rank);
            }
            if let Some(want) = expect.attempt_timeout_ms {
                differ(
                    &mut diff,
                    "attempt_timeout_ms",
                    want,
                    admission.attempt_timeout_ms,
                );
            }
        }
        Kind::Aging => {
            let decided = registry.age(NOW_MS, None, &[view], &names)?;
            let got = decided
                .answer
                .first()
                .map_or("none", |&(_, to)| bucket_name(to));
            if let Some(want) = &expect.promote {
                differ(&mut diff, "promote", want, got);
            }
        }
        Kind::Retry => {
            let Some(failure) = &case.failure else {
                bail!("a retry case needs a failure = {{ class = ... }}");
            };
            let failure = Failure {
                task: view,
                class: class(&failure.class)?,
                max_attempts: failure.max_attempts,
                random: failure.random,
            };
            let decided = registry.retry(NOW_MS, None, &[failure], &names)?;
            let Some(&decision) = decided.answer.first() else {
                bail!("the policy answered no decision");
            };
            let got = match decision {
                Decision::RetryAfterMs(ms) => format!("retry after {ms} ms"),
                Decision::Dead(reason) => format!("dead ({})", dead_name(reason)),
            };
            let want = match (expect.retry_after_ms, &expect.dead) {
                (Some(ms), None) => format!("retry after {ms} ms"),
                (None, Some(reason)) => format!("dead ({reason})"),
                _ => bail!("a retry case expects one of retry_after_ms or dead"),
            };
            differ(&mut diff, "decision", want, got);
        }
        Kind::Split | Kind::Merge => bail!("policy test covers priority, aging and retry policies"),
    }
    Ok(diff)
}

/// Runs every case; prints a diff for each that differs and fails when any does.
pub fn run(
    bytes: &[u8],
    kind: Option<Kind>,
    config: Option<String>,
    grants: super::policy::GrantArgs,
    cases: &std::path::Path,
) -> anyhow::Result<()> {
    let table = read_table(cases)?;
    let (kind, registry, version) = super::policy_kit::check(bytes, kind, config, grants, &[])?;
    registry.activate(kind, version, 0)?;
    let mut failed = 0;
    for (number, case) in table.iter().enumerate() {
        let diff = run_case(&registry, kind, case)
            .with_context(|| format!("case {} ({})", number + 1, case.name))?;
        if !diff.is_empty() {
            failed += 1;
            outln!(
                "FAIL case {} ({})\n{}",
                number + 1,
                case.name,
                diff.trim_end()
            )?;
        }
    }
    if failed > 0 {
        bail!("{failed} of {} cases differ", table.len());
    }
    outln!("ok: {} cases pass ({kind})", table.len())?;
    Ok(())
}
