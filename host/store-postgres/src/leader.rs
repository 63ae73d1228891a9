//! The leader lease: one row (`sluice_leader`) naming the replica that runs the engine, its
//! fencing epoch and its expiry by the database's clock. Taking the lease bumps the epoch;
//! every commit checks it under a row lock, so once another replica has taken over, the old
//! leader's commits fail and it stops (as after a failed sync) instead of writing beside it.

use super::{PgStore, corrupt, fail_with, int8, uint8};
use crate::backend;
use sluice_store::StoreError;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How long a lease lasts from its last renewal, by the database's clock: a dead leader's
/// place is taken this long after its last renewal at most.
pub const LEASE_MS: u64 = 3_000;
/// How often the leader renews it.
pub const RENEW_MS: u64 = 1_000;

/// The epoch this process leads under; 0 while it does not lead.
#[derive(Debug, Default)]
pub struct Leadership {
    epoch: AtomicU64,
}

impl Leadership {
    pub fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }
}

/// Who holds the lease, as the database says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaderInfo {
    pub holder: String,
    /// The leader's API address, for replicas that forward to it.
    pub address: String,
    pub epoch: u64,
    /// Whether the lease is still running.
    pub live: bool,
    /// When it runs out, in ms since the Unix epoch by the database's clock (0 for a lease
    /// given up): a renewal moves it on, so a reader can tell a live leader from a dead one.
    pub expires_at_ms: u64,
}

impl PgStore {
    /// The lease as it stands.
    pub fn leader(&self) -> Result<LeaderInfo, StoreError> {
        let pool = self.pool();
        self.block(async move {
            let (holder, address, epoch, live, expires_at_ms): (String, String, i64, bool, i64) =
                sqlx::query_as(
                    "SELECT holder, address, epoch, expires_at > now(), \
                     floor(extract(epoch FROM greatest(expires_at, 'epoch')) * 1000)::int8 \
                     FROM sluice_leader WHERE id = 1",
                )
                .fetch_one(&pool)
                .await
                .map_err(backend)?;
            Ok(LeaderInfo {
                holder,
                address,
                epoch: uint8(epoch, "leader lease")?,
                live,
                expires_at_ms: uint8(expires_at_ms, "leader lease")?,
            })
        })
    }

    /// Takes the lease if it has run out; the new epoch, or `None` while another holds it.
    fn try_lead(&self, holder: &str, address: &str) -> Result<Option<u64>, StoreError> {
        let pool = self.engine_pool();
        let (holder, address) = (holder.to_owned(), address.to_owned());
        self.block(async move {
            let mut tx = pool.begin().await.map_err(backend)?;
            // The takeover guard (migration 0007) lets only a replica that reads the
            // write-ahead log take the lease.
            sqlx::query("SELECT set_config('sluice.write_ahead', 'on', true)")
                .execute(&mut *tx)
                .await
                .map_err(backend)?;
            let epoch: Option<i64> = sqlx::query_scalar(
                "UPDATE sluice_leader SET holder = $1, address = $2, epoch = epoch + 1, \
                 expires_at = now() + $3 * interval '1 millisecond' \
                 WHERE id = 1 AND expires_at <= now() RETURNING epoch",
            )
            .bind(holder)
            .bind(address)
            .bind(int8(LEASE_MS))
            .fetch_optional(&mut *tx)
            .await
            .map_err(backend)?;
            tx.commit().await.map_err(backend)?;
            epoch.map(|e| uint8(e, "leader lease")).transpose()
        })
    }

    /// Waits until this process holds the lease (logging who holds it meanwhile), then keeps
    /// it renewed; the fencing epoch. `address` is this replica's API, for followers.
    pub fn lead(&self, holder: &str, address: &str) -> Result<u64, StoreError> {
        let mut told: Option<LeaderInfo> = None;
        loop {
            if let Some(epoch) = self.take_lead(holder, address)? {
                return Ok(epoch);
            }
            let now = self.leader()?;
            if told.as_ref().map(|t| (&t.holder, t.epoch)) != Some((&now.holder, now.epoch)) {
                tracing::info!(leader = %now.holder, address = %now.address, epoch = now.epoch, "waiting for the leader lease");
                told = Some(now);
            }
            std::thread::sleep(Duration::from_millis(RENEW_MS / 4));
        }
    }

