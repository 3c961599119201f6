//! `tarq-chaos`: runs a fault schedule against a tarq cluster in network namespaces, or checks
//! a recorded history.

fn main() -> anyhow::Result<()> {
    anyhow::bail!("tarq-chaos: not built yet")
}
