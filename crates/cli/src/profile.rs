//! `--profile` on `generate` and `bench`: where the GPU's time goes, per model component
//! (routed experts, DeltaNet projections, attention, LM head, ...), from CUDA events the
//! backend records where each component's launches begin. Printed after each phase.

use anyhow::Result;

/// Turns the component marks on before the model is loaded (the decode graph stays off, so
/// each step's launches are marked). CUDA only: the CPU backend has no stream to mark.
pub fn enable(on: bool, device: &str) -> Result<()> {
    if !on {
        return Ok(());
    }
    if device != "cuda" {
        anyhow::bail!("--profile times the GPU's components: it needs --device cuda");
    }
    #[cfg(feature = "cuda")]
    {
        redlite_cuda::enable_components();
        Ok(())
    }
    #[cfg(not(feature = "cuda"))]
    anyhow::bail!("--profile needs a build with the CUDA backend (--features cuda)")
}

/// Drops what was marked so far (loading, a warm-up the caller does not want counted).
pub fn discard(on: bool) -> Result<()> {
    if on {
        take()?;
    }
    Ok(())
}

/// Prints the time per component since the last call: `runs` runs of `tokens` tokens each.
pub fn print(on: bool, phase: &str, runs: usize, tokens: usize) -> Result<()> {
    if !on {
        return Ok(());
    }
    let table = take()?;
    let total: f64 = table.iter().map(|c| c.1).sum();
    let runs = runs.max(1);
    eprintln!(
        "profile {phase}: GPU stream time per run, by component ({runs} run(s) of {tokens} token(s); mean)"
    );
    for (component, ms, spans) in &table {
        eprintln!(
            "  {component:<34} {:>10.3} ms {:>5.1} % {:>7} spans {:>9.1} us/token",
            ms / runs as f64,
            100.0 * ms / total.max(1e-12),
            spans / runs as u64,
            1e3 * ms / (runs * tokens.max(1)) as f64
        );
    }
    eprintln!("  {:<34} {:>10.3} ms", "total", total / runs as f64);
    Ok(())
}

/// (component, milliseconds, spans), largest first.
#[cfg(feature = "cuda")]
fn take() -> Result<Vec<(&'static str, f64, u64)>> {
    let table = redlite_cuda::take_components()?;
    Ok(table
        .into_iter()
        .map(|c| (c.component, c.milliseconds, c.spans))
        .collect())
}

#[cfg(not(feature = "cuda"))]
fn take() -> Result<Vec<(&'static str, f64, u64)>> {
    Ok(Vec::new())
}
