//! Batch requests answered item by item: items that fail to parse are answered in place, the
//! rest go to the scheduler together, and its answers are slotted back in order.

use super::problem::{ApiError, Problem};
use serde::Serialize;
use sluice_model::Task;
use sluice_wire::TaskView;
use std::future::Future;

/// A batch's answer: one result per item, in order.
#[derive(Serialize, utoipa::ToSchema)]
pub struct BatchResponse {
    pub results: Vec<BatchItem>,
}

/// One item's answer: the status it would have had alone, and its task or its problem.
#[derive(Serialize, utoipa::ToSchema)]
pub struct BatchItem {
    status: u16,
    #[serde(skip_serializing_if = "Option::is_none")]
    task: Option<TaskView>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    replayed: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    problem: Option<Problem>,
}

impl BatchItem {
    pub fn task(status: u16, task: Task, replayed: bool) -> Self {
        BatchItem {
            status,
            task: Some(task.into()),
            replayed,
            problem: None,
        }
    }

    pub fn from_error(error: ApiError) -> Self {
        BatchItem {
            status: error.status().as_u16(),
            task: None,
            replayed: false,
            problem: Some(error.problem()),
        }
    }
}

pub async fn answer_in_order<Valid, Answer, Item, Fut>(
    prepared: Vec<Result<Valid, ApiError>>,
    send: impl FnOnce(Vec<Valid>) -> Fut,
    to_item: impl Fn(Answer) -> Item,
    from_error: impl Fn(ApiError) -> Item,
) -> Result<Vec<Item>, ApiError>
where
    Fut: Future<Output = Result<Vec<Answer>, ApiError>>,
{
    let mut slots: Vec<Option<Item>> = Vec::with_capacity(prepared.len());
    let mut valid = Vec::new();
    for item in prepared {
        match item {
            Ok(value) => {
                valid.push(value);
                slots.push(None);
            }
            Err(error) => slots.push(Some(from_error(error))),
        }
    }
    let answers = if valid.is_empty() {
        Vec::new()
    } else {
        send(valid).await?
    };
    let mut answers = answers.into_iter();
    Ok(slots
        .into_iter()
        .map(|slot| match slot {
            Some(item) => item,
            None => match answers.next() {
                Some(answer) => to_item(answer),
                None => from_error(ApiError::Internal("missing batch answer".into())),
            },
        })
        .collect())
}
