//! The LM heads on the GPU, a product per run of consecutive rows: logits back to the host
//! (through page-locked memory unless `REDLITE_PINNED_LOGITS=0`), or each row's greedy token
//! only (unless `REDLITE_DEVICE_GREEDY=0`: the pick slots of `kept.rs`).

use std::sync::MutexGuard;

use redlite_cuda::Switch;

use super::act::CudaAct;
use super::graph;
use super::scratch::Scratch;
use super::weights;
use super::CudaBackend;
use crate::error::{EngineError, Result};

impl CudaBackend {
    /// Logits of `rows` through `head`, appended to `out`.
    pub(super) fn head_logits(
        &self,
        head: &weights::DeviceMatrix,
        rows: &[usize],
        x: &CudaAct,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        if let (&[row], Some(pieces)) = (rows, logits_pieces(head.rows)) {
            return self.head_logits_in_pieces(head, row, x, pieces, out);
        }
        self.head_runs(head, rows, x, usize::MAX, |scratch, n| {
            self.append_logits(scratch, n * head.rows, out)
        })
    }

    /// `Backend::last_head_logits`: the first `rows` rows of the scratch's logits, as the
    /// last LM head product queued left them (a chained step's verification, whose argmax
    /// read them on the device), appended to `out` after the work queued before.
    pub(super) fn last_head_logits(&self, rows: usize, out: &mut Vec<f32>) -> Result<()> {
        let scratch = self.scratch(1)?;
        if rows > scratch.logit_rows {
            return Err(EngineError::BadConfig(format!(
                "the LM head's last product kept {} rows of logits, asked for {rows}",
                scratch.logit_rows
            )));
        }
        self.append_logits(&scratch, rows * self.weights.output.rows, out)
    }

    /// The scratch's first `values` logits appended to `out`.
    fn append_logits(&self, scratch: &Scratch, values: usize, out: &mut Vec<f32>) -> Result<()> {
        let logits = scratch.logits.slice(..values);
        if pinned_logits() {
            self.logits_stage
                .lock()
                .map_err(|_| EngineError::Cuda("logits stage lock poisoned by a panic".into()))?
                .append_to_host(&self.device, &logits, out)?;
        } else {
            let start = out.len();
            out.resize(start + values, 0.0);
            self.device.copy_to_host(&logits, &mut out[start..])?;
        }
        Ok(())
    }

    /// One row's logits in `pieces` of the vocabulary (`logits_pieces`): each piece's
    /// product, then its copy back on a stream of its own, so that the copies and the host's
    /// appends of the first pieces overlap the later pieces' products. Each logit is its row's
    /// product as in one launch: the same values.
    fn head_logits_in_pieces(
        &self,
        head: &weights::DeviceMatrix,
        row: usize,
        x: &CudaAct,
        pieces: impl Iterator<Item = std::ops::Range<usize>>,
        out: &mut Vec<f32>,
    ) -> Result<()> {
        graph::lock(&self.graphs)?.interrupt()?;
        let mut scratch = self.scratch(row + 1)?;
        scratch.reserve_logits(&self.device, &self.config, 1)?;
        let xrow = x.row_range(row, row + 1)?;
        let q8 = x.q8_range(row, row + 1);
        let mut stage = self
            .logits_stage
            .lock()
            .map_err(|_| EngineError::Cuda("logits stage lock poisoned by a panic".into()))?;
        stage.begin_pieces(&self.device, head.rows)?;
        for range in pieces {
            let part = head.rows_view(range.clone()).ok_or_else(|| {
                EngineError::Cuda(format!("LM head rows {range:?} of {}", head.rows))
            })?;
            redlite_cuda::matmul_quantized(
                &self.device,
                &part,
                (&xrow, q8.as_ref()),
                &mut scratch.logits.slice_mut(range.clone()),
            )?;
            let logits = scratch.logits.slice(range.clone());
            stage.queue_piece(&self.device, &logits, range.clone())?;
        }
        stage.finish_pieces(out)?;
        graph::lock(&self.graphs)?.times.logits_back();
        Ok(())
    }

    /// The LM head `head` of `rows` (ascending): each run of up to `most` consecutive rows
    /// takes one product, then `each` reads its `n` rows' logits from the scratch.
    pub(super) fn head_runs(
        &self,
        head: &weights::DeviceMatrix,
        rows: &[usize],
        x: &CudaAct,
        most: usize,
        mut each: impl FnMut(&mut Scratch, usize) -> Result<()>,
    ) -> Result<()> {
        graph::lock(&self.graphs)?.interrupt()?;
        let mut i = 0;
        while i < rows.len() {
            let mut j = i + 1;
            while j < rows.len() && rows[j] == rows[j - 1] + 1 && j - i < most {
                j += 1;
            }
            let (first, n) = (rows[i], j - i);
            each(&mut *self.head_rows(head, x, (first, n))?, n)?;
            i = j;
        }
        graph::lock(&self.graphs)?.times.logits_back();
        Ok(())
    }

