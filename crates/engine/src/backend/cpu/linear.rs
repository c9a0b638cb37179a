//! Matrix products on the CPU: `y[t][o] = Σ_i W[o][i] · x[t][i]` for a batch of tokens,
//! decoding each weight row once per batch (weights stay in the memory map).
// Index loops mirror the formulas (several arrays share one index).
#![allow(clippy::needless_range_loop)]

use std::cell::RefCell;
use std::sync::Mutex;

use redlite_gguf::{GgmlType, GgufModel};
use redlite_quant::{
    decodable, decode_row, decoded_dots_available, dequantize_row, dot_decoded_many,
    dot_decoded_tile, matvec, prefetch, tileable, tiles_available, vec_dot_many, vec_dot_type,
    ActTile, DecodedRow, QuantizedActivation, TILE_TOKENS,
};

use crate::backend::cpu::one_token::{self, Product};
use crate::backend::cpu::pool;
use crate::backend::cpu::scratch::Scratch;
use crate::backend::cpu::weights::Matrix;
use crate::error::Result;

/// How the CPU multiplies by a quantized weight.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Precision {
    /// Weight rows decoded to f32, f32 activations: the exact math of the dequantized model
    /// (what transformers computes on the same weights). The reference.
    Exact,
    /// Activations quantized once per token to the weight type's dot type (Q8_K, Q8_0, F16;
    /// F32 kept as is) and SIMD dots (integer block dots, f32 FMA), as llama.cpp's CPU
    /// backend does. Fast.
    Ggml,
}

impl Precision {
    /// `REDLITE_CPU_EXACT=1` selects the exact path.
    pub fn from_env() -> Precision {
        match std::env::var("REDLITE_CPU_EXACT").as_deref() {
            Ok("1") | Ok("true") => Precision::Exact,
            _ => Precision::Ggml,
        }
    }
}

/// What a matrix product needs besides its operands.
#[derive(Clone, Copy)]
pub struct MatmulCtx<'a> {
    pub gguf: &'a GgufModel,
    pub precision: Precision,
}

/// Rows handed to one parallel task.
const ROWS_PER_TASK: usize = 16;

/// The most rows of a piece when several tokens share it.
const MAX_BATCHED_PIECE_ROWS: usize = 32;

/// Tokens per tile of a batched product: 32 Q8_K activations of 2048 values are 73 KiB.
const TOKEN_TILE: usize = 32;

/// Tokens handed to one parallel task (activation quantization, transposes): one
/// activation tile.
const TOKENS_PER_TASK: usize = TILE_TOKENS;

/// The fewest tokens that take the tile kernels (`dot_decoded_tile`): below, most of a
/// tile's 16 lanes would idle and the batched row kernels are faster (measured, `tile_bench`).
const TILE_MIN_TOKENS: usize = 8;

/// f32 dot product with eight partial sums (lane `l` sums elements `8c + l`), then a fixed
/// pairwise reduction: a repeatable order that compiles to vector multiplies and adds (no
/// fused multiply-add, which would round differently).
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [0f32; 8];
    let (a8, b8) = (a.chunks_exact(8), b.chunks_exact(8));
    let (a_rest, b_rest) = (a8.remainder(), b8.remainder());
    for (x, y) in a8.zip(b8) {
        for ((s, xv), yv) in acc.iter_mut().zip(x).zip(y) {
            *s += xv * yv;
        }
    }
    let mut sum = (acc[0] + acc[4]) + (acc[1] + acc[5]) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for (x, y) in a_rest.iter().zip(b_rest) {
        sum += x * y;
    }
    sum
}

