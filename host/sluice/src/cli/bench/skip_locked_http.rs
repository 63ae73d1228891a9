//! `sluice bench skip-locked --http`: the plain queue's three statements behind a minimal
//! HTTP server (axum and JSON on a port of its own, in the bench's process), so the baseline
//! can be measured through HTTP as Sluice is. Not a product: no auth, no limits beyond
//! axum's body limit, errors answered 503 with the database's message.

use super::skip_locked::{ClaimedJob, Queue, claim, complete, insert};
use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use sqlx::postgres::PgPool;

/// A claim takes at most this many jobs, as `bench e2e`'s claims do.
const MAX_CLAIM: usize = 1_024;

type RouteAnswer<T> = Result<Json<T>, (StatusCode, String)>;

fn unavailable(error: anyhow::Error) -> (StatusCode, String) {
    (StatusCode::SERVICE_UNAVAILABLE, format!("{error:#}"))
}

async fn insert_jobs(State(pool): State<PgPool>, Json(numbers): Json<Vec<i64>>) -> RouteAnswer<()> {
    insert(&pool, &numbers).await.map_err(unavailable)?;
    Ok(Json(()))
}

async fn claim_jobs(
    State(pool): State<PgPool>,
    Json(max): Json<usize>,
) -> RouteAnswer<Vec<ClaimedJob>> {
    if !(1..=MAX_CLAIM).contains(&max) {
        return Err((
            StatusCode::UNPROCESSABLE_ENTITY,
            format!("a claim takes 1 to {MAX_CLAIM} jobs"),
        ));
    }
    claim(&pool, max).await.map(Json).map_err(unavailable)
}

async fn complete_jobs(State(pool): State<PgPool>, Json(ids): Json<Vec<i64>>) -> RouteAnswer<u64> {
    complete(&pool, &ids).await.map(Json).map_err(unavailable)
}

/// Serves the queue on a free local port until the returned task is aborted; the `Queue` its
/// clients use to reach it.
pub(super) async fn serve(
    pool: PgPool,
) -> anyhow::Result<(Queue, tokio::task::JoinHandle<std::io::Result<()>>)> {
    let app = axum::Router::new()
        .route("/jobs", post(insert_jobs))
        .route("/claim", post(claim_jobs))
        .route("/complete", post(complete_jobs))
        .with_state(pool);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(64)
        .build()?;
    Ok((Queue::Http { client, url }, server))
}
