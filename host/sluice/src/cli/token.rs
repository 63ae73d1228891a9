//! `sluice token issue|list|revoke` and `sluice audit`: tokens and the audit log from a shell
//! (an admin token in `--token` or `SLUICE_TOKEN`).

use super::tasks::ServerArg;
use sluice_model::Role;
use sluice_server::auth::TokenRequest;

#[derive(clap::Subcommand)]
pub enum TokenCommand {
    /// Issue a token and print it, with its id; the token is shown this once.
    Issue {
        #[command(flatten)]
        server: ServerArg,
        #[arg(long, value_parser = parse_role)]
        role: Role,
        /// The device a device token submits as.
        #[arg(long)]
        device: Option<String>,
        /// A device token's tenant [default: default]
        #[arg(long)]
        tenant: Option<String>,
        /// The worker a worker token acts as.
        #[arg(long)]
        worker: Option<String>,
        /// Seconds until the token stops working [default: never]
        #[arg(long)]
        expires_in_s: Option<u64>,
    },
    /// Every token's record (never the token itself), revoked ones included.
    List {
        #[command(flatten)]
        server: ServerArg,
    },
    /// Revoke a token by id; it is refused from the next request on.
    Revoke {
        #[command(flatten)]
        server: ServerArg,
        id: String,
    },
    /// The audit log of admin actions.
    Audit {
        #[command(flatten)]
        server: ServerArg,
        /// Entries after this seq.
        #[arg(long, default_value_t = 0)]
        after: u64,
    },
}

fn parse_role(text: &str) -> Result<Role, String> {
    Role::ALL
        .into_iter()
        .find(|role| role.as_str() == text)
        .ok_or_else(|| format!("`{text}` is not one of admin, viewer, device, worker"))
}

pub async fn run(command: TokenCommand) -> anyhow::Result<()> {
    let answer = match command {
        TokenCommand::Issue {
            server,
            role,
            device,
            tenant,
            worker,
            expires_in_s,
        } => {
            let request = TokenRequest {
                role: Some(role),
                device,
                tenant,
                worker,
                expires_in_s,
            };
            server.client()?.issue_token(&request).await?
        }
        TokenCommand::List { server } => server.client()?.tokens().await?,
        TokenCommand::Revoke { server, id } => server.client()?.revoke_token(&id).await?,
        TokenCommand::Audit { server, after } => server.client()?.audit(after).await?,
    };
    outln!("{}", serde_json::to_string_pretty(&answer)?)?;
    Ok(())
}
