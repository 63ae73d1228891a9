//! `sluice policy upload|activate|rollback|list|keygen|sign`: the policy registry from a
//! shell, and the ed25519 keys and signatures a site's signed uploads need.

use super::tasks::ServerArg;
use anyhow::Context;
use sluice_client::Client;
use sluice_policy_runtime::defaults;
use sluice_server::auth::signing;
use std::path::PathBuf;

/// What a version's instances are granted, when not the server's defaults.
#[derive(clap::Args, Clone, Copy, Debug, Default)]
pub struct GrantArgs {
    /// Memory each instance may use, in bytes [default: the server's policy_memory_limit_bytes]
    #[arg(long = "memory-limit")]
    pub memory_limit_bytes: Option<u64>,
    /// Fuel (about one unit a wasm instruction) each call may burn [default: policy_call_fuel]
    #[arg(long = "fuel")]
    pub call_fuel: Option<u64>,
}

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
        /// aging-threshold, aging-age-factor, aging-deadline, retry-backoff, split-shards,
        /// split-hash, split-range, split-ivf, merge-topk, merge-threshold or merge-weighted.
        #[arg(long)]
        builtin: Option<String>,
        /// A setting for the component's init, name=value; repeatable. Without any, the
        /// server's settings of the kind apply.
        #[arg(long = "config")]
        settings: Vec<String>,
        /// The component's detached signature (`sluice policy sign` writes it), sent as the
        /// Sluice-Signature header; without it, FILE.sig is sent when it exists.
        #[arg(long)]
        signature: Option<PathBuf>,
        #[command(flatten)]
        grants: GrantArgs,
        /// A data blob stored beside the version, name=FILE (e.g. centroids=lists.npy);
        /// repeatable. The component reads it in init.
        #[arg(long = "data", value_parser = parse_data)]
        data: Vec<(String, PathBuf)>,
    },
    /// Write a buildable policy project on the Rust SDK: DIR/NAME (the SDK vendored inside).
    New {
        /// priority, aging, retry, split or merge.
        kind: String,
        /// The crate's name (lower case, digits, - and _).
        name: String,
        /// The language of the project: rust; python (priority, retry and aging; built with
        /// componentize-py); or js (priority and retry; built with componentize-js).
        #[arg(long, default_value = "rust")]
        lang: String,
        /// Where to create the project.
        #[arg(long, default_value = ".")]
        dir: PathBuf,
    },
    /// Validate a component offline as an upload would: compile, imports, world, init with
    /// the config, and the kind's conformance cases. Exits non-zero with what failed.
    Check {
        file: PathBuf,
        /// The kind to check it as; by default the kind whose world it exports.
        #[arg(long)]
        kind: Option<String>,
        /// A setting for the component's init, name=value; repeatable.
        #[arg(long = "config")]
        settings: Vec<String>,
        #[command(flatten)]
        grants: GrantArgs,
        /// A data blob for the version, name=FILE; repeatable. Checked as an upload checks it:
        /// init and the conformance cases again, with the data.
        #[arg(long = "data", value_parser = parse_data)]
        data: Vec<(String, PathBuf)>,
    },
    /// Run a priority, aging or retry component offline against a table of cases (TOML:
    /// `[[case]]` with `name`, `task`, `failure` for retry, and `expect`); prints a diff for
    /// each case that differs and exits non-zero if any does.
    Test {
        file: PathBuf,
        /// The case table (docs/policies.md, "Testing a policy offline").
        #[arg(long)]
        cases: PathBuf,
        #[arg(long)]
        kind: Option<String>,
        /// A setting for the component's init, name=value; repeatable.
        #[arg(long = "config")]
        settings: Vec<String>,
        #[command(flatten)]
        grants: GrantArgs,
    },
    /// What one decision of a component costs, one at a time and in batches.
    Bench {
        file: PathBuf,
        #[arg(long)]
        kind: Option<String>,
        #[arg(long = "config")]
        settings: Vec<String>,
        #[command(flatten)]
        grants: GrantArgs,
        /// Decisions measured per batch size.
        #[arg(long, default_value_t = 100_000)]
        decisions: usize,
    },
    /// Make a signing key pair: the secret key to FILE (mode 0600), and the public key's line
    /// for the server's `policy_signing_keys` to stdout.
    Keygen {
        /// The key's id, named in signatures and kept with each version it signs.
        #[arg(long)]
        id: String,
        /// Where to write the secret key; refused if it exists.
        #[arg(long)]
        out: PathBuf,
    },
    /// Sign a component: writes COMPONENT.sig (or --out) for `policy upload`.
    Sign {
        /// The secret key file `policy keygen` wrote.
        #[arg(long)]
        key: PathBuf,
        component: PathBuf,
        #[arg(long)]
        out: Option<PathBuf>,
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
    /// Roll a stored version out in steps: it decides for a growing share of new tasks (a
    /// live experiment against the active version), each step judged by the guards on its own
    /// tasks; a failed guard rolls it back at once, the last step makes it active.
    Rollout {
        #[command(flatten)]
        server: ServerArg,
        /// priority, aging or retry.
        kind: String,
        version: u32,
        /// The version's share of new tasks at each step, in percent, ending at 100.
        #[arg(long, value_delimiter = ',', default_value = "5,25,50,100")]
        steps: Vec<u32>,
        /// How long each step runs before its guards are judged.
        #[arg(long, default_value_t = sluice_model::DEFAULT_STEP_MS)]
        step_ms: u64,
        /// METRIC OP LIMIT, e.g. 'low.wait_p99_ms <= 2000', 'faults == 0',
        /// 'urgent.wait_p99_ms <= baseline + 20%'; repeatable. Every one must hold.
        #[arg(long = "guard", value_parser = parse_guard)]
        guards: Vec<String>,
        /// The new version's tasks a step waits for before it is judged.
        #[arg(long, default_value_t = sluice_model::DEFAULT_MIN_TASKS)]
        min_tasks: u32,
        /// What keeps a task with one version: task, device or tenant.
        #[arg(long, default_value = "task")]
        assign_by: String,
    },
    /// Every rollout, or one: its state, steps, and how each guard was judged.
    Rollouts {
        #[command(flatten)]
        server: ServerArg,
        id: Option<u32>,
    },
    /// Stop a running rollout: the active version decides for every task again.
    RolloutStop {
        #[command(flatten)]
        server: ServerArg,
        id: u32,
    },
    /// Each kind's active version; with a kind, its versions and history too.
    List {
        #[command(flatten)]
        server: ServerArg,
        kind: Option<String>,
    },
}