/// [`dot`] of a row of little-endian f32 bytes (an F32 weight row, read in place from the
/// file) with `b`: the same lanes and order, so the same bits as `dot` on the decoded row.
pub fn dot_le_bytes(a: &[u8], b: &[f32]) -> f32 {
    let n = (a.len() / 4).min(b.len());
    let (a, b) = (&a[..4 * n], &b[..n]);
    let mut acc = [0f32; 8];
    let (a8, b8) = (a.chunks_exact(32), b.chunks_exact(8));
    let (a_rest, b_rest) = (a8.remainder(), b8.remainder());
    for (x, y) in a8.zip(b8) {
        for ((s, xv), yv) in acc.iter_mut().zip(x.chunks_exact(4)).zip(y) {
            *s += f32::from_le_bytes([xv[0], xv[1], xv[2], xv[3]]) * yv;
        }
    }
    let mut sum = (acc[0] + acc[4]) + (acc[1] + acc[5]) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for (x, y) in a_rest.chunks_exact(4).zip(b_rest) {
        sum += f32::from_le_bytes([x[0], x[1], x[2], x[3]]) * y;
    }
    sum
}

/// A batch of activations prepared once for one weight type: f32 rows (exact precision, or
/// F32 weights), or each token quantized to the type's dot format (ggml precision).
/// The f32 rows are borrowed, not copied.
pub enum Prepared<'x> {
    F32 {
        x: &'x [f32],
        cols: usize,
    },
    Quantized {
        acts: Vec<QuantizedActivation>,
        /// The same tokens interleaved 16 at a time for the tile kernels (a Q8_K batch of
        /// at least [`TILE_MIN_TOKENS`] on a CPU with AVX-512 VNNI; else empty), used by the
        /// weight types that have tile kernels.
        tiles: Vec<ActTile>,
    },
}

