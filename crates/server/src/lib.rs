//! OpenAI-compatible HTTP server on axum. Arrives with the `redlite serve` issue; the crate
//! exists now so the workspace has its final shape and its one-way dependency on the engine.
