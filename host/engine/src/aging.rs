//! Aging: the oldest waiting tasks of the lower buckets are shown to the aging policy each
//! tick, and the promotions it answers move them up a bucket, each as an event.

use super::{Engine, from_bucket};
use policy_packed::View;
use sluice_model::{Actor, Change, Priority, State, Task, TaskId, TaskNames, VariantTag};
use std::sync::Arc;

/// What the aging policy is shown of one waiting task.
#[derive(Clone, Debug)]
pub struct AgingView {
    pub id: TaskId,
    pub view: View,
    /// Its variant of a live aging experiment, if any.
    pub variant: Option<VariantTag>,
    pub names: Arc<TaskNames>,
}

impl Engine {
    /// The first `per_bucket` tasks in line in the normal and low buckets, with their views
    /// and aging variants. Bounded, so a tick costs the same with a million tasks waiting;
    /// the first in line are the ones that have waited longest.
    pub fn aging_views(&self, per_bucket: usize) -> Vec<AgingView> {
        [Priority::Normal, Priority::Low]
            .into_iter()
            .flat_map(|bucket| self.queues.iter(bucket).take(per_bucket))
            .map(|waiting| AgingView {
                id: waiting.id,
                view: waiting.view,
                variant: waiting.aging_variant,
                names: Arc::clone(&waiting.names),
            })
            .collect()
    }

    /// Moves a queued `task` up to bucket `to`, keeping its rank, so it goes in line among the
    /// tasks of `to` by arrival. Nothing if the task no longer waits or `to` is not higher.
    pub(crate) fn plan_promote(
        &self,
        now_ms: u64,
        task: &Task,
        to: policy_packed::Bucket,
        version: Option<u32>,
    ) -> Option<Change> {
        let to = from_bucket(to);
        if task.state != State::Queued || to >= task.bucket {
            return None;
        }
        let by = version.map_or("the host's rule".to_owned(), |v| {
            format!("aging policy v{v}")
        });
        let detail = format!(
            "promoted {} → {} by {by}",
            task.bucket.as_str(),
            to.as_str()
        );
        Some(
            self.plan_note(now_ms, task, Actor::scheduler(), detail, |after| {
                after.bucket = to;
                after.bucket_since_ms = now_ms;
            }),
        )
    }
}
