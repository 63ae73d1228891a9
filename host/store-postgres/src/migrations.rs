//! The schema's migrations, compiled into the binary and handed to sqlx's migrator at open.
//!
//! `sqlx::migrate!` would embed the same files, but its proc-macro compiles a second copy of
//! sqlx's PostgreSQL driver, tokio and rustls for the build machine: about 160 crates of the
//! first build for one list of nine files. The versions, descriptions and checksums are the
//! ones that macro records (the description is the file name after the version, `_` read as a
//! space; the checksum is SHA-384 of the text), so databases migrated by earlier builds match.

use sqlx::error::BoxDynError;
use sqlx::migrate::{Migration, MigrationSource, MigrationType, Migrator};
use std::borrow::Cow;
use std::future::Future;
use std::pin::Pin;

/// Every migration, oldest first: version, file name and text. A test holds this list to the
/// `migrations/` folder, so a file added there and not here fails it.
pub(crate) const FILES: [(i64, &str, &str); 12] = [
    (
        1,
        "0001_store.sql",
        include_str!("../migrations/0001_store.sql"),
    ),
    (
        2,
        "0002_commit_function.sql",
        include_str!("../migrations/0002_commit_function.sql"),
    ),
    (
        3,
        "0003_concurrency_limits.sql",
        include_str!("../migrations/0003_concurrency_limits.sql"),
    ),
    (
        4,
        "0004_hot_task_updates.sql",
        include_str!("../migrations/0004_hot_task_updates.sql"),
    ),
    (
        5,
        "0005_event_blocks_lz4.sql",
        include_str!("../migrations/0005_event_blocks_lz4.sql"),
    ),
    (
        6,
        "0006_commit_plans.sql",
        include_str!("../migrations/0006_commit_plans.sql"),
    ),
    (
        7,
        "0007_write_ahead.sql",
        include_str!("../migrations/0007_write_ahead.sql"),
    ),
    (
        8,
        "0008_key_reads.sql",
        include_str!("../migrations/0008_key_reads.sql"),
    ),
    (
        9,
        "0009_record_format_2.sql",
        include_str!("../migrations/0009_record_format_2.sql"),
    ),
    (
        10,
        "0010_record_format_3.sql",
        include_str!("../migrations/0010_record_format_3.sql"),
    ),
    (
        11,
        "0011_collections.sql",
        include_str!("../migrations/0011_collections.sql"),
    ),
    (
        12,
        "0012_record_format_4.sql",
        include_str!("../migrations/0012_record_format_4.sql"),
    ),
];

/// The migrations as sqlx records them.
pub(crate) fn all() -> Vec<Migration> {
    FILES
        .iter()
        .map(|&(version, file, sql)| {
            let description = file
                .split_once('_')
                .map_or(file, |(_, rest)| rest)
                .trim_end_matches(".sql")
                .replace('_', " ");
            Migration::new(
                version,
                Cow::Owned(description),
                MigrationType::Simple,
                Cow::Borrowed(sql),
                sql.starts_with("-- no-transaction"),
            )
        })
        .collect()
}

#[derive(Debug)]
struct Embedded;

impl MigrationSource<'static> for Embedded {
    fn resolve(
        self,
    ) -> Pin<Box<dyn Future<Output = Result<Vec<Migration>, BoxDynError>> + Send + 'static>> {
        Box::pin(async { Ok(all()) })
    }
}

/// The migrator over the embedded list (with sqlx's defaults: an advisory lock, and an error
/// for a database that has a migration this build does not know).
pub(crate) async fn migrator() -> Result<Migrator, sqlx::migrate::MigrateError> {
    Migrator::new(Embedded).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_list_is_the_folder_in_order_with_sqlx_s_own_versions_and_descriptions() {
        let folder = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations");
        let mut on_disk: Vec<String> = std::fs::read_dir(&folder)
            .unwrap()
            .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|name| name.ends_with(".sql"))
            .collect();
        on_disk.sort();
        let listed: Vec<String> = FILES.iter().map(|(_, file, _)| file.to_string()).collect();
        assert_eq!(listed, on_disk);
        // sqlx's reader of a folder is what `migrate!` ran at build time: the same versions,
        // descriptions, checksums and transaction choice, field by field.
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let mut from_folder = runtime.block_on(folder.as_path().resolve()).unwrap();
        from_folder.sort_by_key(|migration| migration.version);
        let embedded = all();
        assert_eq!(embedded.len(), from_folder.len());
        for (ours, theirs) in embedded.iter().zip(&from_folder) {
            assert_eq!(ours.version, theirs.version);
            assert_eq!(ours.description, theirs.description);
            assert_eq!(ours.checksum, theirs.checksum);
            assert_eq!(ours.no_tx, theirs.no_tx);
            assert_eq!(ours.sql, theirs.sql);
        }
    }
}