impl<'x> Prepared<'x> {
    /// Prepares `tokens` rows of `cols` values for dots with rows of `ty`.
    pub fn new(mm: &MatmulCtx, ty: GgmlType, x: &'x [f32], cols: usize) -> Result<Prepared<'x>> {
        // With ggml precision an F32 weight (the router) takes the quant crate's SIMD f32
        // kernel (FMA, its own lane order) through an F32 "quantized" copy of each token.
        if mm.precision == Precision::Exact {
            return Ok(Prepared::F32 { x, cols });
        }
        let tokens = x.len() / cols.max(1);
        // Tiles for any Q8_K batch: one preparation can serve several weight types (products
        // with the same input), and each takes the tiles if its type has tile kernels.
        let tiled = wants_tiles(tokens, vec_dot_type(ty));
        // Tokens quantized in parallel, a block of them (and its tile) per task.
        let blocks: Vec<Mutex<(Vec<QuantizedActivation>, Option<ActTile>)>> = x
            .chunks(cols * TOKENS_PER_TASK)
            .map(|_| Mutex::new((Vec::new(), None)))
            .collect();
        pool::for_each(blocks.len(), &|i| {
            let xs = x.chunks(cols * TOKENS_PER_TASK).nth(i).unwrap_or_default();
            let acts = xs
                .chunks(cols)
                .map(|xt| QuantizedActivation::new(ty, xt))
                .collect::<std::result::Result<Vec<_>, _>>()?;
            let tile = if tiled {
                Some(ActTile::new(&acts)?)
            } else {
                None
            };
            *blocks[i].lock().unwrap_or_else(|p| p.into_inner()) = (acts, tile);
            Ok(())
        })?;
        let mut acts = Vec::with_capacity(tokens);
        let mut tiles = Vec::new();
        for block in blocks {
            let (a, tile) = block.into_inner().unwrap_or_else(|p| p.into_inner());
            acts.extend(a);
            tiles.extend(tile);
        }
        Ok(Prepared::Quantized { acts, tiles })
    }

    /// The activation format of a quantized batch (`None` for f32 rows).
    pub fn format(&self) -> Option<GgmlType> {
        match self {
            Prepared::F32 { .. } => None,
            Prepared::Quantized { acts, .. } => acts.first().map(|a| a.ty()),
        }
    }

    /// Tokens `picks` of a quantized batch as a batch of their own: each token's activation
    /// copied, the same bits as quantizing its values anew (f32 rows are refused: the
    /// caller gathers those).
    pub fn select(&self, picks: &[usize]) -> Result<Prepared<'static>> {
        let Prepared::Quantized { acts, .. } = self else {
            return Err(crate::error::EngineError::BadConfig(
                "only quantized batches can be selected from".into(),
            ));
        };
        let picked = picks
            .iter()
            .map(|&t| {
                acts.get(t).cloned().ok_or_else(|| {
                    crate::error::EngineError::BadConfig(format!(
                        "token {t} of a batch of {}",
                        acts.len()
                    ))
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let format = picked.first().map_or(GgmlType::F32, |a| a.ty());
        let tiles = if wants_tiles(picked.len(), format) {
            picked
                .chunks(TILE_TOKENS)
                .map(ActTile::new)
                .collect::<std::result::Result<_, _>>()?
        } else {
            Vec::new()
        };
        Ok(Prepared::Quantized {
            acts: picked,
            tiles,
        })
    }

    pub fn tokens(&self) -> usize {
        match self {
            Prepared::F32 { x, cols } => x.len() / cols.max(&1),
            Prepared::Quantized { acts, .. } => acts.len(),
        }
    }
}

/// Whether a batch of `tokens` activations in `format` is interleaved for the tile kernels.
fn wants_tiles(tokens: usize, format: GgmlType) -> bool {
    tokens >= TILE_MIN_TOKENS && format == GgmlType::Q8K && tiles_available()
}

/// Per-thread scratch for decoding weight rows.
#[derive(Default)]
struct RowScratch {
    f32_row: Vec<f32>,
    /// One decoded row per row of a piece (grid types, several tokens).
    decoded: Vec<DecodedRow>,
}

/// Rows `first..first + n` of `w` against every prepared token, serially, into `by_row`
/// (`[n][tokens]`, weight-row major).
fn rows_serial(
    mm: &MatmulCtx,
    w: &Matrix,
    first: usize,
    n: usize,
    prep: &Prepared<'_>,
    by_row: &mut [f32],
    scratch: &mut RowScratch,
) -> Result<()> {
    let bytes = mm.gguf.data(w.loc);
    let tokens = prep.tokens();
    let rows = &bytes[first * w.row_bytes..(first + n) * w.row_bytes];
    let (acts, tiles) = match prep {
        Prepared::F32 { x, cols } => {
            for (row, row_out) in rows
                .chunks_exact(w.row_bytes)
                .zip(by_row.chunks_mut(tokens))
            {
                if w.ty == GgmlType::F32 {
                    // Read in place: no copy of the row (the router's 4 MiB per layer).
                    for (t, o) in row_out.iter_mut().enumerate() {
                        *o = dot_le_bytes(row, &x[t * cols..(t + 1) * cols]);
                    }
                    continue;
                }
                let decoded = &mut scratch.f32_row;
                decoded.resize(*cols, 0.0);
                dequantize_row(w.ty, row, decoded)?;
                for (t, o) in row_out.iter_mut().enumerate() {
                    *o = dot(decoded, &x[t * cols..(t + 1) * cols]);
                }
            }
            return Ok(());
        }
        Prepared::Quantized { acts, tiles } => (acts, tiles),
    };
    let tiles: &[ActTile] = if tileable(w.ty) { tiles } else { &[] };
    if let [act] = &acts[..] {
        matvec(w.ty, rows, n, act, &mut by_row[..n])?;
        return Ok(());
    }
    // Grid rows (and rows for the tile kernels) are decoded once per batch and reused by
    // every token.
    let decoded = (decodable(w.ty) && decoded_dots_available()) || !tiles.is_empty();
    if decoded {
        if scratch.decoded.len() < n {
            scratch.decoded.resize_with(n, DecodedRow::default);
        }
        let ahead = bytes.get((first + n) * w.row_bytes..).unwrap_or_default();
        for (k, (row, d)) in rows
            .chunks_exact(w.row_bytes)
            .zip(&mut scratch.decoded)
            .enumerate()
        {
            // Two rows ahead, the next piece's first rows at the end.
            let next = rows
                .get((k + 2) * w.row_bytes..(k + 3) * w.row_bytes)
                .or_else(|| {
                    let j = k + 2 - n;
                    ahead.get(j * w.row_bytes..(j + 1) * w.row_bytes)
                });
            prefetch(next.unwrap_or_default());
            decode_row(w.ty, row, d)?;
        }
    }
    if decoded && !tiles.is_empty() {
        // Activation tiles outermost: the piece's decoded rows stay in cache while each
        // tile of 16 tokens passes them once.
        for (i, tile) in tiles.iter().enumerate() {
            let out = &mut by_row[i * TILE_TOKENS..];
            dot_decoded_tile(&scratch.decoded[..n], tile, out, tokens)?;
        }
        return Ok(());
    }
    // Token tiles outermost: the piece's rows stay in cache while a tile of activations
    // streams past them once.
    for t0 in (0..tokens).step_by(TOKEN_TILE) {
        let t1 = (t0 + TOKEN_TILE).min(tokens);
        for (k, row) in rows.chunks_exact(w.row_bytes).enumerate() {
            let row_out = &mut by_row[k * tokens + t0..k * tokens + t1];
            if decoded {
                dot_decoded_many(&scratch.decoded[k], &acts[t0..t1], row_out)?;
            } else {
                vec_dot_many(w.ty, row, &acts[t0..t1], row_out)?;
            }
        }
    }
    Ok(())
}

/// One product of a batch of products: rows `first..first + n` of `w` against `prep`,
/// written to `out` as `[n][tokens]`.
pub struct RowJob<'a> {
    pub w: &'a Matrix,
    pub first: usize,
    pub n: usize,
    pub prep: &'a Prepared<'a>,
    pub out: &'a mut [f32],
}

/// Runs many products in one parallel region, split into pieces of at least `ROWS_PER_TASK`
/// rows (fewer regions and better balance than one region per product).
pub fn run_jobs(mm: &MatmulCtx, jobs: Vec<RowJob<'_>>) -> Result<()> {
    let threads = rayon::current_num_threads().max(1);
    let total_rows: usize = jobs.iter().map(|j| j.n).sum();
    let batched = jobs.iter().any(|j| j.prep.tokens() > 1);
    let mut piece_rows = (total_rows / (threads * 8)).max(ROWS_PER_TASK);
    if batched {
        // A piece's rows (decoded, for grid types) stay in cache across the token tiles.
        piece_rows = piece_rows.min(MAX_BATCHED_PIECE_ROWS);
    }
    let mut pieces = Vec::new();
    for job in jobs {
        let tokens = job.prep.tokens();
        for (i, out) in job.out.chunks_mut(piece_rows * tokens).enumerate() {
            let first = job.first + i * piece_rows;
            let n = out.len() / tokens.max(1);
            pieces.push(Mutex::new((job.w, first, n, job.prep, out)));
        }
    }
    pool::for_each(pieces.len(), &|i| {
        // Each piece is claimed by one task: the lock is never contended.
        let mut piece = pieces[i].lock().unwrap_or_else(|p| p.into_inner());
        let (w, first, n, prep, ref mut out) = *piece;
        SCRATCH.with_borrow_mut(|scratch| rows_serial(mm, w, first, n, prep, out, scratch))
    })
}

thread_local! {
    /// Each thread's row-decoding buffers, kept between regions.
    static SCRATCH: RefCell<RowScratch> = RefCell::new(RowScratch::default());
}

/// Scatters `[rows][tokens]` into token-major `[tokens][rows]`, a block of tokens per task.
pub fn transpose_into(by_row: &[f32], rows: usize, tokens: usize, out: &mut [f32]) {
    if tokens == 1 {
        out[..rows].copy_from_slice(&by_row[..rows]);
        return;
    }
    let blocks: Vec<Mutex<&mut [f32]>> = out
        .chunks_mut(rows * TOKENS_PER_TASK)
        .map(Mutex::new)
        .collect();
    let ran = pool::for_each(blocks.len(), &|i| {
        let mut block = blocks[i].lock().unwrap_or_else(|p| p.into_inner());
        let t0 = i * TOKENS_PER_TASK;
        for (dt, row) in block.chunks_mut(rows).enumerate() {
            for (r, o) in row.iter_mut().enumerate() {
                *o = by_row[r * tokens + t0 + dt];
            }
        }
        Ok(())
    });
    debug_assert!(ran.is_ok(), "transpose tasks return no errors");
}

/// `out[t * n_rows + r] = W[first_row + r] · x[t]` for `t < tokens`, where `x` holds `tokens`
/// rows of `w.cols` values. `first_row`/`n_rows` select a slab (one expert of a stack).
pub fn matmul_rows(
    mm: &MatmulCtx,
    w: &Matrix,
    first_row: usize,
    n_rows: usize,
    x: &[f32],
    tokens: usize,
    out: &mut [f32],
) -> Result<()> {
    debug_assert_eq!(out.len(), tokens * n_rows);
    let product = Product {
        w,
        first: first_row,
        input: 0,
        out,
    };
    matmul_same_input(mm, x, tokens, &mut [product])
}

/// The whole matrix.
pub fn matmul(mm: &MatmulCtx, w: &Matrix, x: &[f32], tokens: usize, out: &mut [f32]) -> Result<()> {
    matmul_rows(mm, w, 0, w.rows, x, tokens, out)
}

/// Several products of the same input (whole matrices or slabs of rows, each `out`
/// `[tokens][rows]`), in one parallel region, the input quantized once per activation
/// format (e.g. the DeltaNet's qkv, gate and ba projections all dot Q8_K). Each result is
/// what [`matmul_rows`] gives for it alone.
pub fn matmul_same_input(
    mm: &MatmulCtx,
    x: &[f32],
    tokens: usize,
    products: &mut [Product<'_>],
) -> Result<()> {
    if tokens == 1 && one_token::applies(mm, products.len()) {
        return one_token::run(mm, &[x], products);
    }
    // Product `p` covers rows `p.first..p.first + n` with `n = p.out.len() / tokens`.
    let rows = |p: &Product<'_>| p.out.len() / tokens.max(1);
    for p in products.iter() {
        if p.input != 0 || p.out.len() != tokens * rows(p) || p.first + rows(p) > p.w.rows {
            return Err(crate::error::EngineError::BadConfig(format!(
                "a batched product of input {} into rows {}.. ({} values for {tokens} tokens) of a {}-row matrix",
                p.input,
                p.first,
                p.out.len(),
                p.w.rows
            )));
        }
    }
    let mut formats: Vec<GgmlType> = Vec::new();
    let mut preps: Vec<Prepared<'_>> = Vec::new();
    for p in products.iter() {
        debug_assert_eq!(x.len(), tokens * p.w.cols);
        let format = vec_dot_type(p.w.ty);
        if !formats.contains(&format) {
            formats.push(format);
            preps.push(Prepared::new(mm, p.w.ty, x, p.w.cols)?);
        }
    }
    let mut by_rows: Vec<Scratch> = products
        .iter()
        .map(|p| Scratch::zeroed(p.out.len()))
        .collect();
    let mut jobs = Vec::with_capacity(products.len());
    for (p, by_row) in products.iter().zip(&mut by_rows) {
        let format = vec_dot_type(p.w.ty);
        let Some(prep) = formats
            .iter()
            .position(|f| *f == format)
            .and_then(|i| preps.get(i))
        else {
            continue;
        };
        jobs.push(RowJob {
            w: p.w,
            first: p.first,
            n: rows(p),
            prep,
            out: by_row,
        });
    }
    run_jobs(mm, jobs)?;
    for (p, by_row) in products.iter_mut().zip(&by_rows) {
        let n = rows(p);
        transpose_into(by_row, n, tokens, p.out);
    }
    Ok(())
}
