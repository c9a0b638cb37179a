//! `GET /metrics`: the scheduler's counters in Prometheus text format.

use std::fmt::Write;

use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;

use crate::Shared;

pub async fn handle(State(state): State<Shared>) -> impl IntoResponse {
    let m = state.handle.metrics();
    let mut out = String::new();
    let mut metric = |name: &str, kind: &str, help: &str, samples: &[(&str, f64)]| {
        let _ = writeln!(out, "# HELP redlite_{name} {help}");
        let _ = writeln!(out, "# TYPE redlite_{name} {kind}");
        for (labels, value) in samples {
            let _ = writeln!(out, "redlite_{name}{labels} {value}");
        }
    };
    metric(
        "requests_total",
        "counter",
        "Requests by outcome.",
        &[
            (r#"{outcome="submitted"}"#, m.requests_submitted as f64),
            (r#"{outcome="rejected"}"#, m.requests_rejected as f64),
            (r#"{outcome="finished"}"#, m.requests_finished as f64),
            (r#"{outcome="cancelled"}"#, m.requests_cancelled as f64),
            (r#"{outcome="failed"}"#, m.requests_failed as f64),
        ],
    );
    let counters: [(&str, &str, u64); 16] = [
        (
            "prompt_tokens_total",
            "Prompt tokens of admitted requests.",
            m.prompt_tokens,
        ),
        (
            "prompt_tokens_cached_total",
            "Prompt tokens reused from state snapshots.",
            m.cached_prompt_tokens,
        ),
        (
            "prefill_tokens_total",
            "Prompt tokens run through the model.",
            m.prefill_tokens,
        ),
        (
            "completion_tokens_total",
            "Tokens generated.",
            m.completion_tokens,
        ),
        (
            "prefix_cache_lookups_total",
            "Admissions that looked for a reusable prefix.",
            m.prefix_lookups,
        ),
        (
            "prefix_cache_hits_total",
            "Admissions that reused a prefix.",
            m.prefix_hits,
        ),
        ("steps_total", "Forward calls.", m.steps),
        (
            "step_rows_total",
            "Tokens over all forward calls.",
            m.step_rows,
        ),
        (
            "step_sequences_total",
            "Sequences over all forward calls (batch sizes summed).",
            m.step_sequences,
        ),
        (
            "queue_depth_max",
            "Most requests waiting at once.",
            m.max_queue_depth,
        ),
        (
            "mtp_steps_total",
            "MTP draft-and-verify steps (speculative decoding, serve --mtp).",
            m.mtp_steps,
        ),
        (
            "mtp_drafted_tokens_total",
            "Tokens drafted by the MTP block.",
            m.mtp_drafted,
        ),
        (
            "mtp_accepted_tokens_total",
            "Drafted tokens the model kept.",
            m.mtp_accepted,
        ),
        (
            "expert_cache_hits_total",
            "Chosen experts found in the GPU expert cache (--experts cache=SIZE).",
            m.expert_cache_hits,
        ),
        (
            "expert_cache_misses_total",
            "Chosen experts copied into the GPU expert cache from host memory.",
            m.expert_cache_misses,
        ),
        (
            "expert_cache_copied_bytes_total",
            "Bytes copied into the GPU expert cache.",
            m.expert_cache_bytes,
        ),
    ];
    for (name, help, value) in counters {
        let kind = if name.ends_with("_total") {
            "counter"
        } else {
            "gauge"
        };
        metric(name, kind, help, &[("", value as f64)]);
    }
    metric(
        "expert_cache_wait_seconds_total",
        "counter",
        "Seconds decoding waited for experts copied into the GPU expert cache.",
        &[("", m.expert_cache_wait_ns as f64 * 1e-9)],
    );
    let mean_accepted = m.mtp_accepted as f64 / m.mtp_steps.max(1) as f64;
    let gauges: [(&str, &str, f64); 6] = [
        ("slots", "Slots (sequences served at once).", m.slots as f64),
        (
            "slots_busy",
            "Slots holding a request.",
            m.busy_slots as f64,
        ),
        (
            "queue_depth",
            "Requests waiting for a slot.",
            m.queue_depth as f64,
        ),
        (
            "tokens_per_second",
            "Tokens generated per second over the last 10 s.",
            m.tokens_per_second,
        ),
        (
            "uptime_seconds",
            "Seconds since the scheduler started.",
            m.uptime_seconds,
        ),
        (
            "mtp_mean_accepted_length",
            "Kept drafts per MTP step, since the start.",
            mean_accepted,
        ),
    ];
    for (name, help, value) in gauges {
        metric(name, "gauge", help, &[("", value)]);
    }
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        out,
    )
}
