//! Matrix products of a single token (decode) without allocating: each input quantized once
//! per activation format into buffers the thread keeps, the rows of every product split
//! into pieces of one parallel region, and results written in place. Each row is the same
//! kernel call as in `linear::run_jobs` (a row's dot does not depend on how rows are split),
//! so the results are bit for bit those of the batched path.

use std::cell::RefCell;

use redlite_gguf::GgmlType;
use redlite_quant::{matvec, vec_dot_type, QuantizedActivation};

use crate::backend::cpu::linear::{MatmulCtx, Precision};
use crate::backend::cpu::pool::{self, Disjoint};
use crate::backend::cpu::weights::Matrix;
use crate::error::{EngineError, Result};

/// The most products of one call (the MoE's gate and up projections of its routed experts
/// and shared expert).
pub const MAX_PRODUCTS: usize = 48;

/// The most distinct (input, activation format) pairs of one call.
const MAX_ACTS: usize = 24;

/// Rows handed to one parallel task, at least (as `linear::run_jobs`).
const ROWS_PER_TASK: usize = 16;

/// Rows `first..first + n` of `w` dotted with input `input` of the call, into `out`: `n`
/// values for one token (here), `[tokens][n]` in a batched call
/// (`linear::matmul_same_input`, which has one input).
pub struct Product<'a> {
    pub w: &'a Matrix,
    /// The first row (a slab of a stack of experts), 0 for a whole matrix.
    pub first: usize,
    pub input: usize,
    pub out: &'a mut [f32],
}

impl<'a> Product<'a> {
    /// The whole of `w` dotted with the call's first input.
    pub fn whole(w: &'a Matrix, out: &'a mut [f32]) -> Product<'a> {
        Product {
            w,
            first: 0,
            input: 0,
            out,
        }
    }
}

/// Whether products of one token take this path: ggml precision (the exact path keeps the
/// reference's f32 dots) and few enough products.
pub fn applies(mm: &MatmulCtx, products: usize) -> bool {
    mm.precision == Precision::Ggml && products <= MAX_PRODUCTS
}

thread_local! {
    /// Quantized inputs, kept between calls (their buffers grow once).
    static ACTS: RefCell<Vec<QuantizedActivation>> = const { RefCell::new(Vec::new()) };
}

/// Runs every product in one parallel region. `inputs[i]` has `w.cols` values for each
/// product reading it.
pub fn run(mm: &MatmulCtx, inputs: &[&[f32]], products: &mut [Product<'_>]) -> Result<()> {
    if !applies(mm, products.len()) {
        return Err(EngineError::BadConfig(format!(
            "{} one-token products exceed the limit of {MAX_PRODUCTS}",
            products.len()
        )));
    }
    // Which quantized activation each product reads: one per (input, format) pair.
    let mut keys = [(usize::MAX, GgmlType::F32); MAX_ACTS];
    let mut n_keys = 0;
    let mut act_of = [0usize; MAX_PRODUCTS];
    for (p, slot) in products.iter().zip(act_of.iter_mut()) {
        let key = (p.input, vec_dot_type(p.w.ty));
        let found = keys[..n_keys].iter().position(|k| *k == key);
        *slot = match found {
            Some(i) => i,
            None if n_keys < MAX_ACTS => {
                keys[n_keys] = key;
                n_keys += 1;
                n_keys - 1
            }
            None => {
                return Err(EngineError::BadConfig(format!(
                    "one-token products need more than {MAX_ACTS} quantized inputs"
                )))
            }
        };
        let x = inputs.get(p.input).ok_or_else(|| {
            EngineError::BadConfig(format!("product input {} of {}", p.input, inputs.len()))
        })?;
        if x.len() != p.w.cols || p.first + p.out.len() > p.w.rows {
            return Err(EngineError::BadConfig(format!(
                "one-token product of {} values into rows {}..{} of a {}x{} matrix",
                x.len(),
                p.first,
                p.first + p.out.len(),
                p.w.rows,
                p.w.cols
            )));
        }
    }
    // A nested call (none today) would find the thread's buffers taken: it gets its own.
    ACTS.with(|cell| match cell.try_borrow_mut() {
        Ok(mut acts) => quantize_and_run(mm, inputs, products, n_keys, &act_of, &mut acts),
        Err(_) => quantize_and_run(mm, inputs, products, n_keys, &act_of, &mut Vec::new()),
    })
}

/// [`run`] once the products' activations are known: `n_keys` distinct (input, format)
/// pairs, `act_of[k]` product `k`'s; `acts` the buffers to quantize them into.
fn quantize_and_run(
    mm: &MatmulCtx,
    inputs: &[&[f32]],
    products: &mut [Product<'_>],
    n_keys: usize,
    act_of: &[usize; MAX_PRODUCTS],
    acts: &mut Vec<QuantizedActivation>,
) -> Result<()> {
    let mut quantized = [false; MAX_ACTS];
    while acts.len() < n_keys {
        acts.push(QuantizedActivation::new(GgmlType::F32, &[])?);
    }
    for (p, &a) in products.iter().zip(act_of) {
        // The first product of each key quantizes its input with its own weight type.
        if !quantized[a] {
            acts[a].requantize(p.w.ty, inputs[p.input])?;
            quantized[a] = true;
        }
    }
    let acts = &acts[..n_keys];
    let total: usize = products.iter().map(|p| p.out.len()).sum();
    let threads = rayon::current_num_threads().max(1);
    let piece = (total / (threads * 8)).max(ROWS_PER_TASK);
    let pieces: usize = products.iter().map(|p| p.out.len().div_ceil(piece)).sum();
    // What the tasks read of each product, apart from its output.
    let mut rows_of: [(Option<&Matrix>, usize, usize); MAX_PRODUCTS] = [(None, 0, 0); MAX_PRODUCTS];
    for (slot, p) in rows_of.iter_mut().zip(products.iter()) {
        *slot = (Some(p.w), p.first, p.out.len());
    }
    let mut outs: [Option<Disjoint<'_, f32>>; MAX_PRODUCTS] = std::array::from_fn(|_| None);
    for (slot, p) in outs.iter_mut().zip(products.iter_mut()) {
        *slot = Some(Disjoint::new(&mut *p.out));
    }
    pool::for_each(pieces, &|mut i| {
        for (k, &(w, first, len)) in rows_of.iter().enumerate() {
            let n = len.div_ceil(piece);
            if i >= n {
                i -= n;
                continue;
            }
            let (Some(w), Some(out)) = (w, &outs[k]) else {
                break;
            };
            let (r0, r1) = (i * piece, ((i + 1) * piece).min(len));
            // SAFETY: piece `i` of product `k` is this task's alone.
            let out = unsafe { out.range_mut(r0, r1) };
            let bytes = mm.gguf.data(w.loc);
            let rows = &bytes[(first + r0) * w.row_bytes..(first + r1) * w.row_bytes];
            matvec(w.ty, rows, r1 - r0, &acts[act_of[k]], out)?;
            break;
        }
        Ok(())
    })
}
