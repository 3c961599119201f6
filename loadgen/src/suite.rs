//! placeholder
use anyhow::Result;
#[derive(clap::Args, Debug, Clone)]
pub struct SuiteArgs {}
pub fn run(_a: &SuiteArgs) -> Result<()> {
    Ok(())
}
