//! `sluice policy new|check|bench`: a platform team's local tools. `new` writes a buildable
//! project on the Rust, Python or JavaScript SDK (vendored, so it builds anywhere); `check` runs an
//! upload's validation and conformance offline; `bench` prints what a decision of a component
//! costs.

use anyhow::{Context, bail};
use sluice_policy_runtime::{
    Check, Kind, PolicyRegistry, PolicyRuntime, RegistryError, RegistryOptions, RuntimeOptions,
    UploadOptions,
};
use sluice_store::MemoryCatalog;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The SDK and the crates under it, vendored into every new project.
const VENDORED: [(&str, &str); 9] = [
    (
        "vendor/sluice-policy/src/lib.rs",
        include_str!("../../../../policies/sdk/src/lib.rs"),
    ),
    (
        "vendor/sluice-policy/src/task.rs",
        include_str!("../../../../policies/sdk/src/task.rs"),
    ),
    (
        "vendor/sluice-policy/src/kinds.rs",
        include_str!("../../../../policies/sdk/src/kinds.rs"),
    ),
    (
        "vendor/sluice-policy/src/instance.rs",
        include_str!("../../../../policies/sdk/src/instance.rs"),
    ),
    (
        "vendor/sluice-policy/wit/policy.wit",
        include_str!("../../../../wit/policy.wit"),
    ),
    (
        "vendor/policy-config/src/lib.rs",
        include_str!("../../../../policies/config/src/lib.rs"),
    ),
    (
        "vendor/policy-packed/src/lib.rs",
        include_str!("../../../../policies/packed/src/lib.rs"),
    ),
    (
        "Cargo.lock",
        include_str!("../../../../policies/Cargo.lock"),
    ),
    ("vendor/sluice-policy/Cargo.toml", SDK_MANIFEST),
];

const SDK_MANIFEST: &str = r#"[package]
name = "sluice-policy"
version = "0.1.0"
edition = "2024"
publish = false

[dependencies]
policy-config = { path = "../policy-config" }
policy-packed = { path = "../policy-packed" }
spin = { version = "0.10", default-features = false, features = ["mutex", "spin_mutex"] }
wit-bindgen = { version = "0.63", default-features = false, features = ["macros", "realloc"] }
"#;

const CONFIG_MANIFEST: &str = r#"[package]
name = "policy-config"
version = "0.1.0"
edition = "2024"
publish = false

[dependencies]
spin = { version = "0.10", default-features = false, features = ["mutex", "spin_mutex"] }

[target.'cfg(target_arch = "wasm32")'.dependencies]
dlmalloc = { version = "0.2", features = ["global"] }
"#;

const PACKED_MANIFEST: &str = r#"[package]
name = "policy-packed"
version = "0.1.0"
edition = "2024"
publish = false
"#;

fn project_manifest(name: &str) -> String {
    format!(
        r#"[package]
name = "{name}"
version = "0.1.0"
edition = "2024"
publish = false

[lib]
crate-type = ["cdylib", "rlib"]

[dependencies]
sluice-policy = {{ path = "vendor/sluice-policy" }}

# A workspace of its own: it builds for wasm32-wasip2, not for the machine it is on.
[workspace]

[profile.release]
opt-level = 3
lto = true
codegen-units = 1
strip = true
"#
    )
}

/// A first policy of each kind: the smallest useful logic, for the author to replace.
fn template(kind: Kind) -> &'static str {
    match kind {
        Kind::Retry => include_str!("../../assets/policy-templates/retry.rs"),
        Kind::Aging => include_str!("../../assets/policy-templates/aging.rs"),
        Kind::Priority => include_str!("../../assets/policy-templates/priority.rs"),
        Kind::Split => include_str!("../../assets/policy-templates/split.rs"),
        Kind::Merge => include_str!("../../assets/policy-templates/merge.rs"),
    }
}

/// The Python SDK module, vendored into every Python project.
const PYTHON_SDK: &str = include_str!("../../../../policies/examples/python/sdk/sluice_policy.py");

/// A first Python policy of each kind the Python SDK covers.
fn python_template(kind: Kind) -> anyhow::Result<&'static str> {
    match kind {
        Kind::Priority => Ok(include_str!("../../assets/policy-templates/priority.py")),
        Kind::Retry => Ok(include_str!("../../assets/policy-templates/retry.py")),
        Kind::Aging => Ok(include_str!("../../assets/policy-templates/aging.py")),
        Kind::Split | Kind::Merge => bail!(
            "--lang python: the Python SDK's templates cover priority, retry and aging policies; \
             write a {kind} policy in rust (or see policies/examples/python/split-live-shards)"
        ),
    }
}

