//! `sluice experiment start|list|report|stop|promote`: live A/B and shadow experiments of
//! policy versions from a shell (an admin token to change them, a viewer's to read reports).

use super::tasks::ServerArg;
use anyhow::Context as _;
use sluice_model::{AssignBy, ExperimentMode, PolicyKind, VariantSpec};

#[derive(clap::Subcommand)]
pub enum ExperimentCommand {
    /// Start an experiment of a kind's stored versions; prints its record.
    Start {
        #[command(flatten)]
        server: ServerArg,
        /// priority or aging (live); also retry or merge (shadow).
        #[arg(long)]
        kind: PolicyKind,
        /// NAME=VERSION[:WEIGHT], once per variant; the first is the baseline.
        #[arg(long = "variant", value_parser = parse_variant, required = true)]
        variants: Vec<VariantSpec>,
        /// What keeps a task in its variant: task, device or tenant.
        #[arg(long, default_value = "task", value_parser = parse_assign_by)]
        assign_by: AssignBy,
        /// live (variants decide for their tasks) or shadow (they decide beside the active one).
        #[arg(long, default_value = "live", value_parser = parse_mode)]
        mode: ExperimentMode,
    },
    /// Every experiment's record.
    List {
        #[command(flatten)]
        server: ServerArg,
    },
    /// An experiment's report: figures per variant, intervals, verdict (`--json`: all of it).
    Report {
        #[command(flatten)]
        server: ServerArg,
        id: u32,
        #[arg(long)]
        json: bool,
    },
    /// End an experiment; the active version stays.
    Stop {
        #[command(flatten)]
        server: ServerArg,
        id: u32,
    },
    /// Make a variant the active version of its kind and end the experiment.
    Promote {
        #[command(flatten)]
        server: ServerArg,
        id: u32,
        variant: String,
    },
}

fn parse_variant(text: &str) -> Result<VariantSpec, String> {
    let shape = || format!("`{text}`: a variant is NAME=VERSION or NAME=VERSION:WEIGHT");
    let (name, rest) = text.split_once('=').ok_or_else(shape)?;
    let (version, weight) = match rest.split_once(':') {
        Some((version, weight)) => (version, weight.parse().map_err(|_| shape())?),
        None => (rest, 1),
    };
    Ok(VariantSpec {
        name: name.to_owned(),
        version: version.parse().map_err(|_| shape())?,
        weight,
    })
}

fn parse_assign_by(text: &str) -> Result<AssignBy, String> {
    serde_json::from_value(serde_json::Value::String(text.to_owned()))
        .map_err(|_| format!("`{text}` is not one of task, device, tenant"))
}

fn parse_mode(text: &str) -> Result<ExperimentMode, String> {
    serde_json::from_value(serde_json::Value::String(text.to_owned()))
        .map_err(|_| format!("`{text}` is not one of live, shadow"))
}

pub async fn run(command: ExperimentCommand) -> anyhow::Result<()> {
    let answer = match command {
        ExperimentCommand::Start {
            server,
            kind,
            variants,
            assign_by,
            mode,
        } => {
            let spec = serde_json::json!({
                "kind": kind, "variants": variants, "assign_by": assign_by, "mode": mode,
            });
            server.client()?.start_experiment(&spec).await?
        }
        ExperimentCommand::List { server } => server.client()?.experiments(None).await?,
        ExperimentCommand::Report { server, id, json } => {
            let report = server.client()?.experiments(Some(id)).await?;
            if !json {
                let text = report["text"]
                    .as_str()
                    .context("the server's report has no text")?;
                outln!("{}", text.trim_end())?;
                return Ok(());
            }
            report
        }
        ExperimentCommand::Stop { server, id } => server.client()?.stop_experiment(id).await?,
        ExperimentCommand::Promote {
            server,
            id,
            variant,
        } => server.client()?.promote_experiment(id, &variant).await?,
    };
    outln!("{}", serde_json::to_string_pretty(&answer)?)?;
    Ok(())
}
