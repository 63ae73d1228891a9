//! Batch requests answered item by item: items that fail to parse are answered in place, the
//! rest go to the scheduler together, and its answers are slotted back in order.

use super::problem::ApiError;
use std::future::Future;

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
