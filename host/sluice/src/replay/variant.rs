//! A replay's variants: which policy component decides each kind (`aging=builtin:NAME?config`
//! or `aging=FILE.wasm`), and the throwaway registry that loads them as a server would, so a
//! simulation runs the real components and their checks, never native stand-ins.

use super::ReplayError;
use sluice_model::PolicyKind;
use sluice_policy_runtime::{
    PolicyDecider, PolicyRegistry, PolicyRuntime, RegistryOptions, RuntimeOptions, defaults,
};
use sluice_store::MemoryCatalog;
use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;

/// Where a choice's component comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ComponentSource {
    /// One of the components embedded in the binary (`sluice policy upload --builtin NAME`).
    Builtin(String),
    File(PathBuf),
}

/// One kind's component for a variant, with the config its `init` gets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PolicyChoice {
    pub kind: PolicyKind,
    pub source: ComponentSource,
    /// `name=value` lines; none: the component's defaults.
    pub config: Option<String>,
    /// As written, for labels.
    text: String,
}

impl FromStr for PolicyChoice {
    type Err = ReplayError;

    /// `KIND=builtin:NAME[?a=1&b=2]` or `KIND=FILE.wasm[?a=1&b=2]`.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let invalid = |detail: String| ReplayError::Choice {
            choice: text.chars().take(200).collect(),
            detail,
        };
        let (kind, rest) = text
            .split_once('=')
            .ok_or_else(|| invalid("expected KIND=builtin:NAME or KIND=FILE.wasm".into()))?;
        let kind: PolicyKind = kind.parse().map_err(|e| invalid(format!("{e}")))?;
        let (source, config) = match rest.split_once('?') {
            Some((source, config)) => (source, Some(config)),
            None => (rest, None),
        };
        let source = match source.strip_prefix("builtin:") {
            Some(name) if defaults::by_name(name).is_some() => {
                ComponentSource::Builtin(name.to_owned())
            }
            Some(name) => {
                let known: Vec<&str> = defaults::BY_NAME.iter().map(|(n, _)| *n).collect();
                return Err(invalid(format!(
                    "no built-in policy `{name}`; known: {}",
                    known.join(", ")
                )));
            }
            None if source.is_empty() => return Err(invalid("no component named".into())),
            None => ComponentSource::File(PathBuf::from(source)),
        };
        let config = match config {
            Some(config) => {
                let lines: Vec<&str> = config.split('&').filter(|s| !s.is_empty()).collect();
                if let Some(bad) = lines.iter().find(|line| !line.contains('=')) {
                    return Err(invalid(format!("config `{bad}` is not name=value")));
                }
                Some(lines.join("\n"))
            }
            None => None,
        };
        Ok(PolicyChoice {
            kind,
            source,
            config,
            text: text.to_owned(),
        })
    }
}

impl fmt::Display for PolicyChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl PolicyChoice {
    pub(super) fn bytes(&self) -> Result<Vec<u8>, ReplayError> {
        match &self.source {
            ComponentSource::Builtin(name) => Ok(defaults::by_name(name)
                .map(<[u8]>::to_vec)
                .unwrap_or_default()),
            ComponentSource::File(path) => {
                std::fs::read(path).map_err(|source| ReplayError::Component {
                    path: path.clone(),
                    source,
                })
            }
        }
    }
}

/// One arm of a comparison: its name and the choices that differ from the built-in defaults.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Variant {
    pub name: String,
    pub choices: Vec<PolicyChoice>,
}

/// The kinds a replay consults: it splits no task (its engine has no split kinds), so split
/// and merge policies never run in it.
const MODELLED_KINDS: [PolicyKind; 3] =
    [PolicyKind::Priority, PolicyKind::Aging, PolicyKind::Retry];

impl Variant {
    /// What it runs, as the command line said it; `defaults` when nothing was chosen.
    pub fn label(&self) -> String {
        if self.choices.is_empty() {
            return "defaults".into();
        }
        let parts: Vec<String> = self.choices.iter().map(ToString::to_string).collect();
        parts.join(" ")
    }

    /// The variants of `--policy` (the first, "A") and `--compare` (the second, "B", which
    /// keeps A's choices of the kinds it does not name). Each kind at most once in each.
    pub fn pair(
        policy: Vec<PolicyChoice>,
        compare: Vec<PolicyChoice>,
    ) -> Result<Vec<Variant>, ReplayError> {
        for choices in [&policy, &compare] {
            for (n, choice) in choices.iter().enumerate() {
                if !MODELLED_KINDS.contains(&choice.kind) {
                    return Err(ReplayError::Choice {
                        choice: choice.to_string(),
                        detail: format!(
                            "`sluice sim` replays dispatch (priority, aging and retry) and \
                             splits no task, so a {} policy would change nothing here: compare \
                             merge strategies by recall over recorded searches with `sluice sim \
                             --merge` (a trace from `sluice trace export --with-hits`) or with an \
                             experiment on a server (`sluice experiment start --kind merge`), \
                             split strategies with a shadow one (docs/simulation.md)",
                            choice.kind
                        ),
                    });
                }
                if choices[..n].iter().any(|c| c.kind == choice.kind) {
                    return Err(ReplayError::Choice {
                        choice: choice.to_string(),
                        detail: format!("the kind {} is chosen twice", choice.kind),
                    });
                }
            }
        }
        let first = Variant {
            name: "A".into(),
            choices: policy,
        };
        if compare.is_empty() {
            return Ok(vec![first]);
        }
        let mut choices: Vec<PolicyChoice> = first
            .choices
            .iter()
            .filter(|c| compare.iter().all(|d| d.kind != c.kind))
            .cloned()
            .collect();
        choices.extend(compare);
        choices.sort_by_key(|c| c.kind);
        let second = Variant {
            name: "B".into(),
            choices,
        };
        Ok(vec![first, second])
    }

    /// A registry in memory with this variant's components uploaded and active, checked as an
    /// upload to a server checks them, and the decider over it.
    pub fn decider(&self, now_ms: u64) -> Result<LoadedVariant, ReplayError> {
        let store = Arc::new(MemoryCatalog::new());
        let runtime = Arc::new(PolicyRuntime::new(RuntimeOptions::default())?);
        let registry = Arc::new(PolicyRegistry::open(
            runtime,
            store,
            RegistryOptions::default(),
        )?);
        for choice in &self.choices {
            let bytes = choice.bytes()?;
            let uploaded = registry
                .upload(choice.kind, &bytes, choice.config.clone(), now_ms)
                .map_err(|error| ReplayError::Load {
                    choice: choice.to_string(),
                    detail: error.to_string(),
                })?;
            registry.activate(choice.kind, uploaded.version.version, now_ms)?;
        }
        Ok(LoadedVariant {
            decider: PolicyDecider::new(Arc::clone(&registry)),
            registry,
        })
    }
}

/// A variant's registry, and the decider a driver asks.
pub struct LoadedVariant {
    pub decider: PolicyDecider,
    pub registry: Arc<PolicyRegistry>,
}