    /// Takes the lease if it has run out and from then on keeps it renewed: the fencing epoch,
    /// or `None` while another replica holds it.
    pub fn take_lead(&self, holder: &str, address: &str) -> Result<Option<u64>, StoreError> {
        let Some(epoch) = self.try_lead(holder, address)? else {
            return Ok(None);
        };
        if epoch == 0 {
            return Err(corrupt("leader lease", "epoch 0 after taking the lease"));
        }
        self.leadership.epoch.store(epoch, Ordering::Release);
        tracing::info!(epoch, "took the leader lease");
        self.keep_renewed(epoch);
        Ok(Some(epoch))
    }

    /// Whether this process holds the lease (it may still lose it).
    pub fn is_leading(&self) -> bool {
        self.leadership.epoch() != 0
    }

    /// Renews the lease every `RENEW_MS` until it is lost. Renewals that fail for longer than
    /// the lease's slack stop the store: another replica may be taking over, and the epoch
    /// check would refuse this one's commits then anyway.
    fn keep_renewed(&self, epoch: u64) {
        let pool = self.engine_pool();
        let failure = self.failure.clone();
        self.handle.spawn(async move {
            let mut renewed_before = Instant::now();
            loop {
                tokio::time::sleep(Duration::from_millis(RENEW_MS)).await;
                let sent = Instant::now();
                let renewed: Result<Option<i32>, sqlx::Error> = sqlx::query_scalar(
                    "UPDATE sluice_leader SET expires_at = now() + $2 * interval '1 millisecond' \
                     WHERE id = 1 AND epoch = $1 RETURNING 1",
                )
                .bind(int8(epoch))
                .bind(int8(LEASE_MS))
                .fetch_optional(&pool)
                .await;
                match renewed {
                    Ok(Some(_)) => renewed_before = sent,
                    Ok(None) => {
                        fail_with(
                            &failure,
                            format!(
                                "deposed: another replica took the leader lease after epoch {epoch}"
                            ),
                        );
                        return;
                    }
                    Err(error) => {
                        let unrenewed = renewed_before.elapsed();
                        if unrenewed >= Duration::from_millis(LEASE_MS - RENEW_MS) {
                            fail_with(
                                &failure,
                                format!(
                                    "lost the leader lease: not renewed for {} ms ({error})",
                                    unrenewed.as_millis()
                                ),
                            );
                            return;
                        }
                        tracing::warn!(%error, "cannot renew the leader lease; retrying");
                    }
                }
            }
        });
    }

    /// Gives the lease up at once (a clean stop), so a standby need not wait for it to run out.
    pub(super) fn release(&self) -> Result<(), StoreError> {
        let epoch = self.leadership.epoch();
        let pool = self.engine_pool();
        self.block(async move {
            sqlx::query(
                "UPDATE sluice_leader SET expires_at = '-infinity' WHERE id = 1 AND epoch = $1",
            )
            .bind(int8(epoch))
            .execute(&pool)
            .await
            .map_err(backend)?;
            Ok(())
        })
    }

    pub(super) fn epoch(&self) -> Result<u64, StoreError> {
        match self.leadership.epoch() {
            0 => Err(StoreError::Failed(
                "this replica does not hold the leader lease".into(),
            )),
            epoch => Ok(epoch),
        }
    }
}

/// Checks inside `tx` that `epoch` still holds the lease, locking the row against a takeover
/// until the transaction ends.
pub(super) async fn check_epoch(tx: &mut sqlx::PgConnection, epoch: u64) -> Result<(), StoreError> {
    let current: i64 = sqlx::query_scalar("SELECT epoch FROM sluice_leader WHERE id = 1 FOR SHARE")
        .fetch_one(&mut *tx)
        .await
        .map_err(backend)?;
    if uint8(current, "leader lease")? != epoch {
        return Err(StoreError::Failed(format!(
            "deposed: the leader lease is at epoch {current}, this replica led under {epoch}"
        )));
    }
    Ok(())
}
