//! `GET /v1/events?after=SEQ`: the global event log, every transition of every task in `seq`
//! order — as Server-Sent Events that follow the log live, or as one JSON page.
//!
//! Only durable events are shown, so a reader never sees a transition that a crash could
//! still take back, and a stream never skips one: it reads pages of the log up to the durable
//! `seq` and waits for that number to grow.

use super::extract::decode_query;
use super::tasks::{EventParams, page_limit};
use super::{ApiError, AppState};
use axum::Json;
use axum::extract::{RawQuery, State};
use axum::http::HeaderMap;
use axum::response::sse::{self, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use sluice_model::Event;
use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;
use tokio::sync::{OwnedSemaphorePermit, watch};

/// Event streams open at once.
pub const MAX_STREAMS: usize = 64;
const DEFAULT_PAGE: usize = 100;
const MAX_PAGE: usize = 1000;
/// Events a stream reads from the store at a time.
const STREAM_PAGE: usize = 256;

#[derive(Serialize, utoipa::ToSchema)]
pub struct LogPage {
    events: Vec<Event>,
    /// Pass as `after` for the next page.
    next_after: u64,
    /// The last durable `seq` when the page was read.
    durable_seq: u64,
    /// The oldest `seq` the log still holds: retention removed those before it, and a reader
    /// asking for them gets 410 `events-gone`.
    first_seq: u64,
}

/// The global event log after `after`: one JSON page, or with `Accept: text/event-stream` a
/// stream of Server-Sent Events (`event: transition`, `id: SEQ`) that follows it live.
#[utoipa::path(get, path = "/v1/events", tag = "operations",
    params(EventParams),
    responses((status = 200, description = "A page of the log", body = LogPage)))]
pub async fn follow(
    State(state): State<AppState>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    let params: EventParams = decode_query(query.as_deref())?;
    if wants_stream(&headers) {
        // A reconnecting EventSource says where it stopped; that wins over the URL's `after`.
        let after = match headers.get("last-event-id") {
            Some(value) => value
                .to_str()
                .ok()
                .and_then(|id| id.trim().parse::<u64>().ok())
                .ok_or_else(|| {
                    ApiError::InvalidQuery("Last-Event-ID must be an event seq".into())
                })?,
            None => params.after.unwrap_or(0),
        };
        return stream(state, after);
    }
    let limit = page_limit(params.limit, DEFAULT_PAGE, MAX_PAGE)?;
    let after = params.after.unwrap_or(0);
    let durable_seq = *state.scheduler.durable_event_seq().borrow();
    let events = state.scheduler.log(after, limit)?;
    let first_seq = state.scheduler.first_event_seq()?;
    let next_after = events.last().map_or(after, |event| event.seq);
    Ok(Json(LogPage {
        events,
        next_after,
        durable_seq,
        first_seq,
    })
    .into_response())
}

fn wants_stream(headers: &HeaderMap) -> bool {
    headers
        .get_all(axum::http::header::ACCEPT)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .any(|accept| accept.contains("text/event-stream"))
}

/// What a stream holds between its events.
struct EventStream {
    state: AppState,
    cursor: u64,
    buffered: VecDeque<Event>,
    durable: watch::Receiver<u64>,
    draining: watch::Receiver<bool>,
    /// Its place among the open streams, given back when the stream ends.
    _permit: OwnedSemaphorePermit,
    ended: bool,
}

fn stream(state: AppState, after: u64) -> Result<Response, ApiError> {
    let permit = Arc::clone(&state.event_streams)
        .try_acquire_owned()
        .map_err(|_| ApiError::Overloaded)?;
    let follower = EventStream {
        durable: state.scheduler.durable_event_seq(),
        draining: state.drain.subscribe(),
        state,
        cursor: after,
        buffered: VecDeque::new(),
        _permit: permit,
        ended: false,
    };
    let events = futures_util::stream::unfold(follower, |mut follower| async move {
        let event = follower.next().await?;
        Some((Ok::<_, Infallible>(event), follower))
    });
    Ok(Sse::new(events)
        .keep_alive(KeepAlive::default())
        .into_response())
}

impl EventStream {
    /// The next SSE event: a transition, or a last `error` event before the stream ends.
    /// None once the server drains or the stream has ended.
    async fn next(&mut self) -> Option<sse::Event> {
        if self.ended {
            return None;
        }
        loop {
            if let Some(event) = self.buffered.pop_front() {
                self.cursor = event.seq;
                return Some(transition(&event));
            }
            if *self.draining.borrow() {
                return None;
            }
            match self.state.scheduler.log(self.cursor, STREAM_PAGE) {
                Ok(page) if !page.is_empty() => {
                    self.buffered.extend(page);
                    continue;
                }
                Ok(_) => {}
                Err(error) => {
                    self.ended = true;
                    return Some(sse::Event::default().event("error").data(error.to_string()));
                }
            }
            // Nothing new: wait until more is durable or the server drains.
            let cursor = self.cursor;
            tokio::select! {
                changed = self.durable.wait_for(|&durable| durable > cursor) => {
                    if changed.is_err() {
                        return None;
                    }
                }
                _ = self.draining.wait_for(|&draining| draining) => return None,
            }
        }
    }
}

fn transition(event: &Event) -> sse::Event {
    let data = serde_json::to_string(event).unwrap_or_default();
    sse::Event::default()
        .id(event.seq.to_string())
        .event("transition")
        .data(data)
}