/// The files of a Python project: the policy, its unit test where the template has one, the
/// SDK module and the WIT it builds against.
fn python_files(kind: Kind, name: &str) -> anyhow::Result<Vec<(String, String)>> {
    let world = format!("named-{kind}-policy");
    let test = (kind == Kind::Priority).then_some(include_str!(
        "../../assets/policy-templates/test_priority.py"
    ));
    let cases_line = if test.is_some() {
        format!("sluice policy test {name}.wasm --cases cases.toml --config urgent_prefixes=oct.\n")
    } else {
        String::new()
    };
    let test_line = if test.is_some() {
        "python3 test_app.py                 # the rules, natively (or python3 -m pytest)\n"
    } else {
        ""
    };
    let readme = format!(
        "# {name}\n\nA {kind} policy for Sluice in Python (componentize-py, from PyPI), on the \
         vendored SDK module `sluice_policy.py`.\n\n```sh\n\
         pip install componentize-py==0.25.1\n\
         {test_line}\
         componentize-py -d wit -w {world} componentize app -p . -o {name}.wasm\n\
         sluice policy check {name}.wasm\n\
         {cases_line}\
         sluice policy bench {name}.wasm\n\
         sluice policy upload {kind} {name}.wasm\n\
         sluice policy activate {kind} VERSION\n```\n\n\
         An interpreter costs 7-10 us and up to 100,000 fuel a decision (a Rust policy: 13-32 ns); \
         grant a batch's worth at upload with `--fuel` (see policies/README.md).\n"
    );
    let mut files = vec![
        ("app.py".into(), python_template(kind)?.into()),
        ("sluice_policy.py".into(), PYTHON_SDK.into()),
        (
            "wit/policy.wit".into(),
            include_str!("../../../../wit/policy.wit").into(),
        ),
        ("README.md".into(), readme),
    ];
    if let Some(test) = test {
        files.push(("test_app.py".into(), test.into()));
        files.push(("cases.toml".into(), PRIORITY_CASES.into()));
    }
    Ok(files)
}

/// Writes the project `dir/name` in `lang` (rust, python or js); refuses to touch an existing
/// directory.
pub fn new_project(kind: Kind, name: &str, lang: &str, dir: &Path) -> anyhow::Result<PathBuf> {
    if !["rust", "python", "js"].contains(&lang) {
        bail!("--lang {lang}: templates ship for rust, python and js");
    }
    let valid = !name.is_empty()
        && name.len() <= 64
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_');
    if !valid {
        bail!(
            "the name `{name}` must be 1 to 64 lower-case letters, digits, - or _, starting with a letter"
        );
    }
    let root = dir.join(name);
    if root.exists() {
        bail!(
            "{} exists already; choose another name or directory",
            root.display()
        );
    }
    let files = match lang {
        "python" => python_files(kind, name)?,
        "js" => super::policy_js::js_files(kind, name)?,
        _ => rust_files(kind, name),
    };
    for (path, text) in files {
        let path = root.join(path);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("cannot create {}", parent.display()))?;
        }
        std::fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(root)
}

/// The files of a Rust project: the crate, and the SDK and the crates under it vendored.
fn rust_files(kind: Kind, name: &str) -> Vec<(String, String)> {
    let artifact = name.replace('-', "_");
    let cases_line = if kind == Kind::Priority {
        format!(
            "sluice policy test target/wasm32-wasip2/release/{artifact}.wasm --cases cases.toml \
             --config urgent_prefixes=oct.\n"
        )
    } else {
        String::new()
    };
    let readme = format!(
        "# {name}\n\nA {kind} policy for Sluice, on the Rust SDK (vendored in `vendor/`).\n\n```sh\n\
         cargo test                                           # the logic, natively\n\
         cargo build --release --target wasm32-wasip2         # the component\n\
         sluice policy check target/wasm32-wasip2/release/{artifact}.wasm\n\
         {cases_line}\
         sluice policy bench target/wasm32-wasip2/release/{artifact}.wasm\n\
         sluice policy upload {kind} target/wasm32-wasip2/release/{artifact}.wasm\n\
         sluice policy activate {kind} VERSION\n```\n"
    );
    let mut files: Vec<(String, String)> = VENDORED
        .iter()
        .map(|(path, text)| ((*path).to_owned(), (*text).to_owned()))
        .collect();
    files.push((
        "vendor/policy-config/Cargo.toml".into(),
        CONFIG_MANIFEST.into(),
    ));
    files.push((
        "vendor/policy-packed/Cargo.toml".into(),
        PACKED_MANIFEST.into(),
    ));
    files.push(("Cargo.toml".into(), project_manifest(name)));
    files.push(("src/lib.rs".into(), template(kind).to_owned()));
    files.push(("README.md".into(), readme));
    if kind == Kind::Priority {
        files.push(("cases.toml".into(), PRIORITY_CASES.into()));
    }
    files
}

