//! Greedy picks on the device: each row's argmax key in a pick slot, read by the host later.
//! A plain greedy step reads its picks at once (`Backend::greedy_tokens`); a chained greedy
//! step (`Backend::keep_greedy_tokens`) keeps them while its drafts reach the next draft's
//! and the verification's embeddings through device memory, and the host reads every pick
//! of the step once, at its end. A pick is the argmax key of its row of logits
//! (`redlite_cuda::argmax_rows_queued`); an embedding that takes kept picks turns their keys
//! into token ids in its own id buffer (`redlite_cuda::ids_of_keys`) after the host's ids
//! were copied there.

use std::ops::Range;
use std::sync::MutexGuard;

use redlite_cuda::{CudaSlice, CudaViewMut, Device, MAX_ARGMAX_ROWS};

use super::act::CudaAct;
use super::graph::{self, Gate, Op};
use super::weights::DeviceMatrix;
use super::CudaBackend;
use crate::backend::kept::NextEmbedding;
use crate::backend::LmHead;
use crate::error::{EngineError, Result};
use crate::sampling::SamplingError;

/// The pick slots of the step in progress.
#[derive(Default)]
pub struct KeptPicks {
    /// One argmax key a slot, `[MAX_ARGMAX_ROWS]`; allocated by the first pick.
    keys: Option<CudaSlice<u64>>,
    /// Slots holding picks, from slot 0.
    used: usize,
    next: NextEmbedding,
}

impl KeptPicks {
    /// The next `n` slots (the argmax writes them), counted as used.
    fn next_slots(&mut self, device: &Device, n: usize) -> Result<CudaViewMut<'_, u64>> {
        let first = self.used;
        if first + n > MAX_ARGMAX_ROWS {
            return Err(EngineError::BadConfig(format!(
                "at most {MAX_ARGMAX_ROWS} greedy picks are kept on the device, asked for {}",
                first + n
            )));
        }
        let keys = match &mut self.keys {
            Some(keys) => keys,
            none => none.insert(device.alloc_zeros(MAX_ARGMAX_ROWS)?),
        };
        self.used += n;
        Ok(keys.slice_mut(first..first + n))
    }

    /// The next embedding takes its tokens `at..at + picks.len()` from `picks`.
    pub fn embed_next(&mut self, at: usize, picks: Range<usize>) -> Result<()> {
        self.next.ask(at, picks, self.used)
    }

    /// Called by every embedding after the host's ids were copied into `ids` (one a token):
    /// writes the kept picks the embedding takes (if any) over their stand-ins.
    pub fn substitute(&mut self, device: &Device, ids: &mut CudaViewMut<'_, u32>) -> Result<()> {
        let (Some((tokens, picks)), Some(keys)) = (self.next.take(ids.len())?, &self.keys) else {
            return Ok(());
        };
        let mut into = ids.slice_mut(tokens);
        redlite_cuda::ids_of_keys(device, &keys.slice(picks), &mut into)?;
        Ok(())
    }

    /// `substitute` where a replayed step graph writes the picks: only the bookkeeping.
    pub fn substitute_recorded(&mut self, tokens: usize) -> Result<()> {
        self.next.take(tokens)?;
        Ok(())
    }

    /// The pick slots' address (0 before the first pick): part of a step graph's identity.
    pub fn address(&self, device: &Device) -> u64 {
        self.keys.as_ref().map_or(0, |keys| device.address(keys))
    }

    /// Every kept pick's token, in slot order, appended to `out` (waits for the device); the
    /// slots are emptied first, so a failed read leaves none behind. `vocab`: for the error
    /// of a row without a finite logit.
    pub fn take(&mut self, device: &Device, vocab: usize, out: &mut Vec<u32>) -> Result<()> {
        let used = std::mem::take(&mut self.used);
        self.next.clear();
        let (Some(keys), true) = (&self.keys, used > 0) else {
            return Ok(());
        };
        let mut found = [0u64; MAX_ARGMAX_ROWS];
        device.copy_to_host(&keys.slice(..used), &mut found[..used])?;
        for &key in &found[..used] {
            let token = redlite_cuda::token_of_key(key)
                .ok_or(SamplingError::NoFiniteLogit { count: vocab })?;
            out.push(token);
        }
        Ok(())
    }
}

impl CudaBackend {
    /// `Backend::keep_greedy_tokens`: each run of consecutive rows takes one head product
    /// and one argmax launch into the next slots.
    pub(super) fn keep_picks(&self, head: LmHead, rows: &[usize], x: &CudaAct) -> Result<()> {
        let lm_head = head;
        let head = self.head_matrix(head)?;
        if graph::lock(&self.graphs)?.step.in_step() {
            // Within a whole-step graph: recorded, or skipped where the replay writes the slots.
            let logits = self.device.address(&self.scratch(1)?.logits);
            let span = match (rows.first(), rows.last()) {
                (Some(&first), Some(&last)) => ((first as u64) << 32) | last as u64,
                _ => return Ok(()),
            };
            let key = self.key(
                Op::Picks(lm_head),
                rows.len(),
                [x.address(&self.device)?, logits, span],
            )?;
            if graph::lock(&self.graphs)?.gate(key)? == Gate::Skip {
                self.kept()?.next_slots(&self.device, rows.len())?;
                return Ok(());
            }
        }
        // The scratch is locked first (by `head_runs`), as in the embeddings.
        self.head_runs(head, rows, x, MAX_ARGMAX_ROWS, |scratch, n| {
            let logits = scratch.logits.slice(..n * head.rows);
            let mut kept = self.kept()?;
            let mut slots = kept.next_slots(&self.device, n)?;
            redlite_cuda::argmax_rows_queued(&self.device, &logits, &mut slots)?;
            Ok(())
        })
    }

    /// `Backend::greedy_tokens` and `mtp_greedy_tokens` (a step that is not chained): the
    /// rows' picks kept, then read at once, appended to `out`.
    pub(super) fn read_picks(
        &self,
        head: LmHead,
        rows: &[usize],
        x: &CudaAct,
        out: &mut Vec<u32>,
    ) -> Result<()> {
        if self.kept()?.used > 0 {
            return Err(EngineError::BadConfig(
                "greedy tokens asked for while a chained step keeps its picks".into(),
            ));
        }
        self.keep_picks(head, rows, x)?;
        let vocab = self.head_matrix(head)?.rows;
        self.kept()?.take(&self.device, vocab, out)
    }

    /// The LM head `head`, its launches marked as its component.
    fn head_matrix(&self, head: LmHead) -> Result<&DeviceMatrix> {
        match head {
            LmHead::Trunk => {
                self.device.mark("LM head");
                Ok(&self.weights.output)
            }
            LmHead::Mtp => {
                self.device.mark("MTP head");
                self.weights.mtp_head()
            }
        }
    }

    /// The kept picks, locked.
    pub(super) fn kept(&self) -> Result<MutexGuard<'_, KeptPicks>> {
        self.kept
            .lock()
            .map_err(|_| EngineError::Cuda("kept-picks lock poisoned by a panic".into()))
    }
}
