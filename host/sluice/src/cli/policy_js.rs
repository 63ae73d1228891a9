//! `sluice policy new --lang js`: a JavaScript policy project on the vendored JS SDK, built
//! into a component by componentize-js (npm), with a unit test for node's own test runner.

use anyhow::bail;
use sluice_policy_runtime::Kind;

/// The JavaScript SDK module, vendored into every JavaScript project.
const JS_SDK: &str = include_str!("../../../../policies/examples/js/sdk/sluice_policy.js");

/// The componentize-js release the projects pin (npm).
pub const COMPONENTIZE_JS_VERSION: &str = "0.23.0";
/// componentize-js imports preview2-shim at run time but declares it only for its own
/// development, so a clean install (`npm ci`) leaves it out unless the project names it.
const PREVIEW2_SHIM_VERSION: &str = "0.25.0";

/// A first JavaScript policy of each kind the SDK covers, and its unit test.
fn template(kind: Kind) -> anyhow::Result<(&'static str, &'static str)> {
    match kind {
        Kind::Priority => Ok((
            include_str!("../../assets/policy-templates/priority.js"),
            include_str!("../../assets/policy-templates/priority.test.js"),
        )),
        Kind::Retry => Ok((
            include_str!("../../assets/policy-templates/retry.js"),
            include_str!("../../assets/policy-templates/retry.test.js"),
        )),
        Kind::Aging | Kind::Split | Kind::Merge => bail!(
            "--lang js: the JavaScript SDK's templates cover priority and retry policies; write \
             this {kind} policy in rust or python"
        ),
    }
}

/// The build command a project's `npm run build` runs: the named world (so the host sends the
/// names), and no HTTP (a policy is granted none).
pub fn build_script(kind: Kind, name: &str) -> String {
    format!(
        "componentize-js app.js --wit wit --world-name named-{kind}-policy -d http -d fetch-event \
         -o {name}.wasm"
    )
}

/// The files of a JavaScript project: the policy, its unit test, the SDK module, the WIT it
/// builds against, its package.json (componentize-js pinned) and a README.
pub fn js_files(kind: Kind, name: &str) -> anyhow::Result<Vec<(String, String)>> {
    let (app, test) = template(kind)?;
    // Written out rather than through serde_json, whose maps would sort the keys.
    let build = build_script(kind, name);
    let package = format!(
        "{{\n  \"name\": \"{name}\",\n  \"version\": \"0.1.0\",\n  \"private\": true,\n  \
         \"type\": \"module\",\n  \"scripts\": {{\n    \"build\": \"{build}\",\n    \
         \"test\": \"node --test\"\n  }},\n  \"devDependencies\": {{\n    \
         \"@bytecodealliance/componentize-js\": \"{COMPONENTIZE_JS_VERSION}\",\n    \
         \"@bytecodealliance/preview2-shim\": \"{PREVIEW2_SHIM_VERSION}\"\n  }}\n}}\n"
    );
    let cases_line = if kind == Kind::Priority {
        format!("sluice policy test {name}.wasm --cases cases.toml --config urgent_prefixes=oct.\n")
    } else {
        String::new()
    };
    let readme = format!(
        "# {name}\n\nA {kind} policy for Sluice in JavaScript (componentize-js, from npm), on the \
         vendored SDK module `sluice_policy.js`.\n\n```sh\n\
         npm install                  # componentize-js {COMPONENTIZE_JS_VERSION}\n\
         npm test                     # the rules, natively (node --test)\n\
         npm run build                # {name}.wasm\n\
         sluice policy check {name}.wasm\n\
         {cases_line}\
         sluice policy upload {kind} {name}.wasm --fuel 2000000000\n\
         sluice policy activate {kind} VERSION\n```\n\n\
         A component carries its JavaScript engine (about 12 MB) and interprets: about 75 us a \
         call and 25-100 us a task, and more than 400 million fuel for a batch of 1,000, hence \
         the `--fuel` grant at upload (see docs/policies.md).\n"
    );
    let mut files = vec![
        ("app.js".into(), app.into()),
        ("app.test.js".into(), test.into()),
        ("sluice_policy.js".into(), JS_SDK.into()),
        (
            "wit/policy.wit".into(),
            include_str!("../../../../wit/policy.wit").into(),
        ),
        ("package.json".into(), package),
        ("README.md".into(), readme),
    ];
    if kind == Kind::Priority {
        files.push((
            "cases.toml".into(),
            super::policy_kit::PRIORITY_CASES.into(),
        ));
    }
    Ok(files)
}