/// The priority templates' case table for `sluice policy test`.
pub(super) const PRIORITY_CASES: &str =
    include_str!("../../assets/policy-templates/priority-cases.toml");

/// A registry over a catalog in memory: the server's validation, with nothing kept. Its
/// runtime may grant what was asked (the server's own maximum is checked at upload).
fn scratch_registry(grants: super::policy::GrantArgs) -> anyhow::Result<PolicyRegistry> {
    let store = Arc::new(MemoryCatalog::new());
    let defaults = RuntimeOptions::default();
    let options = RuntimeOptions {
        max_memory_limit_bytes: grants
            .memory_limit_bytes
            .map_or(defaults.max_memory_limit_bytes, |b| {
                (b as usize).max(defaults.max_memory_limit_bytes)
            }),
        max_call_fuel: grants
            .call_fuel
            .map_or(defaults.max_call_fuel, |f| f.max(defaults.max_call_fuel)),
        ..defaults
    };
    let runtime = Arc::new(PolicyRuntime::new(options)?);
    Ok(PolicyRegistry::open(
        runtime,
        store,
        RegistryOptions::default(),
    )?)
}

/// Validates `bytes` as an upload would: as `kind`, or as whichever kind's world it is.
/// Answers the kind and the registry it was stored in.
pub fn check(
    bytes: &[u8],
    kind: Option<Kind>,
    config: Option<String>,
    grants: super::policy::GrantArgs,
    data: &[(String, Vec<u8>)],
) -> anyhow::Result<(Kind, PolicyRegistry, u32)> {
    let registry = scratch_registry(grants)?;
    // The world it exports names its kind; only a component that exports none is tried as
    // each kind in turn, to say what each world lacks.
    let kind = kind.or_else(|| sluice_policy_runtime::exported_kind(bytes));
    let kinds: Vec<Kind> = match kind {
        Some(kind) => vec![kind],
        None => Kind::ALL.to_vec(),
    };
    let named = kind.is_some();
    let mut refusals = Vec::new();
    for kind in kinds {
        let options = UploadOptions {
            config: config.clone(),
            signed_by: None,
            memory_limit_bytes: grants.memory_limit_bytes,
            call_fuel: grants.call_fuel,
        };
        match registry.upload_with(kind, bytes, options, 0) {
            Ok(uploaded) => {
                let version = uploaded.version.version;
                for (name, bytes) in data {
                    match registry.put_data(kind, version, name, bytes) {
                        Ok(_) => {}
                        Err(RegistryError::Refused { check, detail }) => {
                            bail!("refused with the data {name}, at the {check} check: {detail}")
                        }
                        Err(other) => return Err(other.into()),
                    }
                }
                return Ok((kind, registry, version));
            }
            // Another kind's world: try the next kind unless one was named.
            Err(RegistryError::Refused {
                check: Check::World | Check::Imports,
                detail,
            }) if !named => refusals.push((kind, detail)),
            // What the file is, whatever the kind: said once, without a kind.
            Err(RegistryError::Refused {
                check: Check::Compile,
                detail,
            }) => bail!("refused: {detail}"),
            Err(RegistryError::Refused { check, detail }) => {
                bail!("refused as a {kind} policy, at the {check} check: {detail}")
            }
            Err(other) => return Err(other.into()),
        }
    }
    // Every kind refused it for its world or its imports: a component of no policy world, or
    // one importing what no policy may (the same for every kind, so said once).
    match refusals
        .iter()
        .find(|(_, detail)| detail.starts_with("imports "))
    {
        Some((_, detail)) => bail!("refused: it {detail}"),
        None => bail!(
            "refused: a component that exports no policy interface (a policy exports one of \
             `sluice:policy/priority`, `aging`, `retry`, `split` or `merge`)"
        ),
    }
}

/// Prints what one decision of the component costs, through the registry as the server makes
/// it, one at a time and in batches.
pub fn bench(
    bytes: &[u8],
    kind: Option<Kind>,
    config: Option<String>,
    grants: super::policy::GrantArgs,
    data: &[(String, Vec<u8>)],
    decisions: usize,
) -> anyhow::Result<()> {
    let started = std::time::Instant::now();
    let (kind, registry, version) = check(bytes, kind, config, grants, data)?;
    outln!(
        "a {kind} policy of {} bytes: validated in {:.0} ms (compile, init, conformance)",
        bytes.len(),
        started.elapsed().as_secs_f64() * 1e3
    )?;
    registry.activate(kind, version, 0)?;
    super::bench::policy::decision_costs(&registry, kind, decisions)
}
