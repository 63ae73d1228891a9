//! Every setting declared in `host/server/src/config/mod.rs` reaches `sluice serve` through
//! each layer with nothing else written: `--help` lists its flag and variable, and a value given
//! as a flag, as an environment variable or as a config file key is the value in effect
//! (`sluice serve --check-config` prints them). The README's table is held to the same
//! declarations by `config::tests::the_readme_table_is_the_settings`.

use sluice_server::config::{ServeConfig, SettingInfo};
use sluice_tests::sluice_binary;
use std::process::Command;

/// A valid value other than the default, as the config file writes it: so that seeing it in
/// effect shows the layer was read. Unset-by-default settings get a value of their own.
fn other_value(setting: &SettingInfo) -> toml::Value {
    use toml::Value;
    match (setting.name, &setting.default_toml) {
        ("store", _) => Value::String("postgres://sluice@db.lab:5432/sluice".into()),
        ("advertise", _) => Value::String("sched-1.lab:7700".into()),
        ("admin_token_sha256", _) => Value::String("ab".repeat(32)),
        ("tls_cert", _) => Value::String("/etc/sluice/cert.pem".into()),
        ("tls_key", _) => Value::String("/etc/sluice/key.pem".into()),
        ("callback_ca_file", _) => Value::String("/etc/sluice/ca.pem".into()),
        ("listen", _) => Value::String("127.0.0.1:7701".into()),
        ("batch_wait_ms", _) => Value::Array(vec![Value::String("low=20".into())]),
        (_, Some(Value::Integer(n))) => Value::Integer(n + 1),
        (_, Some(Value::Boolean(b))) => Value::Boolean(!b),
        (_, Some(Value::String(text))) => Value::String(format!("{text}-other")),
        (_, Some(Value::Array(_))) => Value::Array(vec![Value::String("receiver.lab".into())]),
        (name, other) => panic!("no other value for `{name}` (default {other:?})"),
    }
}

/// A value as a flag's or a variable's text.
fn as_text(value: &toml::Value) -> String {
    match value {
        toml::Value::String(text) => text.clone(),
        toml::Value::Array(items) => items.iter().map(as_text).collect::<Vec<_>>().join(","),
        other => other.to_string(),
    }
}

/// `sluice serve --check-config` with `args` after it and `env` set (and no other `SLUICE_*`
/// variable of the test's own environment), parsed.
fn effective(args: &[String], env: &[(String, String)]) -> toml::Table {
    let output = serve_check(args, env);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    toml::from_str(&String::from_utf8(output.stdout).unwrap()).unwrap()
}

fn serve_check(args: &[String], env: &[(String, String)]) -> std::process::Output {
    let mut command = Command::new(sluice_binary());
    for (name, _) in std::env::vars() {
        if name.starts_with("SLUICE_") {
            command.env_remove(name);
        }
    }
    command
        .args(["serve", "--check-config"])
        .args(args)
        .envs(env.iter().cloned())
        .output()
        .unwrap()
}

/// What `--check-config` shows for `value` of `setting`: the URL's password masked.
fn shown(setting: &str, value: &toml::Value) -> toml::Value {
    match (setting, value) {
        ("store", toml::Value::String(url)) => {
            toml::Value::String(sluice_store_postgres::redacted(url))
        }
        _ => value.clone(),
    }
}

fn assert_every_setting_is_its_other_value(table: &toml::Table, layer: &str) {
    for setting in ServeConfig::settings() {
        let wanted = shown(setting.name, &other_value(&setting));
        assert_eq!(
            table.get(setting.name),
            Some(&wanted),
            "`{}` given as {layer}",
            setting.name
        );
    }
}

#[test]
fn help_lists_every_setting_as_a_flag_and_a_variable_with_its_default() {
    let output = Command::new(sluice_binary())
        .args(["serve", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8(output.stdout).unwrap();
    for setting in ServeConfig::settings() {
        for wanted in [
            format!("--{} <", setting.flag()),
            format!("[env: {}", setting.env()),
            format!("[default: {}]", setting.default_text),
        ] {
            assert!(help.contains(&wanted), "--help lacks `{wanted}`");
        }
    }
}

#[test]
fn a_flag_sets_every_setting() {
    let flags: Vec<String> = ServeConfig::settings()
        .iter()
        .map(|s| format!("--{}={}", s.flag(), as_text(&other_value(s))))
        .collect();
    assert_every_setting_is_its_other_value(&effective(&flags, &[]), "a flag");
}

#[test]
fn an_environment_variable_sets_every_setting() {
    let env: Vec<(String, String)> = ServeConfig::settings()
        .iter()
        .map(|s| (s.env(), as_text(&other_value(s))))
        .collect();
    assert_every_setting_is_its_other_value(&effective(&[], &env), "an environment variable");
}

#[test]
fn a_config_file_key_sets_every_setting_and_the_layers_above_override_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sluice.toml");
    let table: toml::Table = ServeConfig::settings()
        .iter()
        .map(|s| (s.name.to_owned(), other_value(s)))
        .collect();
    std::fs::write(&path, toml::to_string(&table).unwrap()).unwrap();
    let config = vec![format!("--config={}", path.display())];
    assert_every_setting_is_its_other_value(&effective(&config, &[]), "a config file key");

    // The environment overrides the file, and a flag the environment.
    let env = [("SLUICE_LEASE_MS".to_owned(), "30000".to_owned())];
    assert_eq!(
        effective(&config, &env)["lease_ms"],
        toml::Value::Integer(30_000)
    );
    let flagged = [config[0].clone(), "--lease-ms=40000".to_owned()];
    assert_eq!(
        effective(&flagged, &env)["lease_ms"],
        toml::Value::Integer(40_000)
    );
}

#[test]
fn a_bad_value_in_any_layer_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sluice.toml");
    std::fs::write(
        &path,
        "worker_stale_ms = 5
",
    )
    .unwrap();
    for (args, env, name) in [
        (vec!["--lease-ms=soon".to_owned()], vec![], "lease_ms"),
        // A negative number is the setting's value, not an unknown flag.
        (
            vec!["--lease-ms".to_owned(), "-5".to_owned()],
            vec![],
            "lease_ms",
        ),
        (
            vec![],
            vec![("SLUICE_QUEUE_CAPACITY".to_owned(), "0".to_owned())],
            "queue_capacity",
        ),
        (
            vec![format!("--config={}", path.display())],
            vec![],
            "worker_stale_ms",
        ),
    ] {
        let output = serve_check(&args, &env);
        assert!(!output.status.success(), "{args:?} {env:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains(&format!("`{name}`")), "{stderr}");
    }
}

/// A boolean's error lists its two values; a misspelled variable is warned about, with the
/// setting it was probably meant for.
#[test]
fn a_boolean_lists_its_values_and_a_misspelled_variable_is_named() {
    let output = serve_check(&["--fdatasync".to_owned()], &[]);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("true, false"), "{stderr}");

    let output = serve_check(&[], &[("SLUICE_LEASE_MSS".to_owned(), "5".to_owned())]);
    assert!(output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("SLUICE_LEASE_MSS") && stderr.contains("did you mean SLUICE_LEASE_MS?"),
        "{stderr}"
    );
}
