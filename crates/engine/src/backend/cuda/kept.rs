//! Greedy picks kept on the device for chained greedy steps (`Backend::keep_greedy_tokens`):
//! an MTP step's drafts reach the next draft's and the verification's embeddings through
//! device memory, and the host reads every pick of the step once, at its end. A pick is the
//! argmax key of its row of logits (`redlite_cuda::argmax_rows_queued`); an embedding that
//! takes kept picks turns their keys into token ids in its own id buffer
//! (`redlite_cuda::ids_of_keys`) after the host's ids were copied there.

use std::ops::Range;
use std::sync::MutexGuard;

use redlite_cuda::{CudaSlice, CudaViewMut, Device, MAX_ARGMAX_ROWS};

use super::act::CudaAct;
use super::CudaBackend;
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
    /// The next embedding's tokens `.0..` come from the slots `.1`.
    next_embedding: Option<(usize, Range<usize>)>,
}

impl KeptPicks {
    /// The next `n` slots (the argmax writes them), counted as used.
    pub fn next_slots(&mut self, device: &Device, n: usize) -> Result<CudaViewMut<'_, u64>> {
        let first = self.used;
        if first + n > MAX_ARGMAX_ROWS {
            return Err(EngineError::BadConfig(format!(
                "a chained step keeps at most {MAX_ARGMAX_ROWS} greedy picks, asked for {}",
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
        if picks.is_empty() || picks.end > self.used {
            return Err(EngineError::BadConfig(format!(
                "an embedding of kept picks {picks:?}: {} picks are kept",
                self.used
            )));
        }
        self.next_embedding = Some((at, picks));
        Ok(())
    }

    /// Called by every embedding after the host's ids were copied into `ids` (one a token):
    /// writes the kept picks the embedding takes (if any) over their stand-ins.
    pub fn substitute(&mut self, device: &Device, ids: &mut CudaViewMut<'_, u32>) -> Result<()> {
        let Some((at, picks)) = self.next_embedding.take() else {
            return Ok(());
        };
        let end = at + picks.len();
        let (Some(keys), true) = (&self.keys, end <= ids.len()) else {
            return Err(EngineError::BadConfig(format!(
                "kept picks for tokens {at}..{end} of an embedding of {} tokens",
                ids.len()
            )));
        };
        let mut into = ids.slice_mut(at..end);
        redlite_cuda::ids_of_keys(device, &keys.slice(picks), &mut into)?;
        Ok(())
    }

    /// Every kept pick's token, in slot order, into `out` (waits for the device); the slots
    /// are emptied first, so a failed read leaves none behind. `vocab`: for the error of a
    /// row without a finite logit.
    pub fn take(&mut self, device: &Device, vocab: usize, out: &mut Vec<u32>) -> Result<()> {
        out.clear();
        let used = std::mem::take(&mut self.used);
        self.next_embedding = None;
        let Some(keys) = &self.keys else {
            return Ok(());
        };
        if used == 0 {
            return Ok(());
        }
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
        let head = match head {
            LmHead::Trunk => {
                self.device.mark("LM head");
                &self.weights.output
            }
            LmHead::Mtp => {
                self.device.mark("MTP head");
                self.weights.mtp_head()?
            }
        };
        // The scratch is locked first (by `head_runs`), as in the embeddings.
        self.head_runs(head, rows, x, MAX_ARGMAX_ROWS, |scratch, n| {
            let logits = scratch.logits.slice(..n * head.rows);
            let mut kept = self.kept()?;
            let mut slots = kept.next_slots(&self.device, n)?;
            redlite_cuda::argmax_rows_queued(&self.device, &logits, &mut slots)?;
            Ok(())
        })
    }

    /// The kept picks, locked.
    pub(super) fn kept(&self) -> Result<MutexGuard<'_, KeptPicks>> {
        self.kept
            .lock()
            .map_err(|_| EngineError::Cuda("kept-picks lock poisoned by a panic".into()))
    }
}
