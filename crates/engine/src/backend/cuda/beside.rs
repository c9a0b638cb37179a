//! A mixer's input products that need nothing of each other (DeltaNet: qkv, then z and β/α;
//! attention: q, then k and v) run side by side: the first on the main stream, the others
//! on the device's branch stream, joined before the kernel that reads them. In a decode
//! step each used to wait for the one before it although all read the same normed row, so
//! every layer paid two kernel boundaries for nothing. The kernels are the same ones, so
//! the results are the same bits. Batches of decode size only (prompts' products fill the
//! GPU on their own, and cuBLAS runs on the main stream); `REDLITE_PARALLEL_PRODUCTS=0`
//! queues them one after the other as before; the second and third products get a lane
//! each ([`products3`]; `REDLITE_PARALLEL_PRODUCTS=2`: one lane for both).

use std::sync::OnceLock;

use redlite_cuda::{Device, ONE_TOKEN_KERNELS_MAX_TOKENS};

use crate::error::Result;

/// Queues `first` and `others` for `tokens` rows, beside each other where that applies, in
/// this order otherwise; either way both are done before what the main stream queues next.
fn products(
    device: &Device,
    tokens: usize,
    first: impl FnOnce() -> Result<()>,
    others: impl FnOnce() -> Result<()>,
) -> Result<()> {
    if tokens > ONE_TOKEN_KERNELS_MAX_TOKENS || !enabled() {
        first()?;
        return others();
    }
    device.on_branch(others)?;
    first()?;
    Ok(device.join_branch()?)
}

/// [`products`] of three: `third` runs on a lane of its own beside `second` (DeltaNet: z
/// beside β/α; attention: k beside v); with `REDLITE_PARALLEL_PRODUCTS=2` after it on the one
/// branch, as before. The same kernels either way, so the same bits. H100, tg128 in three
/// interleaved rounds: +2.7 % at depth 0, +2.0 % at 4096 (the branch's two launches in a row
/// were the longer path beside the first product).
pub fn products3(
    device: &Device,
    tokens: usize,
    first: impl FnOnce() -> Result<()>,
    second: impl FnOnce() -> Result<()>,
    third: impl FnOnce() -> Result<()>,
) -> Result<()> {
    if tokens > ONE_TOKEN_KERNELS_MAX_TOKENS || lanes() < 3 {
        return products(device, tokens, first, || {
            second()?;
            third()
        });
    }
    device.on_branch(second)?;
    device.on_second_branch(third)?;
    first()?;
    Ok(device.join_branch()?)
}

fn enabled() -> bool {
    lanes() > 1
}

/// `REDLITE_PARALLEL_PRODUCTS`: 0 one lane, 2 two, otherwise three.
fn lanes() -> u8 {
    static LANES: OnceLock<u8> = OnceLock::new();
    *LANES.get_or_init(
        || match std::env::var("REDLITE_PARALLEL_PRODUCTS").as_deref() {
            Ok("0") => 1,
            Ok("2") => 2,
            _ => 3,
        },
    )
}
