//! The OpenAI-compatible HTTP server: parse a request, render and tokenize it, submit it to
//! the engine's scheduler (`redlite_engine::serve`), and stream or collect what comes back.
//! The scheduler does the batching, slots and prompt reuse; this crate stays thin.

mod chat;
mod completions;
mod error;
mod job;
mod metrics;
mod output;
mod request;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use redlite_engine::chat::ChatTemplate;
use redlite_engine::serve::Handle;
use redlite_engine::tokenizer::Tokenizer;
use serde_json::json;

pub use error::ApiError;

/// Request bodies larger than this are refused with 413 (a long prompt is a few MB).
pub const DEFAULT_MAX_BODY_BYTES: usize = 8 << 20;

/// What every handler reads.
pub struct AppState {
    pub handle: Handle,
    pub tokenizer: Arc<Tokenizer>,
    /// The GGUF's chat template (`None`: the model has none; chat requests are refused).
    pub template: Option<ChatTemplate>,
    /// The id `/v1/models` lists (requests may name any model).
    pub model_id: String,
    /// Bearer token required on `/v1/*` when set.
    pub api_key: Option<String>,
    /// Unix time the server started (the model's `created`).
    pub created: u64,
}

type Shared = Arc<AppState>;

/// The routes, with authentication, the body size limit and one log line per request.
pub fn router(state: AppState, max_body_bytes: usize) -> Router {
    let state = Arc::new(state);
    let api = Router::new()
        .route("/v1/chat/completions", post(chat::handle))
        .route("/v1/completions", post(completions::handle))
        .route("/v1/models", get(models))
        .route("/apply-template", post(chat::apply_template))
        .route_layer(middleware::from_fn_with_state(state.clone(), authenticate));
    Router::new()
        .merge(api)
        .route("/health", get(health))
        .route("/metrics", get(metrics::handle))
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(max_body_bytes))
        .layer(middleware::from_fn(log_request))
        .with_state(state)
}

/// Binds `addr` and serves until Ctrl-C.
pub async fn serve(
    state: AppState,
    addr: SocketAddr,
    max_body_bytes: usize,
) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    eprintln!("listening on http://{}", listener.local_addr()?);
    let handle = state.handle.clone();
    axum::serve(listener, router(state, max_body_bytes))
        .with_graceful_shutdown(async move {
            let _ = tokio::signal::ctrl_c().await;
            eprintln!("shutting down");
            handle.shutdown();
        })
        .await
}

/// A body within the size limit, or the matching error (413 past the limit).
pub(crate) fn body(body: Result<Bytes, BytesRejection>) -> Result<Bytes, ApiError> {
    body.map_err(|rejection| {
        let status = rejection.status();
        let message = if status == StatusCode::PAYLOAD_TOO_LARGE {
            "the request body is larger than the server accepts".to_string()
        } else {
            rejection.body_text()
        };
        ApiError {
            status,
            ..ApiError::bad_request(message)
        }
    })
}

async fn authenticate(State(state): State<Shared>, request: Request, next: Next) -> Response {
    if let Some(key) = &state.api_key {
        let given = request
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim);
        if !given.is_some_and(|g| constant_time_eq(g.as_bytes(), key.as_bytes())) {
            return ApiError::unauthorized().into_response();
        }
    }
    next.run(request).await
}

/// Compares without stopping at the first difference (the key is a secret).
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn log_request(request: Request, next: Next) -> Response {
    let (method, path) = (request.method().clone(), request.uri().path().to_string());
    let start = Instant::now();
    let response = next.run(request).await;
    tracing::info!(
        "{method} {path} {} {:.1} ms",
        response.status().as_u16(),
        start.elapsed().as_secs_f64() * 1e3
    );
    response
}

async fn models(State(state): State<Shared>) -> Json<serde_json::Value> {
    Json(json!({
        "object": "list",
        "data": [{
            "id": state.model_id,
            "object": "model",
            "created": state.created,
            "owned_by": "redlite",
            "context_length": state.handle.config().context,
        }],
    }))
}

async fn health(State(state): State<Shared>) -> Json<serde_json::Value> {
    let m = state.handle.metrics();
    Json(json!({
        "status": "ok",
        "slots": m.slots,
        "slots_busy": m.busy_slots,
        "queue_depth": m.queue_depth,
    }))
}

async fn not_found(request: Request) -> ApiError {
    ApiError::not_found(format!(
        "no route for {} {}",
        request.method(),
        request.uri().path()
    ))
}
