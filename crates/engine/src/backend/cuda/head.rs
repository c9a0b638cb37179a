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
        self.head_runs(head, rows, x, usize::MAX, |scratch, n| {
            let logits = scratch.logits.slice(..n * head.rows);
            if pinned_logits() {
                self.logits_stage
                    .lock()
                    .map_err(|_| EngineError::Cuda("logits stage lock poisoned by a panic".into()))?
                    .append_to_host(&self.device, &logits, out)?;
            } else {
                let start = out.len();
                out.resize(start + n * head.rows, 0.0);
                self.device.copy_to_host(&logits, &mut out[start..])?;
            }
            Ok(())
        })
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