/// A guard as written, refused here when it does not parse (the server judges it).
fn parse_guard(text: &str) -> Result<String, String> {
    text.parse::<sluice_model::Guard>()?;
    Ok(text.to_owned())
}

/// A component file for a local tool (check, test, bench): its bytes, the kind asked for (if
/// any) and its settings as config lines.
fn local_component(
    file: &std::path::Path,
    kind: Option<String>,
    settings: &[String],
) -> anyhow::Result<(Vec<u8>, Option<sluice_policy_runtime::Kind>, Option<String>)> {
    let bytes = read_component(file)?;
    let kind = kind.map(|k| k.parse()).transpose()?;
    let config = (!settings.is_empty()).then(|| settings.join("\n"));
    Ok((bytes, kind, config))
}

pub async fn run(command: PolicyCommand) -> anyhow::Result<()> {
    let answer = match command {
        PolicyCommand::Upload {
            server,
            kind,
            file,
            builtin,
            settings,
            signature,
            grants,
            data,
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
            let signature_file = signature.or_else(|| {
                let beside = signature_beside(file.as_ref()?);
                beside.exists().then_some(beside)
            });
            let signature = match &signature_file {
                Some(path) => Some(
                    std::fs::read_to_string(path)
                        .with_context(|| format!("cannot read the signature {}", path.display()))?,
                ),
                None => None,
            };
            let client = client(&server)?;
            let mut uploaded = client
                .upload_policy(
                    &kind,
                    component,
                    config.as_deref(),
                    signature.as_deref(),
                    (grants.memory_limit_bytes, grants.call_fuel),
                )
                .await?;
            let version = uploaded["version"].as_u64().unwrap_or(0);
            let mut stored = Vec::new();
            for (name, path) in data {
                let bytes = std::fs::read(&path)
                    .with_context(|| format!("cannot read the data {}", path.display()))?;
                // `sluice policy sign` signs a blob as it signs a component: FILE.sig beside it.
                let beside = signature_beside(&path);
                let signature = match beside.exists() {
                    true => Some(std::fs::read_to_string(&beside).with_context(|| {
                        format!("cannot read the signature {}", beside.display())
                    })?),
                    false => None,
                };
                stored.push(
                    client
                        .put_policy_data(&kind, version, &name, bytes, signature.as_deref())
                        .await?,
                );
            }
            if !stored.is_empty() {
                uploaded["data"] = serde_json::Value::Array(stored);
            }
            uploaded
        }
        PolicyCommand::Keygen { id, out } => return keygen(&id, &out),
        PolicyCommand::New {
            kind,
            name,
            lang,
            dir,
        } => {
            let root = super::policy_kit::new_project(kind.parse()?, &name, &lang, &dir)?;
            outln!("{}", root.display())?;
            return Ok(());
        }
        PolicyCommand::Check {
            file,
            kind,
            settings,
            grants,
            data,
        } => {
            let (bytes, kind, config) = local_component(&file, kind, &settings)?;
            let data = read_data(&data)?;
            let (kind, ..) = super::policy_kit::check(&bytes, kind, config, grants, &data)?;
            outln!(
                "ok: {} is a {kind} policy; it compiled, imports nothing it may not, inits with its config and passes the {kind} conformance cases",
                file.display()
            )?;
            return Ok(());
        }
        PolicyCommand::Test {
            file,
            cases,
            kind,
            settings,
            grants,
        } => {
            let (bytes, kind, config) = local_component(&file, kind, &settings)?;
            return tokio::task::spawn_blocking(move || {
                super::policy_test::run(&bytes, kind, config, grants, &cases)
            })
            .await?;
        }
        PolicyCommand::Bench {
            file,
            kind,
            settings,
            grants,
            decisions,
        } => {
            let (bytes, kind, config) = local_component(&file, kind, &settings)?;
            return tokio::task::spawn_blocking(move || {
                super::policy_kit::bench(&bytes, kind, config, grants, &[], decisions)
            })
            .await?;
        }
        PolicyCommand::Sign {
            key,
            component,
            out,
        } => return sign(&key, &component, out),
        PolicyCommand::Activate {
            server,
            kind,
            version,
        } => client(&server)?.activate_policy(&kind, version).await?,
        PolicyCommand::Rollback { server, kind } => client(&server)?.rollback_policy(&kind).await?,
        PolicyCommand::Rollout {
            server,
            kind,
            version,
            steps,
            step_ms,
            guards,
            min_tasks,
            assign_by,
        } => {
            let spec = serde_json::json!({
                "kind": kind, "version": version, "steps": steps, "step_ms": step_ms,
                "guards": guards, "min_tasks": min_tasks, "assign_by": assign_by,
            });
            client(&server)?.start_rollout(&spec).await?
        }
        PolicyCommand::Rollouts { server, id } => client(&server)?.rollouts(id).await?,
        PolicyCommand::RolloutStop { server, id } => client(&server)?.stop_rollout(id).await?,
        PolicyCommand::List { server, kind } => client(&server)?.policies(kind.as_deref()).await?,
    };
    outln!("{}", serde_json::to_string_pretty(&answer)?)?;
    Ok(())
}