    /// The LM head `head` of the `n` rows of `x` from `first` into the scratch's logits
    /// (`[n][vocab]`, queued), and the scratch that holds them.
    fn head_rows(
        &self,
        head: &weights::DeviceMatrix,
        x: &CudaAct,
        (first, n): (usize, usize),
    ) -> Result<MutexGuard<'_, Scratch>> {
        let mut scratch = self.scratch(first + n)?;
        scratch.reserve_logits(&self.device, &self.config, n)?;
        let rows = x.row_range(first, first + n)?;
        let q8 = x.q8_range(first, first + n);
        redlite_cuda::matmul_quantized(
            &self.device,
            &head.view(),
            (&rows, q8.as_ref()),
            &mut scratch.logits.slice_mut(..n * head.rows),
        )?;
        Ok(scratch)
    }
}

/// Logits come back through page-locked memory (`redlite_cuda::HostStage`: one DMA, then a
/// host copy) instead of the driver's pageable path (a zero fill of the output, then a DMA
/// and a host copy in waited-for pieces); `REDLITE_PINNED_LOGITS=0` keeps the pageable path.
/// The same values; H200 tg128 358.9 vs 352.7 t/s (eighteenth session, docs/PERF.md).
pub static PINNED_LOGITS: Switch = Switch::new("REDLITE_PINNED_LOGITS", true);

fn pinned_logits() -> bool {
    PINNED_LOGITS.on()
}

/// One row's logits come back through page-locked memory in 4 pieces of the vocabulary
/// (`head_logits_in_pieces`, `redlite_cuda::row_pieces`); `REDLITE_LOGITS_PIECES=N`
/// takes N (1: one product, then one copy and one host append). The same bits (the full
/// IQ2_XXS file's logits over 24 tokens, H100). H100, twenty-third session, tg128 at depths
/// 0 / 4096 against one piece: 4 pieces +0.8 / +1.0 % and +0.8 / +0.6 % (two interleaved
/// rounds), then +1.1 / +0.5 %; 8 pieces +1.2 / +0.6 %; 16 pieces -0.1 / -0.3 %.
fn logits_pieces(vocab: usize) -> Option<impl Iterator<Item = std::ops::Range<usize>>> {
    static PIECES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    let n = *PIECES.get_or_init(|| {
        std::env::var("REDLITE_LOGITS_PIECES")
            .ok()
            .and_then(|v| v.parse().ok())
            .filter(|n| (1..=16).contains(n))
            .unwrap_or(4)
    });
    let mut pieces = redlite_cuda::row_pieces(vocab, n, LOGITS_HALVING.on()).peekable();
    let several = pieces.peek().is_some_and(|first| first.len() < vocab);
    (pinned_logits() && several).then_some(pieces)
}

/// `REDLITE_LOGITS_HALVING=1` (an A/B, off): the logits' pieces halve (a half, a quarter,
/// ...: `redlite_cuda::row_pieces`) instead of being equal, so the copy and host append that
/// follow the whole product are the smallest piece's: with 5 pieces 9,472 of 151,936 floats
/// instead of 4 equal pieces' 37,888. Predicted +0.3-0.5 %; H100, twenty-fourth session, two
/// interleaved rounds: +0.2 / +0.1 % at depths 0 / 4096, within the spread between processes.
pub static LOGITS_HALVING: Switch = Switch::new("REDLITE_LOGITS_HALVING", false);

/// Greedy steps, MTP drafts and verifications pick their tokens on the device
/// (`Backend::greedy_tokens`, `Backend::mtp_greedy_tokens`); `REDLITE_DEVICE_GREEDY=0`
/// copies the logits to the host and picks there. The same tokens (`greedy`, `cuda_parity`
/// and `cuda_mtp` GPU tests, passed on the H200 in the eighteenth session); MTP with one
/// draft at acceptance 0.7: 410.4 vs 312.4 t/s.
pub static DEVICE_GREEDY: Switch = Switch::new("REDLITE_DEVICE_GREEDY", true);

/// `REDLITE_CHAINED_GREEDY=0`: with `DEVICE_GREEDY`, a greedy speculative step reads each
/// draft before the next forward call (separate calls) instead of keeping its picks on the
/// device until the verification has run (`kept.rs`); the same tokens.
pub static CHAINED_GREEDY: Switch = Switch::new("REDLITE_CHAINED_GREEDY", true);

pub(super) fn device_greedy() -> bool {
    DEVICE_GREEDY.on()
}
