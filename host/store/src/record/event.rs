//! The bytes of a stored event: format 2 is postcard of `EventV2` behind the format byte, as a
//! task record is; format 1 is the event's JSON (an object, or for a block of them an array),
//! read and never written. Events are written once and read mostly to be shown, but a task's
//! life logs five, so their JSON was about a third of the log's bytes.

use super::FORMAT_VERSION;
use crate::StoreError;
use serde::{Deserialize, Serialize};
use sluice_model::{Actor, Event, State, TaskId};
use std::borrow::Cow;

#[derive(Serialize, Deserialize)]
struct EventV2<'a> {
    seq: u64,
    task_id: [u8; 16],
    /// The state it left, by code; none for the event that creates a task.
    from: Option<u8>,
    to: u8,
    actor: Cow<'a, str>,
    at_ms: u64,
    detail: Option<Cow<'a, str>>,
}

impl<'a> EventV2<'a> {
    fn of(event: &'a Event) -> Self {
        EventV2 {
            seq: event.seq,
            task_id: event.task_id.to_bytes(),
            from: event.from.map(State::code),
            to: event.to.code(),
            actor: Cow::Borrowed(event.actor.as_str()),
            at_ms: event.at_ms,
            detail: event.detail.as_deref().map(Cow::Borrowed),
        }
    }

    fn into_event(self) -> Result<Event, StoreError> {
        let state = |code: u8| {
            State::from_code(code)
                .ok_or_else(|| corrupt(format!("event format 2: unknown state code {code}")))
        };
        Ok(Event {
            seq: self.seq,
            task_id: TaskId::from_bytes(self.task_id),
            from: self.from.map(state).transpose()?,
            to: state(self.to)?,
            actor: Actor::new(self.actor.into_owned()),
            at_ms: self.at_ms,
            detail: self.detail.map(Cow::into_owned),
        })
    }
}

fn corrupt(detail: String) -> StoreError {
    StoreError::Corrupt {
        what: "event log",
        detail,
    }
}

fn postcard_error(error: postcard::Error) -> StoreError {
    corrupt(format!("event format 2: {error}"))
}

/// Appends one event's bytes to `out`.
pub fn encode_event_into(event: &Event, out: &mut Vec<u8>) -> Result<(), StoreError> {
    out.push(FORMAT_VERSION);
    let taken = std::mem::take(out);
    *out = postcard::to_extend(&EventV2::of(event), taken).map_err(postcard_error)?;
    Ok(())
}

/// One event, in whichever format it was written.
pub fn decode_event(bytes: &[u8]) -> Result<Event, StoreError> {
    match bytes.split_first() {
        Some((&FORMAT_VERSION, rest)) => {
            let (event, left): (EventV2<'_>, _) =
                postcard::take_from_bytes(rest).map_err(postcard_error)?;
            if !left.is_empty() {
                return Err(corrupt(format!(
                    "event format 2: {} bytes after the event",
                    left.len()
                )));
            }
            event.into_event()
        }
        Some((b'{', _)) => serde_json::from_slice(bytes)
            .map_err(|e| corrupt(format!("event format 1 (JSON): {e}"))),
        Some((other, _)) => Err(corrupt(format!("unknown event format {other}"))),
        None => Err(corrupt("an empty event".to_owned())),
    }
}

/// A run of events as one value (the sled store's blocks).
pub fn encode_block(events: &[Event]) -> Result<Vec<u8>, StoreError> {
    let records: Vec<EventV2<'_>> = events.iter().map(EventV2::of).collect();
    let mut out = Vec::with_capacity(1 + events.len() * 48);
    out.push(FORMAT_VERSION);
    postcard::to_extend(&records, out).map_err(postcard_error)
}

/// A block's events, in whichever format it was written.
pub fn decode_block(bytes: &[u8]) -> Result<Vec<Event>, StoreError> {
    match bytes.split_first() {
        Some((&FORMAT_VERSION, rest)) => {
            let (records, left): (Vec<EventV2<'_>>, _) =
                postcard::take_from_bytes(rest).map_err(postcard_error)?;
            if !left.is_empty() {
                return Err(corrupt(format!(
                    "event block format 2: {} bytes after the block",
                    left.len()
                )));
            }
            records.into_iter().map(EventV2::into_event).collect()
        }
        Some((b'[', _)) => serde_json::from_slice(bytes)
            .map_err(|e| corrupt(format!("event block format 1 (JSON): {e}"))),
        Some((other, _)) => Err(corrupt(format!("unknown event block format {other}"))),
        None => Err(corrupt("an empty event block".to_owned())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn events() -> Vec<Event> {
        let task_id: TaskId = "01JEZ3NDEKTSV4RRFFQ69G5FAV".parse().unwrap();
        vec![
            Event {
                seq: 41,
                task_id,
                from: None,
                to: State::Queued,
                actor: Actor::device("scanner-7"),
                at_ms: 1_700_000_000_000,
                detail: None,
            },
            Event {
                seq: 42,
                task_id,
                from: Some(State::Queued),
                to: State::Claimed,
                actor: Actor::worker("gpu-1"),
                at_ms: 1_700_000_000_900,
                detail: Some("attempt 1 on gpu 0".into()),
            },
        ]
    }

    #[test]
    fn events_and_blocks_come_back_as_they_went_in_in_either_format() {
        let events = events();
        let block = encode_block(&events).unwrap();
        assert_eq!(decode_block(&block).unwrap(), events);
        let json_block = serde_json::to_vec(&events).unwrap();
        assert_eq!(decode_block(&json_block).unwrap(), events);
        assert!(
            block.len() * 2 < json_block.len(),
            "{} bytes against {} as JSON",
            block.len(),
            json_block.len()
        );
        for event in &events {
            let mut bytes = vec![7];
            encode_event_into(event, &mut bytes).unwrap();
            assert_eq!(decode_event(&bytes[1..]).unwrap(), *event);
            assert_eq!(
                decode_event(&serde_json::to_vec(event).unwrap()).unwrap(),
                *event
            );
        }
    }

    #[test]
    fn a_bad_event_is_corrupt_not_a_panic() {
        let block = encode_block(&events()).unwrap();
        for cut in 0..block.len() {
            assert!(decode_block(&block[..cut]).is_err(), "cut at {cut}");
        }
        let mut newer = block.clone();
        newer[0] = FORMAT_VERSION + 1;
        assert!(decode_block(&newer).is_err());
        let mut one = Vec::new();
        encode_event_into(&events()[1], &mut one).unwrap();
        for cut in 0..one.len() {
            assert!(decode_event(&one[..cut]).is_err(), "cut at {cut}");
        }
    }
}