/// The blobs of `--data name=FILE`, read.
fn read_data(data: &[(String, PathBuf)]) -> anyhow::Result<Vec<(String, Vec<u8>)>> {
    data.iter()
        .map(|(name, path)| {
            let bytes = std::fs::read(path)
                .with_context(|| format!("cannot read the data {}", path.display()))?;
            Ok((name.clone(), bytes))
        })
        .collect()
}

fn client(server: &ServerArg) -> anyhow::Result<Client> {
    server.client()
}

fn parse_data(text: &str) -> Result<(String, PathBuf), String> {
    text.split_once('=')
        .map(|(name, file)| (name.to_owned(), PathBuf::from(file)))
        .ok_or_else(|| format!("`{text}` is not name=FILE"))
}

fn read_component(file: &std::path::Path) -> anyhow::Result<Vec<u8>> {
    std::fs::read(file).with_context(|| format!("cannot read the component {}", file.display()))
}

/// `FILE.sig`: where `policy sign` writes a component's signature and `policy upload` looks.
fn signature_beside(component: &std::path::Path) -> PathBuf {
    let mut name = component.as_os_str().to_owned();
    name.push(".sig");
    PathBuf::from(name)
}

fn keygen(id: &str, out: &std::path::Path) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let (secret, public_key) = signing::generate(id)?;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(out)
        .with_context(|| format!("cannot create the key file {}", out.display()))?;
    file.write_all(secret.as_bytes())?;
    file.sync_all()?;
    outln!(
        "# the secret key is in {}; give the server this line:",
        out.display()
    )?;
    outln!("policy_signing_keys = [{{ id = \"{id}\", public_key = \"{public_key}\" }}]")?;
    Ok(())
}

fn sign(
    key: &std::path::Path,
    component: &std::path::Path,
    out: Option<PathBuf>,
) -> anyhow::Result<()> {
    let key_file = std::fs::read_to_string(key)
        .with_context(|| format!("cannot read the key file {}", key.display()))?;
    let module = std::fs::read(component)
        .with_context(|| format!("cannot read the component {}", component.display()))?;
    let signature = signing::sign(&key_file, &module)?;
    let out = out.unwrap_or_else(|| signature_beside(component));
    std::fs::write(&out, format!("{signature}\n"))
        .with_context(|| format!("cannot write {}", out.display()))?;
    outln!("{}", out.display())?;
    Ok(())
}
