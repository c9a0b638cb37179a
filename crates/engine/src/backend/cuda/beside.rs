//! A mixer's input products that need nothing of each other (DeltaNet: qkv, then z and β/α;
//! attention: q, then k and v) run side by side: the first on the main stream, the others
//! on the device's branch stream, joined before the kernel that reads them. In a decode
//! step each used to wait for the one before it although all read the same normed row, so
//! every layer paid two kernel boundaries for nothing. The kernels are the same ones, so
//! the results are the same bits. Batches of decode size only (prompts' products fill the
//! GPU on their own, and cuBLAS runs on the main stream); `REDLITE_PARALLEL_PRODUCTS=0`
//! queues them one after the other as before.

use std::sync::OnceLock;

use redlite_cuda::{Device, ONE_TOKEN_KERNELS_MAX_TOKENS};

use crate::error::Result;

/// Queues `first` and `others` for `tokens` rows, beside each other where that applies, in
/// this order otherwise; either way both are done before what the main stream queues next.
pub fn products(
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

fn enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("REDLITE_PARALLEL_PRODUCTS").as_deref() != Ok("0"))
}
