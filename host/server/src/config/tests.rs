use super::*;

fn file(text: &str) -> FileConfig {
    FileConfig::parse(text).unwrap()
}

#[test]
fn flags_override_the_file_which_overrides_defaults() {
    let file = file(
        "listen = \"0.0.0.0:9000\"\ndata_dir = \"/srv/a\"\nqueue_capacity = 10\nsync_claims = true",
    );
    let overrides = Overrides::default().with("data_dir", "/srv/b");
    let config = ServeConfig::resolve(file, overrides).unwrap();
    assert_eq!(config.data_dir, PathBuf::from("/srv/b"));
    assert_eq!(config.listen, "0.0.0.0:9000".parse().unwrap());
    assert_eq!(config.queue_capacity, 10);
    assert_eq!(config.max_payload_bytes, 1024 * 1024);
    assert!(config.sync_claims);
    assert!(!ServeConfig::default().sync_claims);
}

#[test]
fn policy_tables_and_flags_become_init_configs() {
    let config_file = file(
        "[policies.retry]\ninitial_delay_ms = 300000\nmax_delay_ms = 1000000\n\n[policies.priority]\nweights = [70, 25, 5]\n",
    );
    let overrides = Overrides {
        policy_settings: vec!["retry.initial_delay_ms=100".into()],
        ..Overrides::default()
    };
    let config = ServeConfig::resolve(config_file, overrides).unwrap();
    assert_eq!(
        config.policy_configs[&PolicyKind::Retry],
        "initial_delay_ms=100\nmax_delay_ms=1000000\n"
    );
    assert_eq!(
        config.policy_configs[&PolicyKind::Priority],
        "weights=70,25,5\n"
    );
    for bad in ["retry", "nope.x=1", "retry.=1", "retry.a=b\nc=d"] {
        let overrides = Overrides {
            policy_settings: vec![bad.into()],
            ..Overrides::default()
        };
        assert!(
            ServeConfig::resolve(FileConfig::default(), overrides).is_err(),
            "{bad}"
        );
    }
    let bad_kind = file("[policies.sorting]\nx = 1");
    assert!(ServeConfig::resolve(bad_kind, Overrides::default()).is_err());
}

#[test]
fn postgres_settings_reach_the_store_options() {
    let defaults = ServeConfig::default().pg_options();
    assert_eq!(defaults.max_connections, 16);
    let config_file = file(
        "pg_max_connections = 40\npg_acquire_timeout_ms = 2500\npg_statement_timeout_ms = 120000",
    );
    let options = ServeConfig::resolve(config_file, Overrides::default())
        .unwrap()
        .pg_options();
    assert_eq!(options.max_connections, 40);
    assert_eq!(options.acquire_timeout, Duration::from_millis(2_500));
    assert_eq!(options.statement_timeout, Duration::from_secs(120));
}

#[test]
fn unknown_keys_and_bad_values_are_refused() {
    let error = ServeConfig::resolve(file("listen_addr = \"x\""), Overrides::default())
        .unwrap_err()
        .to_string();
    assert!(error.contains("unknown setting `listen_addr`"), "{error}");
    assert!(ServeConfig::resolve(file("queue_capacity = 0"), Overrides::default()).is_err());
    // The body budget must hold the largest policy upload too.
    let tight = file("inflight_body_bytes = 20000000\nmax_policy_bytes = 33554432");
    assert!(ServeConfig::resolve(tight, Overrides::default()).is_err());
    for bad in [
        "lease_ms = 99",
        "lease_ms = \"30000\"",
        "lease_ms = -1",
        "worker_stale_ms = 0",
        "aging_interval_ms = 5",
        "drain_timeout_ms = 86400001",
        "max_claim_wait_ms = 300001",
        "pg_max_connections = 0",
        "pg_acquire_timeout_ms = 99",
        "pg_statement_timeout_ms = 3600001",
        "store = \"mysql://x\"",
        "advertise = \"http://a:1\"",
        "split_kinds = [1]",
        "callback_allow = \"10.0.0.0/8\"",
        "policy_signing_keys = 3",
        "concurrency_limits = { \"a\" = \"x\" }",
    ] {
        assert!(
            ServeConfig::resolve(file(bad), Overrides::default()).is_err(),
            "{bad}"
        );
    }
    // A list's empty item is refused from text as from the file.
    let error = ServeConfig::resolve(
        FileConfig::default(),
        Overrides::default().with("split_kinds", "a,,b"),
    )
    .unwrap_err()
    .to_string();
    assert!(error.contains("`split_kinds`"), "{error}");
    // The flag overrides the file; a flag's bad text is refused by name.
    let overrides = Overrides::default().with("lease_ms", "5000");
    assert_eq!(
        ServeConfig::resolve(file("lease_ms = 99"), overrides)
            .unwrap()
            .lease_ms,
        5_000
    );
    let error = ServeConfig::resolve(
        FileConfig::default(),
        Overrides::default().with("lease_ms", "soon"),
    )
    .unwrap_err()
    .to_string();
    assert!(error.contains("`lease_ms`"), "{error}");
}

/// Every setting is read from a flag's or variable's text and from the file alike, and its
/// default, shown as `--help` and the README show it, reads back as the default.
#[test]
fn every_setting_reads_its_shown_default_from_text_and_from_the_file() {
    let defaults = format!("{:?}", ServeConfig::default());
    for setting in ServeConfig::settings() {
        if setting.default_text == "none" {
            continue;
        }
        let overrides = Overrides::default().with(setting.name, &setting.default_text);
        let from_text = ServeConfig::resolve(FileConfig::default(), overrides)
            .unwrap_or_else(|e| panic!("{}: {e}", setting.name));
        assert_eq!(format!("{from_text:?}"), defaults, "{}", setting.name);
    }
    let table: toml::Table = ServeConfig::settings()
        .into_iter()
        .filter_map(|s| Some((s.name.to_owned(), s.default_toml?)))
        .collect();
    let text = toml::to_string(&table).unwrap();
    let from_file = ServeConfig::resolve(file(&text), Overrides::default()).unwrap();
    assert_eq!(format!("{from_file:?}"), defaults);
}

#[test]
fn the_readme_table_is_the_settings() {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md")).unwrap();
    let table = settings_table();
    assert!(
        readme.contains(&table),
        "README.md's settings table is not the settings' declarations (host/server/src/config/mod.rs); it should read:\n\n{table}"
    );
}

#[test]
fn batch_waits_name_each_bucket_once_within_the_bound() {
    use super::bucket_batch_waits;
    let text = |items: &[&str]| items.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert_eq!(
        bucket_batch_waits(&text(&["low=20"])).unwrap(),
        [0, 10_000, 20],
        "buckets left out keep their defaults"
    );
    assert_eq!(
        bucket_batch_waits(&text(&["urgent=5", "normal=0"])).unwrap(),
        [5, 0, 10_000]
    );
    for (bad, says) in [
        (&["normal=5", "normal=6"][..], "named twice"),
        (&["later=5"][..], "not a bucket"),
        (&["low=10001"][..], "at most 10000"),
        (&["low"][..], "bucket=ms"),
        (&["low=-1"][..], "whole number"),
    ] {
        let error = bucket_batch_waits(&text(bad)).unwrap_err();
        assert!(error.contains(says), "{bad:?}: {error}");
    }
}
