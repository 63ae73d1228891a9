//! `sluice serve`: resolve the configuration, open the store, bind, announce, serve.

use anyhow::Context;
use sluice_server::config::{FileConfig, Overrides, ServeConfig};
use sluice_server::replica::{self, ReplicaRole};
use sluice_server::server::{AuthMode, Server};
use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct ServeArgs {
    /// A TOML file of settings (see README); flags and SLUICE_* variables override it.
    #[arg(long, env = "SLUICE_CONFIG")]
    config: Option<PathBuf>,
    /// Serve without auth even on a non-loopback address: anyone who reaches the port is an
    /// admin. Warned at every start. (The bootstrap admin token is read from the
    /// SLUICE_ADMIN_TOKEN variable only, never from a flag, so it stays out of `ps`.)
    #[arg(long)]
    insecure_no_auth: bool,
    /// A policy setting, kind.name=value (e.g. retry.initial_delay_ms=100); repeatable.
    /// Overrides the same setting in the file's [policies.<kind>] table.
    #[arg(long = "policy-config")]
    policy_settings: Vec<String>,
    /// Resolve the settings (defaults, file, environment, flags), print them as a config file
    /// and exit, without opening the store; an invalid one exits non-zero with the reason.
    #[arg(long)]
    check_config: bool,
    #[command(flatten)]
    settings: SettingFlags,
}

/// Every setting of `ServeConfig::settings()` as a flag (`--lease-ms`) and a variable
/// (`SLUICE_LEASE_MS`), built from the settings' declarations: a setting declared there has
/// both, and its `--help` line, with nothing written here.
pub struct SettingFlags {
    given: Vec<(String, String)>,
}

impl clap::FromArgMatches for SettingFlags {
    fn from_arg_matches(matches: &clap::ArgMatches) -> Result<Self, clap::Error> {
        let given = ServeConfig::settings()
            .into_iter()
            .filter_map(|setting| {
                let text = matches.get_one::<String>(setting.name)?;
                Some((setting.name.to_owned(), text.clone()))
            })
            .collect();
        Ok(SettingFlags { given })
    }

    fn update_from_arg_matches(&mut self, matches: &clap::ArgMatches) -> Result<(), clap::Error> {
        *self = Self::from_arg_matches(matches)?;
        Ok(())
    }
}

impl clap::Args for SettingFlags {
    fn augment_args(command: clap::Command) -> clap::Command {
        ServeConfig::settings()
            .into_iter()
            .fold(command, |command, setting| {
                let default = format!("[default: {}]", setting.default_text);
                let long_help = setting
                    .doc
                    .lines()
                    .map(str::trim)
                    .collect::<Vec<_>>()
                    .join(" ");
                let arg = clap::Arg::new(setting.name)
                    .long(setting.flag())
                    // `--lease-ms -5` reaches the setting's own check, which names it, rather
                    // than clap's "unexpected argument '-5'".
                    .allow_negative_numbers(true);
                let arg = match setting.choices {
                    Some(choices) => arg.value_parser(clap::builder::PossibleValuesParser::new(
                        choices.iter().copied(),
                    )),
                    None => arg,
                };
                command.arg(
                    arg.env(setting.env())
                        // A URL may carry a password: the variables' values stay out of --help.
                        .hide_env_values(true)
                        .value_name(setting.name.to_ascii_uppercase())
                        .help(format!("{} {default}", setting.summary()))
                        .long_help(format!("{long_help} {default}")),
                )
            })
    }

    fn augment_args_for_update(command: clap::Command) -> clap::Command {
        Self::augment_args(command)
    }
}

pub async fn run(args: ServeArgs) -> anyhow::Result<()> {
    let file = match &args.config {
        Some(path) => FileConfig::load(path)?,
        None => FileConfig::default(),
    };
    let overrides = Overrides {
        given: args.settings.given,
        policy_settings: args.policy_settings,
        admin_token: std::env::var("SLUICE_ADMIN_TOKEN")
            .ok()
            .filter(|token| !token.is_empty()),
        insecure_no_auth: args.insecure_no_auth,
    };
    let config = ServeConfig::resolve(file, overrides)?;
    for (name, nearest) in unknown_variables(std::env::vars_os().map(|(name, _)| name)) {
        match nearest {
            Some(nearest) => tracing::warn!(
                "{name} is not a variable Sluice reads (did you mean {nearest}?); it is ignored"
            ),
            None => tracing::warn!("{name} is not a variable Sluice reads; it is ignored"),
        }
    }
    if args.check_config {
        let mut stdout = std::io::stdout();
        stdout.write_all(config.effective_toml().as_bytes())?;
        stdout.flush()?;
        return Ok(());
    }
    private_data_dir(&config.data_dir)?;
    if config.store.is_some() {
        return serve_replica(config).await;
    }
    let data_dir = config.data_dir.display().to_string();
    let server = tokio::task::spawn_blocking(move || Server::open(&config).map(|s| (s, config)))
        .await
        .context("opening the store")??;
    let (server, config) = server;
    let listener = bind(config.listen).await?;
    let address = listener.local_addr()?;
    let auth = auth_words(server.auth_mode());
    tracing::info!(%address, data_dir, auth, "ready");
    announce(server.scheme(), address, auth)?;
    server.run(listener, shutdown_signal()).await?;
    Ok(())
}

