//! The `herald-bench` command: see the library's documentation and the README's
//! *Benchmarks* section.

use anyhow::Context;
use clap::Parser;

#[derive(Parser)]
#[command(name = "herald-bench", version, about = "Measure Herald, or any Svix-compatible server, end to end")]
struct Cli {
    #[command(flatten)]
    args: herald_bench::BenchArgs,
}

fn main() -> anyhow::Result<()> {
    let args = Cli::parse().args;
    let runtime = tokio::runtime::Runtime::new().context("starting the runtime")?;
    runtime.block_on(herald_bench::run(args))
}
