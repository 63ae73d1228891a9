//! `sluice policy upload|activate|rollback|list`: the policy registry from a shell.

use super::tasks::ServerArg;
use anyhow::Context;
use sluice::client::Client;
use sluice::policy::defaults;
use std::path::PathBuf;

#[derive(clap::Subcommand)]
pub enum PolicyCommand {
    /// Validate and store a component as the next version of a kind (not yet active).
    Upload {
        #[command(flatten)]
        server: ServerArg,
        /// priority, aging, retry, split or merge.
        kind: String,
        /// The component (.wasm) file.
        #[arg(required_unless_present = "builtin", conflicts_with = "builtin")]
        file: Option<PathBuf>,
        /// Upload a component shipped in this binary instead of a file: priority-buckets,
        /// aging-threshold, retry-backoff, split-shards, split-hash, split-range, split-ivf,
        /// merge-topk, merge-threshold or merge-weighted.
        #[arg(long)]
        builtin: Option<String>,
        /// A setting for the component's init, name=value; repeatable. Without any, the
        /// server's settings of the kind apply.
        #[arg(long = "config")]
        settings: Vec<String>,
    },
    /// Make a version the active one (0 is the built-in version).
    Activate {
        #[command(flatten)]
        server: ServerArg,
        kind: String,
        version: u32,
    },
    /// Restore the version that was active before the current one.
    Rollback {
        #[command(flatten)]
        server: ServerArg,
        kind: String,
    },
    /// Each kind's active version; with a kind, its versions and history too.
    List {
        #[command(flatten)]
        server: ServerArg,
        kind: Option<String>,
    },
}

pub async fn run(command: PolicyCommand) -> anyhow::Result<()> {
    let answer = match command {
        PolicyCommand::Upload {
            server,
            kind,
            file,
            builtin,
            settings,
        } => {
            let component = match (&file, &builtin) {
                (_, Some(name)) => defaults::by_name(name)
                    .with_context(|| {
                        let known: Vec<&str> = defaults::BY_NAME.iter().map(|(n, _)| *n).collect();
                        format!("no built-in policy `{name}`; known: {}", known.join(", "))
                    })?
                    .to_vec(),
                (Some(file), None) => std::fs::read(file)
                    .with_context(|| format!("cannot read the component {}", file.display()))?,
                (None, None) => anyhow::bail!("give a component file or --builtin NAME"),
            };
            let config = (!settings.is_empty()).then(|| settings.join("\n"));
            client(&server)?
                .upload_policy(&kind, component, config.as_deref())
                .await?
        }
        PolicyCommand::Activate {
            server,
            kind,
            version,
        } => client(&server)?.activate_policy(&kind, version).await?,
        PolicyCommand::Rollback { server, kind } => client(&server)?.rollback_policy(&kind).await?,
        PolicyCommand::List { server, kind } => client(&server)?.policies(kind.as_deref()).await?,
    };
    outln!("{}", serde_json::to_string_pretty(&answer)?)?;
    Ok(())
}

fn client(server: &ServerArg) -> anyhow::Result<Client> {
    Ok(Client::new(&server.server)?)
}