/// One replica on a PostgreSQL store: bound first, so that the lease names the address it
/// serves; then leading, or following until it takes the lease over.
async fn serve_replica(config: ServeConfig) -> anyhow::Result<()> {
    let listener = bind(config.listen).await?;
    let address = listener.local_addr()?;
    let store = config
        .store
        .as_deref()
        .map(sluice_store_postgres::redacted)
        .unwrap_or_default();
    let (stop, stopping) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        shutdown_signal().await;
        stop.send_replace(true);
    });
    let until_stopped = |mut stopping: tokio::sync::watch::Receiver<bool>| async move {
        let _ = stopping.wait_for(|stop| *stop).await;
    };
    let config_for_start = config.clone();
    let role = tokio::task::spawn_blocking(move || replica::start(&config_for_start, address))
        .await
        .context("opening the store")??;
    let (server, listener) = match role {
        ReplicaRole::Leading(server) => {
            let auth = auth_words(server.auth_mode());
            tracing::info!(%address, store, auth, "ready, leading");
            announce(server.scheme(), address, auth)?;
            (server, listener)
        }
        ReplicaRole::Following(follower) => {
            let auth = auth_words(follower.auth_mode());
            tracing::info!(%address, store, auth, leader = follower.leader_address(), "ready, following");
            announce(follower.scheme(), address, auth)?;
            match follower.run(listener, stopping.clone()).await? {
                Some(taken_over) => taken_over,
                None => return Ok(()),
            }
        }
    };
    server.run(listener, until_stopped(stopping)).await?;
    Ok(())
}

/// Variables the command, its benches and the project's tests read besides the settings' own.
const OTHER_VARIABLES: [&str; 18] = [
    "SLUICE_CONFIG",
    "SLUICE_ADMIN_TOKEN",
    "SLUICE_LOG",
    "SLUICE_LOG_FORMAT",
    "SLUICE_LOG_SPANS",
    "SLUICE_SERVER",
    "SLUICE_TOKEN",
    "SLUICE_CA_CERT",
    "SLUICE_DATA_DIR",
    "SLUICE_BENCH_SERVER_LOG",
    "SLUICE_TEST_POSTGRES",
    "SLUICE_REQUIRE_POSTGRES",
    "SLUICE_REQUIRE_TMPFS",
    "SLUICE_REQUIRE_BROWSER",
    "SLUICE_COMPONENTIZE_PY",
    "SLUICE_REQUIRE_COMPONENTIZE_PY",
    "SLUICE_SCHEMATHESIS",
    "SLUICE_REQUIRE_SCHEMATHESIS",
];

/// The `SLUICE_*` names among `names` that nothing reads, each with the known name nearest to
/// it when one is within a typo (two edits): a misspelled setting is otherwise silently left at
/// its default. Warned, not refused, since other tools may share the prefix.
fn unknown_variables(
    names: impl Iterator<Item = std::ffi::OsString>,
) -> Vec<(String, Option<String>)> {
    let known: Vec<String> = ServeConfig::settings()
        .iter()
        .map(|setting| setting.env())
        .chain(OTHER_VARIABLES.iter().map(|name| (*name).to_owned()))
        .collect();
    let mut unknown: Vec<(String, Option<String>)> = names
        .filter_map(|name| name.into_string().ok())
        .filter(|name| name.starts_with("SLUICE_") && !known.contains(name))
        .map(|name| {
            let nearest = known
                .iter()
                .map(|candidate| (strsim::levenshtein(&name, candidate), candidate))
                .filter(|(distance, _)| *distance <= 2)
                .min()
                .map(|(_, candidate)| candidate.clone());
            (name, nearest)
        })
        .collect();
    unknown.sort();
    unknown
}

async fn bind(listen: SocketAddr) -> anyhow::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("cannot listen on {listen}"))
}

fn auth_words(mode: AuthMode) -> &'static str {
    match mode {
        AuthMode::Tokens => "auth: bearer tokens",
        AuthMode::Open => "auth: off (loopback, no token configured)",
        AuthMode::Disabled => "auth: DISABLED by --insecure-no-auth",
    }
}

/// The one line on stdout: tools and tests read the bound address from its first word after
/// `listening on`.
fn announce(scheme: &str, address: SocketAddr, auth: &str) -> anyhow::Result<()> {
    let mut stdout = std::io::stdout();
    writeln!(stdout, "listening on {scheme}://{address} ({auth})")?;
    stdout.flush()?;
    Ok(())
}

/// Resolves on SIGTERM or SIGINT.
pub async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(mut term), Ok(mut int)) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        }
        _ => {
            tracing::warn!("cannot install signal handlers; stop with SIGKILL");
            std::future::pending::<()>().await;
        }
    }
}

/// Payloads, results and tokens' digests lie in the data directory: every file the server
/// creates is its user's alone (umask 077: files 0600, directories 0700), and the directory
/// itself is made 0700, so files an older release left readable cannot be reached either.
fn private_data_dir(dir: &std::path::Path) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    // SAFETY: umask(2) only sets this process's file mode mask; it cannot fail.
    unsafe {
        libc::umask(0o077);
    }
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    if let Err(error) = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)) {
        tracing::warn!(dir = %dir.display(), %error, "cannot make the data directory private (0700)");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::unknown_variables;

    #[test]
    fn a_misspelled_setting_variable_is_named_with_the_one_meant() {
        let names = [
            "SLUICE_LEASE_MSS",
            "SLUICE_LEASE_MS",
            "SLUICE_LOG",
            "SLUICE_WHATEVER",
            "PATH",
        ];
        let unknown = unknown_variables(names.iter().map(|name| name.into()));
        assert_eq!(
            unknown,
            vec![
                (
                    "SLUICE_LEASE_MSS".to_owned(),
                    Some("SLUICE_LEASE_MS".to_owned())
                ),
                ("SLUICE_WHATEVER".to_owned(), None),
            ]
        );
    }
}
