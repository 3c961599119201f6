//! `tarq-loadgen`: measures put → take → ack end to end against tarq and its peers
//! (Tarantool running the reference queue, beanstalkd, Redis). Without a subcommand it runs
//! once as the flags say; `suite` runs the comparison matrix and writes `results/`.

use anyhow::Result;
use clap::{Parser, Subcommand};
use tarq_loadgen::{single, suite};

#[derive(Parser, Debug)]
#[command(
    name = "tarq-loadgen",
    version,
    about = "End-to-end load generator for tarq and its peers",
    args_conflicts_with_subcommands = true
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    run: single::RunArgs,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the comparison matrix and regenerate its section of results/README.md.
    Suite(suite::SuiteArgs),
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Some(Command::Suite(args)) => suite::run(&args),
        None => {
            let finished = single::run(&cli.run)?;
            print!("{}", finished.summary.table());
            Ok(())
        }
    }
}
