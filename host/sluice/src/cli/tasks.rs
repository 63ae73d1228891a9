//! `sluice submit` and `sluice task get|list|events|cancel`: the API from a shell.

use anyhow::{Context, bail};
use sluice_client::Client;
use sluice_model::{Priority, Resources, TaskSpec};
use std::collections::BTreeMap;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct ServerArg {
    /// The Sluice server.
    #[arg(long, env = "SLUICE_SERVER", default_value = "http://127.0.0.1:7700")]
    pub server: String,
    /// The bearer token to send (prefer the variable: a flag shows in `ps`).
    #[arg(long, env = "SLUICE_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// A PEM file of CA certificates the server's https certificate may be signed by.
    #[arg(long, env = "SLUICE_CA_CERT")]
    pub ca_cert: Option<PathBuf>,
}

impl ServerArg {
    /// A client of the server with these credentials.
    pub fn client(&self) -> anyhow::Result<Client> {
        self.client_with_pool(16)
    }

    /// The same, keeping up to `idle_connections` connections open for concurrent callers.
    pub fn client_with_pool(&self, idle_connections: usize) -> anyhow::Result<Client> {
        let ca_cert_pem = match &self.ca_cert {
            Some(path) => Some(
                std::fs::read(path)
                    .with_context(|| format!("cannot read --ca-cert {}", path.display()))?,
            ),
            None => None,
        };
        let credentials = sluice_client::Credentials {
            token: self.token.clone(),
            ca_cert_pem,
        };
        Ok(Client::connect(
            &self.server,
            idle_connections,
            &credentials,
        )?)
    }
}

#[derive(clap::Args)]
pub struct SubmitArgs {
    #[command(flatten)]
    server: ServerArg,
    /// The task's kind, e.g. oct.analyze or vector.search.
    #[arg(long)]
    kind: String,
    #[arg(long, value_parser = parse_priority, default_value = "normal")]
    priority: Priority,
    /// Idempotency key: a resend with the same key and body returns the same task.
    #[arg(long)]
    key: Option<String>,
    #[arg(long, default_value = "cli")]
    device: String,
    #[arg(long, default_value = "default")]
    tenant: String,
    /// A label, k=v; repeatable.
    #[arg(long = "label", value_parser = parse_label)]
    labels: Vec<(String, String)>,
    #[arg(long, default_value_t = 60_000)]
    est_exec_ms: u64,
    /// Overall time allowed from submission, in ms.
    #[arg(long)]
    deadline_ms: Option<u64>,
    #[arg(long, default_value_t = 3)]
    max_attempts: u32,
    /// The payload, as JSON text.
    #[arg(long, conflicts_with = "payload_file")]
    payload: Option<String>,
    /// A file holding the payload as JSON.
    #[arg(long)]
    payload_file: Option<PathBuf>,
    #[arg(long)]
    callback_url: Option<String>,
    #[arg(long, default_value_t = 0)]
    gpu_memory_mb: u64,
    /// The model the task runs: workers that have it loaded are preferred
    #[arg(long)]
    model: Option<String>,
    /// What it must share with the others of a GPU batch beside its kind and model
    /// (an input shape, say)
    #[arg(long)]
    batch_key: Option<String>,
    /// Tasks with the same key run at most as many at once as the key's limit
    #[arg(long)]
    concurrency_key: Option<String>,
    /// Never preempt this task's attempts for urgent work
    #[arg(long)]
    not_preemptible: bool,
}

#[derive(clap::Subcommand)]
pub enum TaskCommand {
    /// Show one task with its payload.
    Get {
        #[command(flatten)]
        server: ServerArg,
        id: String,
    },
    /// List tasks in arrival order, filtered.
    List {
        #[command(flatten)]
        server: ServerArg,
        #[arg(long)]
        state: Option<String>,
        #[arg(long)]
        kind: Option<String>,
        #[arg(long)]
        device: Option<String>,
        #[arg(long)]
        limit: Option<usize>,
        /// Continue after this task id (a page's next_after).
        #[arg(long)]
        after: Option<String>,
    },
    /// Show a task's timeline, oldest first.
    Events {
        #[command(flatten)]
        server: ServerArg,
        id: String,
    },
    /// Cancel a task that has not finished.
    Cancel {
        #[command(flatten)]
        server: ServerArg,
        id: String,
    },
}

pub(super) fn parse_priority(text: &str) -> Result<Priority, String> {
    serde_json::from_value(serde_json::Value::String(text.to_owned()))
        .map_err(|_| format!("`{text}` is not a priority: use urgent, normal or low"))
}

pub(super) fn parse_label(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_owned(), v.to_owned())),
        _ => Err(format!("`{text}` is not a label: use key=value")),
    }
}

pub async fn submit(args: SubmitArgs) -> anyhow::Result<()> {
    let payload = match (&args.payload, &args.payload_file) {
        (Some(text), _) => serde_json::from_str(text).context("--payload is not valid JSON")?,
        (None, Some(path)) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read {}", path.display()))?;
            serde_json::from_str(&text)
                .with_context(|| format!("{} is not JSON", path.display()))?
        }
        (None, None) => serde_json::Value::Null,
    };
    let spec = TaskSpec {
        key: args.key,
        kind: args.kind,
        priority: args.priority,
        device: args.device,
        tenant: args.tenant,
        labels: args.labels.into_iter().collect::<BTreeMap<_, _>>(),
        est_exec_ms: args.est_exec_ms,
        deadline_ms: args.deadline_ms,
        max_attempts: args.max_attempts,
        payload,
        callback_url: args.callback_url,
        resources: Resources {
            gpu_memory_mb: args.gpu_memory_mb,
            model: args.model,
            batch_key: args.batch_key,
        },
        concurrency_key: args.concurrency_key,
        preemptible: !args.not_preemptible,
    };
    let answer = args.server.client()?.submit(&spec).await?;
    if answer.replayed {
        eprintln!("note: the key already named this task; nothing new was created");
    }
    print_json(&serde_json::to_value(&answer.task)?)
}

pub async fn run(command: TaskCommand) -> anyhow::Result<()> {
    let value = match command {
        TaskCommand::Get { server, id } => server.client()?.task(&id).await?,
        TaskCommand::List {
            server,
            state,
            kind,
            device,
            limit,
            after,
        } => {
            let mut query = Vec::new();
            let named = [
                ("state", state),
                ("kind", kind),
                ("device", device),
                ("after", after),
            ];
            for (name, value) in named {
                if let Some(value) = value {
                    query.push((name, value));
                }
            }
            if let Some(limit) = limit {
                if limit == 0 {
                    bail!("--limit must be at least 1");
                }
                query.push(("limit", limit.to_string()));
            }
            server.client()?.list(&query).await?
        }
        TaskCommand::Events { server, id } => server.client()?.events(&id).await?,
        TaskCommand::Cancel { server, id } => server.client()?.cancel(&id).await?,
    };
    print_json(&value)
}

fn print_json(value: &serde_json::Value) -> anyhow::Result<()> {
    outln!("{}", serde_json::to_string_pretty(value)?)?;
    Ok(())
}
