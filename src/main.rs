//! `clrscope`: command-line wiring only; the work lives in the crates.

use clap::Parser;

#[derive(Debug, Parser)]
#[command(
    name = "clrscope",
    version,
    about = "Continuous profiler and incident capture for .NET on Linux"
)]
struct Cli {}

fn main() -> anyhow::Result<()> {
    let _cli = Cli::parse();
    Ok(())
}
